// Command slowbench is the load of issue 10's slow-body attack, for test/slowbench/run.sh: it
// holds many connections that trickle a request body (one byte per interval, reconnecting when
// the gateway closes them) from a range of loopback source addresses, and, in another process,
// runs real requests in a closed loop and reports their latency percentiles.
//
//	slowbench -target 127.0.0.1:8080 -slow 10000 -sources 127.0.0.2-51 -key sk-...  # the flood
//	slowbench -target 127.0.0.1:8080 -real 8 -duration 30s -key sk-...     # the real requests
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

func main() {
	target := flag.String("target", "127.0.0.1:8080", "the gateway's `host:port`")
	slow := flag.Int("slow", 0, "slow-body connections to hold")
	sources := flag.String("sources", "127.0.0.2-101", "source addresses of the slow connections: `A.B.C.D-E`, the last octet's range")
	interval := flag.Duration("interval", time.Second, "time between two body bytes of a slow connection")
	ramp := flag.Duration("ramp", 20*time.Second, "time over which the slow connections are first opened")
	inFlight := flag.Int("real", 0, "real requests in flight at once (closed loop)")
	duration := flag.Duration("duration", 30*time.Second, "how long real requests run")
	key := flag.String("key", "", "API key of the real requests, and of the slow ones: a hostile tenant's body is read (a request without a valid key is answered 401 before its body)")
	model := flag.String("model", "demo-7b", "model of the real requests")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch {
	case *slow > 0:
		addrs, err := sourceRange(*sources)
		if err != nil {
			fmt.Fprintln(os.Stderr, "slowbench:", err)
			os.Exit(2)
		}
		flood(ctx, *target, *slow, addrs, *interval, *ramp, *key)
	case *inFlight > 0:
		if !measure(ctx, *target, *inFlight, *duration, *key, *model) {
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "slowbench: give -slow N or -real N")
		os.Exit(2)
	}
}

// sourceRange reads "127.0.0.2-101" as the addresses 127.0.0.2 to 127.0.0.101.
func sourceRange(s string) ([]net.IP, error) {
	first, last, ok := strings.Cut(s, "-")
	ip := net.ParseIP(first).To4()
	hi, err := strconv.Atoi(last)
	if !ok || ip == nil || err != nil || hi < int(ip[3]) || hi > 254 {
		return nil, fmt.Errorf("-sources %q: want A.B.C.D-E with D <= E <= 254", s)
	}
	var out []net.IP
	for o := int(ip[3]); o <= hi; o++ {
		out = append(out, net.IPv4(ip[0], ip[1], ip[2], byte(o)))
	}
	return out, nil
}

// flood holds n slow-body connections until ctx ends, printing every 5s how many are open.
func flood(ctx context.Context, target string, n int, addrs []net.IP, interval, ramp time.Duration, key string) {
	var open, connects, closedByPeer atomic.Int64
	head := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: " + target + "\r\nAuthorization: Bearer " + key +
		"\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
	var wg sync.WaitGroup
	for i := range n {
		src := addrs[i%len(addrs)]
		wg.Go(func() {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: src}, Timeout: 10 * time.Second}
			wait := time.Duration(rand.Int64N(int64(ramp) + 1))
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(wait):
				}
				wait = interval + time.Duration(rand.Int64N(int64(interval)))
				c, err := d.DialContext(ctx, "tcp", target)
				if err != nil {
					continue
				}
				connects.Add(1)
				open.Add(1)
				trickle(ctx, c, head, interval)
				open.Add(-1)
				closedByPeer.Add(1)
				c.Close()
			}
		})
	}
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
			fmt.Fprintf(os.Stderr, "slow connections: %d open, %d connects, %d closed by the gateway\n",
				open.Load(), connects.Load(), closedByPeer.Load())
		}
	}
}

// trickle sends head and then one body byte per interval until the connection fails or ctx
// ends.
func trickle(ctx context.Context, c net.Conn, head []byte, interval time.Duration) {
	if _, err := c.Write(head); err != nil {
		return
	}
	// A closed connection shows at the next write, or at once through a read.
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, c)
		close(gone)
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-gone:
			return
		case <-t.C:
			if _, err := c.Write([]byte(" ")); err != nil {
				return
			}
		}
	}
}

// measure runs real requests, conc at a time, for d and prints their latency percentiles; false
// when any failed.
func measure(ctx context.Context, target string, conc int, d time.Duration, key, model string) bool {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: conc, DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)}}).DialContext}}
	body := []byte(`{"model":"` + model + `","max_tokens":8,"messages":[{"role":"user","content":"a real request beside the flood"}]}`)
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var mu sync.Mutex // guards lat and failures
	var lat []time.Duration
	failures := map[string]int{}
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequest("POST", "http://"+target+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer "+key)
				start := time.Now()
				resp, err := client.Do(req)
				outcome := ""
				if err != nil {
					outcome = err.Error()
				} else {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						outcome = resp.Status
					}
				}
				took := time.Since(start)
				mu.Lock()
				if outcome == "" {
					lat = append(lat, took)
				} else if ctx.Err() == nil {
					failures[outcome]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	q := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(100 * time.Microsecond)
	}
	fmt.Printf("real requests: %d ok, p50 %v, p90 %v, p99 %v, max %v\n", len(lat), q(0.5), q(0.9), q(0.99), q(1))
	failed := 0
	for what, n := range failures {
		fmt.Printf("  failed %d: %s\n", n, what)
		failed += n
	}
	return failed == 0
}
