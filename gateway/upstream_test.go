package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingServer is a real HTTP worker that counts the connections it accepted and the
// requests it served.
type countingServer struct {
	*httptest.Server
	conns, requests atomic.Int64
}

func newCountingServer(t *testing.T, h http.HandlerFunc) *countingServer {
	t.Helper()
	cs := &countingServer{}
	cs.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.requests.Add(1)
		h(w, r)
	}))
	cs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			cs.conns.Add(1)
		}
	}
	cs.Start()
	t.Cleanup(cs.Close)
	return cs
}

func testLeanTransport(t *testing.T) *upstreamTransport {
	t.Helper()
	tr := newLeanTransport(Config{UpstreamConnectTimeout: time.Second, UpstreamHeaderTimeout: 5 * time.Second}, time.Now)
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	return req
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func TestLeanTransportReusesConnectionsForLengthAndChunkedAnswers(t *testing.T) {
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Query().Get("chunked") != "" {
			fmt.Fprintf(w, "echo:")
			w.(http.Flusher).Flush() // a flush before the end makes the answer chunked
		}
		fmt.Fprintf(w, "%s %s %s", r.Header.Get("Content-Type"), r.Host, body)
	})
	tr := testLeanTransport(t)
	for i, path := range []string{"/a", "/b?chunked=1", "/c", "/d?chunked=1"} {
		resp, err := tr.RoundTrip(post(t, context.Background(), w.URL+path, fmt.Sprintf(`{"n":%d}`, i)))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		got := readAll(t, resp)
		if n, err := resp.Body.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("read after the end: %d, %v; want 0, EOF again", n, err)
		}
		want := fmt.Sprintf(`application/json %s {"n":%d}`, strings.TrimPrefix(w.URL, "http://"), i)
		if strings.Contains(path, "chunked") {
			want = "echo:" + want
		}
		if got != want {
			t.Fatalf("request %d answered %q, want %q", i, got, want)
		}
	}
	if n := w.conns.Load(); n != 1 {
		t.Fatalf("4 sequential requests used %d connections, want 1", n)
	}
}

func TestLeanTransportReportsReusedConnections(t *testing.T) {
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	tr := testLeanTransport(t)
	var got []bool
	for range 2 {
		trace := &httptraceRecorder{}
		resp, err := tr.RoundTrip(post(t, trace.context(), w.URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		got = append(got, trace.reused)
	}
	if got[0] || !got[1] {
		t.Fatalf("reused = %v, want [false true]", got)
	}
}

// keepAliveLiar answers every request on a raw connection announcing keep-alive, then closes
// the connection, as llama.cpp's server does after a stream.
func keepAliveLiar(t *testing.T, answered *atomic.Int64) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil {
					return
				}
				_, _ = io.Copy(io.Discard, req.Body)
				answered.Add(1)
				fmt.Fprint(c, "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

func TestLeanTransportReplaysOnAClosedIdleConnectionOnlyWhenMarked(t *testing.T) {
	var answered atomic.Int64
	url := keepAliveLiar(t, &answered)
	tr := testLeanTransport(t)
	for i := range 5 {
		req := post(t, context.Background(), url, "{}")
		req.Header["Idempotency-Key"] = nil
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("request %d answered %q", i, got)
		}
	}
	if n := answered.Load(); n != 5 {
		t.Fatalf("the worker answered %d requests, want exactly 5 (none twice)", n)
	}
	// Without the mark, the failure on the closed connection is the caller's to handle.
	req := post(t, context.Background(), url, "{}")
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("an unmarked request on a connection the worker closed succeeded; want an error, not a replay")
	}
	if n := answered.Load(); n != 5 {
		t.Fatalf("the worker answered %d requests, want 5", n)
	}
}

func TestLeanTransportNeverReplaysOnceTheAnswerBegan(t *testing.T) {
	var requests atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if requests.Add(1) == 1 {
						fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
						continue
					}
					fmt.Fprint(c, "HTTP/1.1 200 OK\r\nContent-Le") // cut in the headers
					return
				}
			}()
		}
	}()
	tr := testLeanTransport(t)
	url := "http://" + ln.Addr().String()
	resp, err := tr.RoundTrip(post(t, context.Background(), url, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	req := post(t, context.Background(), url, "{}")
	req.Header["Idempotency-Key"] = nil
	if _, err := tr.RoundTrip(req); err == nil {
		t.Fatal("an answer cut in its headers succeeded")
	}
	if n := requests.Load(); n != 2 {
		t.Fatalf("the worker saw %d requests, want 2: the one whose answer began is not sent again", n)
	}
}

func TestLeanTransportCancelStopsTheBodyWithItsCauseAndDropsTheConnection(t *testing.T) {
	release := make(chan struct{})
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := testLeanTransport(t)
	ctx, cancel := context.WithCancelCause(context.Background())
	resp, err := tr.RoundTrip(post(t, ctx, w.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 13)
	if _, err := io.ReadFull(resp.Body, first); err != nil {
		t.Fatal(err)
	}
	why := errors.New("preempted for the test")
	cancel(why)
	if _, err := io.ReadAll(resp.Body); !errors.Is(err, why) {
		t.Fatalf("read after cancel: %v, want the cancel's cause", err)
	}
	resp.Body.Close()
	resp, err = tr.RoundTrip(post(t, context.Background(), w.URL, "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := w.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: a cancelled attempt's connection is not reused", n)
	}
}

func TestLeanTransportBodyClosedEarlyIsNotReused(t *testing.T) {
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, strings.Repeat("x", 64<<10))
	})
	tr := testLeanTransport(t)
	for range 2 {
		resp, err := tr.RoundTrip(post(t, context.Background(), w.URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = resp.Body.Read(make([]byte, 10))
		resp.Body.Close()
		if _, err := resp.Body.Read(make([]byte, 10)); !errors.Is(err, http.ErrBodyReadAfterClose) {
			t.Fatalf("read after close: %v", err)
		}
	}
	if n := w.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
}

func TestLeanTransportBoundsTheWaitForHeaders(t *testing.T) {
	release := make(chan struct{})
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { <-release })
	defer close(release)
	tr := testLeanTransport(t)
	tr.headerTimeout = 50 * time.Millisecond
	_, err := tr.RoundTrip(post(t, context.Background(), w.URL, "{}"))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("err = %v, want a timeout", err)
	}
}

