package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeConn is a connection from a given remote address that records its closing.
type fakeConn struct {
	net.Conn // nil: only the methods below are called
	remote   *net.TCPAddr
	closed   atomic.Bool
}

func (c *fakeConn) RemoteAddr() net.Addr { return c.remote }
func (c *fakeConn) Close() error         { c.closed.Store(true); return nil }

func connFrom(addr string) *fakeConn {
	return &fakeConn{remote: net.TCPAddrFromAddrPort(netip.MustParseAddrPort(addr))}
}

func TestConnBoundsPerClient(t *testing.T) {
	trusted, _ := parseTrustedProxies([]string{"10.0.0.1"})
	b, err := newConnBounds(2, 100, trusted, nil)
	if err != nil {
		t.Fatal(err)
	}
	admit := func(addr string) *boundConn {
		bc, evicted, refused := b.admit(connFrom(addr))
		if evicted != nil {
			t.Fatalf("%s: evicted a connection below the global bound", addr)
		}
		if (bc == nil) != (refused != "") {
			t.Fatalf("%s: admitted %v and refused %q", addr, bc != nil, refused)
		}
		return bc
	}
	first := admit("192.0.2.1:1000")
	if admit("192.0.2.1:1001") == nil {
		t.Fatal("second connection of a client refused, want admitted (bound 2)")
	}
	if admit("192.0.2.1:1002") != nil {
		t.Fatal("third connection of a client admitted, want refused (bound 2)")
	}
	if admit("192.0.2.2:1000") == nil {
		t.Fatal("another client's connection refused")
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	_ = first.Close() // a second close gives back nothing more
	if admit("192.0.2.1:1003") == nil {
		t.Fatal("after a close, the client's connection refused")
	}
	if admit("192.0.2.1:1004") != nil {
		t.Fatal("a double close gave back two places")
	}
	// IPv6 clients count by /64; a trusted proxy is not bounded per address.
	admit("[2001:db8:1:2::1]:1")
	admit("[2001:db8:1:2::2]:1")
	if admit("[2001:db8:1:2:ffff::3]:1") != nil {
		t.Fatal("a third address of the same IPv6 /64 admitted, want it counted with the others")
	}
	if admit("[2001:db8:1:3::1]:1") == nil {
		t.Fatal("another /64 refused")
	}
	for i := range 5 {
		if admit(fmt.Sprintf("10.0.0.1:%d", 2000+i)) == nil {
			t.Fatalf("trusted proxy's connection %d refused, want it not bounded per address", i)
		}
	}
}

func TestConnBoundsGlobalTakesFromTheHeaviest(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := newConnBounds(0, 6, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if bc, _, _ := b.admit(connFrom(fmt.Sprintf("198.51.100.1:%d", i))); bc == nil {
			t.Fatalf("flood connection %d refused below the bound", i)
		}
	}
	if bc, _, _ := b.admit(connFrom("198.51.100.2:1")); bc == nil {
		t.Fatal("last place refused")
	}
	// Full: a client with one connection takes a place from the client holding five.
	bc, evicted, _ := b.admit(connFrom("203.0.113.7:1"))
	if bc == nil || evicted == nil || evicted.client.addr.String() != "198.51.100.1" {
		t.Fatalf("newcomer at the bound: admitted %v, evicted %v; want admitted in place of a flood connection", bc != nil, evicted)
	}
	// The flood's own new connection would leave it as heavy as before: refused.
	if bc, evicted, refused := b.admit(connFrom("198.51.100.1:99")); bc != nil || evicted != nil || refused != refusedGlobal {
		t.Fatalf("the heaviest client at the bound: admitted %v, evicted %v, refused %q; want refused (global)", bc != nil, evicted != nil, refused)
	}
	if got := b.open; got != 6 {
		t.Fatalf("open: got %d, want 6", got)
	}
	if got := testutil.ToFloat64(b.refusedGlobal); got != 0 {
		t.Fatalf("admit counts nothing itself (the listener does): got %v", got)
	}
}

// The heaviest count kept in O(1) matches a scan over every client, through random opens,
// closes and evictions.
func TestConnBoundsHeaviestMatchesAScan(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	b, err := newConnBounds(7, 40, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var open []*boundConn
	for step := range 5000 {
		if len(open) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(open))
			_ = open[i].Close()
			open = append(open[:i], open[i+1:]...)
		} else {
			bc, evicted, _ := b.admit(connFrom(fmt.Sprintf("192.0.2.%d:%d", rng.IntN(12), step)))
			if evicted != nil {
				for i, c := range open {
					if c == evicted {
						open = append(open[:i], open[i+1:]...)
						break
					}
				}
			}
			if bc != nil {
				open = append(open, bc)
			}
		}
		want := 0
		for _, cl := range b.clients {
			want = max(want, len(cl.conns))
			if len(cl.conns) > 7 {
				t.Fatalf("step %d: a client holds %d, over its bound of 7", step, len(cl.conns))
			}
		}
		if b.heaviest != want || b.open != len(open) || b.open > 40 {
			t.Fatalf("step %d: heaviest %d (scan %d), open %d (held %d)", step, b.heaviest, want, b.open, len(open))
		}
	}
}

