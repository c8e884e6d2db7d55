package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// cannedWorker is a worker over real loopback TCP that answers every request with the same
// bytes, read and written without net/http, so that it allocates nothing per request: a
// benchmark's allocations are then the gateway's own (its handler and its transport to the
// worker). GETs (health checks, scrapes) get an empty 200.
type cannedWorker struct {
	ln           net.Listener
	whole, chunk []byte // the raw HTTP answers to a whole-answer request and to a stream
}

func newCannedWorker(tb testing.TB, chunks int) *cannedWorker {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	usage := fmt.Sprintf(`{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d}`, chunks, 5+chunks)
	whole := `{"id":"x","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}],"usage":` + usage + `}`
	var sse strings.Builder
	for i := range chunks {
		fmt.Fprintf(&sse, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"},\"finish_reason\":null}]}\n\n", i)
	}
	fmt.Fprintf(&sse, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
	answer := func(ct, body string) []byte {
		return []byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s", ct, len(body), body))
	}
	w := &cannedWorker{ln: ln, whole: answer("application/json", whole), chunk: answer("text/event-stream", sse.String())}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go w.serve(conn)
		}
	}()
	tb.Cleanup(func() { ln.Close() })
	return w
}

var (
	contentLength = []byte("content-length:")
	streamTrue    = []byte(`"stream":true`)
)

func (w *cannedWorker) serve(conn net.Conn) {
	defer conn.Close()
	r := bufio.NewReaderSize(conn, 64<<10)
	for {
		n, get := 0, false
		for first := true; ; first = false {
			line, err := r.ReadSlice('\n')
			if err != nil {
				return
			}
			if first {
				get = bytes.HasPrefix(line, []byte("GET"))
			}
			if len(bytes.TrimSpace(line)) == 0 {
				break
			}
			if len(line) > len(contentLength) && bytes.EqualFold(line[:len(contentLength)], contentLength) {
				n, _ = strconv.Atoi(string(bytes.TrimSpace(line[len(contentLength):])))
			}
		}
		if get {
			if _, err := conn.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")); err != nil {
				return
			}
			continue
		}
		body, err := r.Peek(n)
		if err != nil {
			return
		}
		answer := w.whole
		if bytes.Contains(body, streamTrue) {
			answer = w.chunk
		}
		if _, err := r.Discard(n); err != nil {
			return
		}
		if _, err := conn.Write(answer); err != nil {
			return
		}
	}
}

func (w *cannedWorker) spec(id string) routing.WorkerSpec {
	return routing.WorkerSpec{ID: id, URL: "http://" + w.ln.Addr().String(), Models: []string{testModel}}
}

// discardWriter is an http.ResponseWriter (and Flusher) that keeps the status and drops the
// body, reused across requests: the client's side costs the benchmark nothing.
type discardWriter struct {
	h      http.Header
	status int
}

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(status int)      { d.status = status }
func (d *discardWriter) Flush()                      {}

// BenchmarkHandler is one request through the gateway's whole handler (authenticate, parse,
// admit, queue, dispatch, proxy to a worker over loopback HTTP, relay, settle, ledger, metrics,
// access log), with neither the client's HTTP nor the worker's counted: its allocs/op are the
// gateway's per request, held to the budget in docs/benchmarks.md.
func BenchmarkHandler(b *testing.B) {
	for _, mode := range []struct{ name, body string }{
		{"chat", `{"model":"m1","max_tokens":16,"messages":[{"role":"user","content":"measure the hop of the gateway please"}]}`},
		{"stream", `{"model":"m1","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"measure the hop of the gateway please"}]}`},
	} {
		b.Run(mode.name, func(b *testing.B) {
			w := newCannedWorker(b, 16)
			// Health checks and load scrapes run on a clock, not per request: an hour apart,
			// they stay out of the figures of a run that lasts seconds (or minutes under a
			// profiler).
			g := startGatewayOn(b, routing.Config{Workers: []routing.WorkerSpec{w.spec("w1")}, Policy: "round_robin",
				Health: routing.HealthConfig{Interval: time.Hour}, Scrape: routing.ScrapeConfig{Interval: time.Hour}}, nil, nil)
			body := strings.NewReader(mode.body)
			req, err := http.NewRequest(http.MethodPost, "/v1/chat/completions", body)
			if err != nil {
				b.Fatal(err)
			}
			req.RemoteAddr = "127.0.0.1:40000"
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			out := &discardWriter{h: http.Header{}}
			serve := func() {
				body.Reset(mode.body)
				req.Body, req.ContentLength = io.NopCloser(body), int64(len(mode.body))
				clear(out.h)
				out.status = 0
				g.srv.ServeHTTP(out, req)
				if out.status != http.StatusOK {
					b.Fatalf("status %d", out.status)
				}
			}
			serve() // the first request dials the worker
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				serve()
			}
		})
	}
}
