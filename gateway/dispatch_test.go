package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// closingWorker answers every request over HTTP/1.1 announcing keep-alive and then closes the
// connection, as llama.cpp's server does after every streamed answer: the next request sent on
// that connection finds it dead.
type closingWorker struct {
	ln       net.Listener
	requests atomic.Int64 // inference requests answered
}

func newClosingWorker(t *testing.T) *closingWorker {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &closingWorker{ln: ln}
	go w.serve()
	t.Cleanup(func() { ln.Close() })
	return w
}

func (w *closingWorker) serve() {
	for {
		conn, err := w.ln.Accept()
		if err != nil {
			return
		}
		go w.answer(conn)
	}
}

func (w *closingWorker) answer(conn net.Conn) {
	defer conn.Close()
	req, err := http.ReadRequest(bufio.NewReader(conn))
	if err != nil {
		return
	}
	_, _ = io.Copy(io.Discard, req.Body)
	if req.Method != http.MethodPost {
		fmt.Fprint(conn, "HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok")
		return
	}
	w.requests.Add(1)
	body := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n" +
		"data: [DONE]\n\n"
	fmt.Fprintf(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n"+
		"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(body), body)
}

// An engine that closes its connection after every stream while announcing keep-alive costs the
// client nothing, with the queue backlogged so each request goes out the instant the last ended.
func TestWorkerClosingKeptAliveConnectionsCausesNo502(t *testing.T) {
	const clients, perClient = 20, 10
	w := newClosingWorker(t)
	spec := routing.WorkerSpec{ID: "closer", URL: "http://" + w.ln.Addr().String(), Models: []string{testModel}, MaxConcurrency: 2}
	g := startGateway(t, []routing.WorkerSpec{spec}, nil)
	var bad atomic.Int64
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for range perClient {
				req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(streamBody))
				req.Header.Set("Authorization", "Bearer "+testKey)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					bad.Add(1)
					continue
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), "[DONE]") || strings.Contains(string(data), `"error"`) {
					bad.Add(1)
					t.Logf("status %d: %.200s", resp.StatusCode, data)
				}
			}
		})
	}
	wg.Wait()
	if n := bad.Load(); n > 0 {
		t.Errorf("%d of %d streams failed, want 0", n, clients*perClient)
	}
	if got := w.requests.Load(); got != clients*perClient {
		t.Errorf("the worker answered %d requests, want %d: none lost, none sent twice", got, clients*perClient)
	}
}

// A request the queue released waits for the worker it must use (here its target, full) instead
// of being refused with 503 while that worker is only busy.
func TestReleasedRequestWaitsForItsBusyTargetWorker(t *testing.T) {
	hold := make(chan struct{})
	a := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	b := newFakeWorker(t, nil)
	specA, specB := a.spec("a"), b.spec("b")
	specA.MaxConcurrency, specB.MaxConcurrency = 1, 1
	ops := &tenants.Tier{Name: "ops", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}, MayTargetWorker: true}
	g := startGatewayWith(t, []routing.WorkerSpec{specA, specB}, nil, func(d *Deps) { d.Auth = tierAuth{ops} })
	target := map[string]string{headerTarget: "a"}
	first := make(chan int, 1)
	go func() {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, target)
		first <- resp.StatusCode
	}()
	waitFor(t, "a holds the first request", func() bool { return a.started.Load() == 1 })
	second := make(chan *http.Response, 1)
	go func() { second <- g.post(t, "/v1/chat/completions", testKey, chatBody, target) }()
	select {
	case resp := <-second:
		t.Fatalf("the second request for a busy a answered %d at once, want it to wait for a", resp.StatusCode)
	case <-time.After(200 * time.Millisecond):
	}
	close(hold)
	if got := <-first; got != http.StatusOK {
		t.Fatalf("first: %d", got)
	}
	if resp := <-second; resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "a" {
		t.Fatalf("second: got %d from %q, want 200 from a", resp.StatusCode, resp.Header.Get(headerWorker))
	}
}

// A target worker that takes no requests (drained) is refused at once, not waited for.
func TestDrainedTargetWorkerIs503(t *testing.T) {
	a := newFakeWorker(t, nil)
	b := newFakeWorker(t, nil)
	ops := &tenants.Tier{Name: "ops", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}, MayTargetWorker: true}
	g := startGatewayWith(t, []routing.WorkerSpec{a.spec("a"), b.spec("b")}, nil, func(d *Deps) { d.Auth = tierAuth{ops} })
	if err := g.srv.pool.Drain(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerTarget: "a"}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("drained target: got %d, want 503", resp.StatusCode)
	}
}

// The queues' capacity follows the pool's changes at once: a worker drained leaves the capacity,
// undrained comes back, with no poll.
func TestCapacityFollowsThePoolsChanges(t *testing.T) {
	a := newFakeWorker(t, nil)
	b := newFakeWorker(t, nil)
	specA, specB := a.spec("a"), b.spec("b")
	specA.MaxConcurrency, specB.MaxConcurrency = 3, 4
	g := startGateway(t, []routing.WorkerSpec{specA, specB}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	capacity := func() int {
		g.srv.dispatcher.mu.Lock()
		defer g.srv.dispatcher.mu.Unlock()
		return g.srv.dispatcher.caps[testModel].Requests
	}
	waitFor(t, "capacity 7", func() bool { return capacity() == 7 })
	if err := g.srv.pool.Drain(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "capacity 3 after draining b", func() bool { return capacity() == 3 })
	if err := g.srv.pool.Undrain(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "capacity 7 after undraining b", func() bool { return capacity() == 7 })
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for: %s", what)
}