func TestConnectionsForFDs(t *testing.T) {
	for _, tt := range []struct {
		limit uint64
		want  int
	}{
		{0, (65536 - fdReserve) / 2},
		{1024, (1024 - fdReserve) / 2},
		{20000, (20000 - fdReserve) / 2},
		{300, 75},
		{2, 1},
		{1 << 20, maxDefaultConnections},
		{1 << 40, maxDefaultConnections},
		{2*maxDefaultConnections + fdReserve, maxDefaultConnections},
	} {
		if got := connectionsForFDs(tt.limit); got != tt.want {
			t.Errorf("limit %d: got %d, want %d", tt.limit, got, tt.want)
		}
	}
}

// Slowloris and slow-body clients beyond the per-client bound from one address do not stop
// another client's requests (issue 10, item 4): the flood's extra connections are refused as soon
// as they are accepted (answered and closed, or closed at once past refuseAnswers), the rest
// wait on a read timeout far longer than the test.
func TestSlowClientsFromOneAddressDoNotStopOthers(t *testing.T) {
	g := startGateway(t, nil, nil)
	reg := prometheus.NewRegistry()
	b, err := newConnBounds(8, 1000, nil, reg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: g.srv, ReadHeaderTimeout: time.Hour, ReadTimeout: time.Hour}
	go func() { _ = srv.Serve(&boundedListener{Listener: ln, bounds: b}) }()
	t.Cleanup(func() { _ = srv.Close() })

	const flood = 40 // 20 slowloris, 20 slow bodies
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	closed := make(chan string, flood) // what each ended connection read
	for i := range flood {
		c, err := dialer.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if i%2 == 0 {
			fmt.Fprint(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
		} else {
			fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
		}
		go func() {
			read, _ := io.ReadAll(c) // to the server's close
			closed <- string(read)
		}()
	}
	answered := 0
	for range flood - 8 {
		select {
		case read := <-closed:
			if strings.HasPrefix(read, "HTTP/1.1 429 ") {
				answered++
			} else if read != "" {
				t.Errorf("a refused connection read %q, want a 429 or nothing", read)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("30s on, the flood's connections beyond the bound are still open")
		}
	}
	if answered == 0 {
		t.Error("no refused connection was answered 429")
	}
	if refused := testutil.ToFloat64(b.refusedPerClient); refused != flood-8 {
		t.Fatalf("usher_connections_refused_total{reason=per_client}: got %v, want %d", refused, flood-8)
	}

	client := &http.Client{Timeout: 30 * time.Second}
	for i := range 5 {
		req, _ := http.NewRequest("GET", "http://"+ln.Addr().String()+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("another client's request %d beside the flood: %v", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("another client's request %d: got %d, want 200", i, resp.StatusCode)
		}
	}
	want := `# HELP usher_connections_open Client connections open (bounded by server.max_connections).
# TYPE usher_connections_open gauge
usher_connections_open 9
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "usher_connections_open"); err != nil {
		t.Errorf("open connections, want the flood's 8 and the client's keep-alive one: %v", err)
	}
}

// A client over a connection bound gets an HTTP answer in OpenAI's shape saying which bound
// refused it, not a reset: 429 from the per-client bound, 503 from the global one; either way the
// connection closes and the HTTP server never sees it. An HTTP client reads the answer although
// it was written before its request was read.
func TestRefusedConnectionIsAnswered(t *testing.T) {
	for _, tt := range []struct {
		name      string
		perClient int
		global    int
		status    int
		typ       string
	}{
		{"per client", 1, 100, http.StatusTooManyRequests, "rate_limit_error"},
		{"global", 0, 1, http.StatusServiceUnavailable, "server_error"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b, err := newConnBounds(tt.perClient, tt.global, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var served atomic.Int32
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				served.Add(1)
				_, _ = io.WriteString(w, "ok")
			})}
			go func() { _ = srv.Serve(&boundedListener{Listener: ln, bounds: b}) }()
			t.Cleanup(func() { _ = srv.Close() })

			url := "http://" + ln.Addr().String() + "/v1/chat/completions"
			held, err := net.Dial("tcp", ln.Addr().String()) // takes the one place
			if err != nil {
				t.Fatal(err)
			}
			defer held.Close()
			fmt.Fprint(held, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
			if line, err := bufio.NewReader(held).ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 200") {
				t.Fatalf("the admitted connection: %q, %v", line, err)
			}

			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := client.Post(url, "application/json", strings.NewReader(`{"model":"m","messages":[]}`))
			if err != nil {
				t.Fatalf("the refused client got %v, want an HTTP answer", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || resp.Header.Get("Retry-After") != "1" {
				t.Fatalf("status %d, Retry-After %q; want %d, \"1\"", resp.StatusCode, resp.Header.Get("Retry-After"), tt.status)
			}
			var e errorBody
			if err := json.Unmarshal(body, &e); err != nil || e.Error.Type != tt.typ || e.Error.Code != "too_many_connections" || e.Error.Message == "" {
				t.Fatalf("body %s (%v), want OpenAI's error shape with type %s, code too_many_connections", body, err, tt.typ)
			}
			if served.Load() != 1 {
				t.Fatalf("the HTTP server served %d requests, want only the admitted one", served.Load())
			}
		})
	}
}

// Past refuseAnswers refused connections being answered, more are closed at once: a flood of
// refused connections that never read holds at most refuseAnswers goroutines and descriptors
// (each for at most refuseWait; here longer, so that the count does not hang on timing).
func TestRefusalsBeingAnsweredAreBounded(t *testing.T) {
	b, err := newConnBounds(1, 1000, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	b.answerWait = time.Minute
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bl := &boundedListener{Listener: ln, bounds: b}
	go func() {
		for {
			c, err := bl.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })

	const extra = refuseAnswers + 20
	var conns []*net.TCPConn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range extra + 1 { // the first is admitted
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprint(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
		conns = append(conns, c.(*net.TCPConn))
	}
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(b.refusedPerClient) < extra && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// Each client ends its side and reads to the server's close: an answered one the 429, the
	// others nothing or a reset.
	answered := 0
	for i, c := range conns[1:] {
		_ = c.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		read, err := io.ReadAll(c)
		if err != nil && !isReset(err) {
			t.Fatalf("refused connection %d: %v after %q, want the server's close", i, err, read)
		}
		if strings.HasPrefix(string(read), "HTTP/1.1 429 ") {
			answered++
		}
	}
	if answered != refuseAnswers {
		t.Fatalf("%d of %d refused connections answered, want %d (the bound)", answered, extra, refuseAnswers)
	}
	for time.Now().Before(deadline) && len(b.answering) > 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if n := len(b.answering); n != 0 {
		t.Fatalf("%d refusals still being answered after their clients closed", n)
	}
}

// isReset reports whether err is a connection reset (a refused connection closed unanswered).
func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}

// awaitHeaders finds the end of a request's headers however the client's writes split it, and
// gives up on a connection that ends first or sends the limit without one.
func TestAwaitHeadersAcrossReads(t *testing.T) {
	for _, tt := range []struct {
		name   string
		writes []string
		limit  int
		want   bool
	}{
		{"one write", []string{"GET / HTTP/1.1\r\nHost: x\r\n\r\n"}, 1 << 10, true},
		{"a byte a write", strings.Split("GET / HTTP/1.1\r\nHost: x\r\n\r\n", ""), 1 << 10, true},
		{"split in the blank line", []string{"GET / HTTP/1.1\r\nHost: x\r", "\n\r", "\n"}, 1 << 10, true},
		{"the connection ends first", []string{"GET / HTTP/1.1\r\nHost: x\r\n"}, 1 << 10, false},
		{"past the limit", []string{"GET / HTTP/1.1\r\nX-Slow: " + strings.Repeat("a", 100), "\r\n\r\n"}, 64, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			server, client := net.Pipe()
			defer server.Close()
			go func() {
				for _, w := range tt.writes {
					if _, err := io.WriteString(client, w); err != nil {
						return
					}
				}
				client.Close()
			}()
			if got := awaitHeaders(server, tt.limit); got != tt.want {
				t.Fatalf("awaitHeaders: %v, want %v", got, tt.want)
			}
		})
	}
}