func TestLeanTransportRefusesControlCharactersInHeaders(t *testing.T) {
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {})
	tr := testLeanTransport(t)
	req := post(t, context.Background(), w.URL, "{}")
	req.Header["X-Evil"] = []string{"a\r\nX-Injected: 1"}
	if _, err := tr.RoundTrip(req); !errors.Is(err, errBadHeader) {
		t.Fatalf("err = %v, want errBadHeader", err)
	}
	if n := w.requests.Load(); n != 0 {
		t.Fatalf("the worker saw %d requests", n)
	}
}

func TestLeanTransportClosesConnectionsIdleTooLong(t *testing.T) {
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })
	tr := testLeanTransport(t)
	var mu sync.Mutex
	now := time.Now()
	tr.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	for range 2 {
		resp, err := tr.RoundTrip(post(t, context.Background(), w.URL, "{}"))
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		mu.Lock()
		now = now.Add(tr.idleTimeout)
		mu.Unlock()
	}
	if n := w.conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2: one idle for the whole idle timeout is not reused", n)
	}
}

func TestLeanTransportLeavesHTTPSToTheFallback(t *testing.T) {
	tr := testLeanTransport(t)
	var got string
	tr.fallback = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		got = r.URL.String()
		return &http.Response{StatusCode: 200, Body: io.NopCloser(bytes.NewReader(nil)), Request: r}, nil
	})
	resp, err := tr.RoundTrip(post(t, context.Background(), "https://engine.example/v1/x", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got != "https://engine.example/v1/x" {
		t.Fatalf("fallback saw %q", got)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type httptraceRecorder struct{ reused bool }

func (h *httptraceRecorder) context() context.Context {
	return httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) { h.reused = info.Reused },
	})
}

// A cancel that lands while the request is being written must not be undone by the header
// deadline set after the write: the attempt ends at once, not when the header timeout does.
// (Seen as a preempted batch request held for the whole header timeout.) The worker's
// connection cancels the attempt from inside the write and returns once the cancel's past
// deadline is set, so the header deadline comes after it every time.
func TestLeanTransportCancelDuringTheWriteIsNotLost(t *testing.T) {
	release := make(chan struct{})
	w := newCountingServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := testLeanTransport(t)
	tr.headerTimeout = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	dial := tr.dial
	tr.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &cancellingConn{Conn: c, cancel: cancel, deadlineSet: make(chan struct{})}, nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(post(t, ctx, w.URL, "{}"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting for headers 10 s after the attempt was cancelled")
	}
}

// cancellingConn cancels its attempt during the first write and lets the write return once
// the cancel has set its deadline.
type cancellingConn struct {
	net.Conn
	cancel      context.CancelFunc
	once        sync.Once
	deadlineSet chan struct{}
}

func (c *cancellingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.once.Do(func() {
		c.cancel()
		<-c.deadlineSet
	})
	return n, err
}

func (c *cancellingConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	select {
	case <-c.deadlineSet:
	default:
		close(c.deadlineSet)
	}
	return err
}
