package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/usherllm/usher/queue"
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
	g := startTierGateway(t, []routing.WorkerSpec{specA, specB}, opsTier)
	target := map[string]string{headerTarget: "a"}
	first := make(chan int, 1)
	go func() {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, target)
		first <- resp.StatusCode
	}()
	waitFor(t, "a holds the first request", func() bool { return a.started.Load() == 1 })
	second := g.postLater(t, "/v1/chat/completions", testKey, chatBody, target)
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

// A request that waits for its busy target worker does so in the queue, holding nothing: a later
// request that another worker can take is served meanwhile. (When the queue released requests by
// the pool's capacity alone, the waiting request held the second slot, and the later one waited
// for the first to end although b was idle.)
func TestRequestWaitingForItsTargetDoesNotHoldBackOthers(t *testing.T) {
	holdA, holdB := make(chan struct{}), make(chan struct{})
	a := newFakeWorker(t, func(w *fakeWorker) { w.hold = holdA })
	b := newFakeWorker(t, func(w *fakeWorker) { w.hold = holdB })
	specA, specB := a.spec("a"), b.spec("b")
	specA.MaxConcurrency, specB.MaxConcurrency = 1, 1
	g := startTierGateway(t, []routing.WorkerSpec{specA, specB}, opsTier)
	// Interactive, so that no reserve holds the second slot back.
	post := func(header map[string]string) <-chan *http.Response {
		header[headerPriority] = "interactive"
		return g.postLater(t, "/v1/chat/completions", testKey, chatBody, header)
	}
	first := post(map[string]string{headerTarget: "a"})
	waitFor(t, "a holds the first request", func() bool { return a.started.Load() == 1 })
	second := post(map[string]string{headerTarget: "a"})
	waitFor(t, "the second request for a waits in the queue", func() bool { return queuedCount(g.srv.dispatcher, testModel) == 1 })
	third := post(map[string]string{})
	waitFor(t, "b serves the third request while the second waits for a", func() bool { return b.started.Load() == 1 })
	if n := a.started.Load(); n != 1 {
		t.Fatalf("a started %d requests while full, want 1", n)
	}
	close(holdB)
	if resp := <-third; resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "b" {
		t.Fatalf("third: %d from %q, want 200 from b", resp.StatusCode, resp.Header.Get(headerWorker))
	}
	close(holdA)
	for i, ch := range []<-chan *http.Response{first, second} {
		if resp := <-ch; resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "a" {
			t.Fatalf("request %d for a: %d from %q, want 200 from a", i+1, resp.StatusCode, resp.Header.Get(headerWorker))
		}
	}
}

// A target worker that takes no requests (drained) is refused at once, not waited for.
func TestDrainedTargetWorkerIs503(t *testing.T) {
	a := newFakeWorker(t, nil)
	b := newFakeWorker(t, nil)
	g := startTierGateway(t, []routing.WorkerSpec{a.spec("a"), b.spec("b")}, opsTier)
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

// Tiers of the dispatch tests: every class open (so a request may ask for interactive or
// batch), and that plus choosing a worker.
var (
	everyClassTier = &tenants.Tier{Name: "all", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}}
	opsTier = &tenants.Tier{Name: "ops", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}, MayTargetWorker: true}
)

// startTierGateway is startGateway whose tenant has tier.
func startTierGateway(t *testing.T, specs []routing.WorkerSpec, tier *tenants.Tier) *testGateway {
	t.Helper()
	return startGatewayWith(t, specs, nil, func(d *Deps) { d.Auth = tierAuth{tier} })
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

// An interactive request that finds no room takes it from a batch request whose answer has not
// begun: the batch request is cancelled at its worker, waits in the queue again and is served
// after, once; nothing fails.
func TestInteractivePreemptsABatchRequestNotYetAnswered(t *testing.T) {
	hold := make(chan struct{})
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	spec := w.spec("w")
	spec.MaxConcurrency = 1
	g := startTierGateway(t, []routing.WorkerSpec{spec}, everyClassTier)
	batch := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
	waitFor(t, "the worker holds the batch request", func() bool { return w.started.Load() == 1 })
	inter := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	waitFor(t, "the interactive request reaches the worker", func() bool { return w.started.Load() == 2 })
	close(hold)
	if resp := <-inter; resp.StatusCode != http.StatusOK || resp.Header.Get(headerClass) != "interactive" {
		t.Fatalf("interactive: %d in class %q", resp.StatusCode, resp.Header.Get(headerClass))
	}
	if resp := <-batch; resp.StatusCode != http.StatusOK {
		t.Fatalf("preempted batch request: %d, want 200 once requeued", resp.StatusCode)
	}
	if got := w.requests.Load(); got != 3 {
		t.Errorf("the worker saw %d requests, want 3 (batch, interactive, batch again)", got)
	}
	if got := metricValue(t, g.reg, "usher_preempted_total"); got != 1 {
		t.Errorf("usher_preempted_total %v, want 1", got)
	}
}

// A batch request that no worker may take now (here: interactive requests are present and
// another batch prompt placed on the only worker holds its prefill budget) stays in the queue,
// holding neither capacity nor a worker; interactive requests go past it without preempting
// anything, and it is sent once, after. (Before the queue placed its requests, such a request
// was released, held capacity while it waited for a worker, and was preempted from that wait.)
// The batch request placed is not sent while an interactive prompt is in prefill there (see
// TestBatchRequestYieldsToAnInteractivePrefill): every request reaches the worker once all the
// same.
func TestBatchRequestNoWorkerMayTakeWaitsInTheQueue(t *testing.T) {
	hold := make(chan struct{})
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	spec := w.spec("w")
	spec.MaxConcurrency = 4 // of which the interactive reserve is 1
	// Pieces off: a prompt routing counts as one piece, but that the gateway then cannot cut
	// (content parts), counts whole only once the gateway says so (Lease.PrefillWhole), and a
	// request placed in between sees one piece: under load the second batch request was placed
	// there now and then, and never queued.
	g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{spec}, Policy: "round_robin",
		Concurrency: routing.ConcurrencyConfig{PrefillPieceTokens: -1}}, nil, func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
	// A prompt longer than the prefill budget (512 tokens): a second one cannot join the first
	// in prefill.
	long := `{"model":"m1","stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("word ", 600) + `"}]}]}`
	post := func(class, body string) <-chan *http.Response {
		return g.postLater(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: class})
	}
	first := post("interactive", streamBody)
	waitFor(t, "the worker holds the first interactive request", func() bool { return w.started.Load() == 1 })
	inPrefill := post("batch", long)
	waitFor(t, "the first batch request placed on the worker", func() bool { return inFlightCount(g.srv.dispatcher, "m1") == 2 })
	batch := post("batch", long)
	waitFor(t, "the second batch request waits in the queue", func() bool { return queuedCount(g.srv.dispatcher, "m1") == 1 })
	second := post("interactive", streamBody)
	waitFor(t, "the second interactive request reaches the worker", func() bool { return w.started.Load() == 2 })
	third := post("interactive", streamBody)
	waitFor(t, "the third interactive request reaches the worker", func() bool { return w.started.Load() == 3 })
	if n := queuedCount(g.srv.dispatcher, "m1"); n != 1 {
		t.Errorf("%d calls queued, want the second batch request", n)
	}
	close(hold)
	for _, ch := range []<-chan *http.Response{first, inPrefill, second, third, batch} {
		if resp := <-ch; resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if got := w.requests.Load(); got != 5 {
		t.Errorf("the worker saw %d requests, want 5: the waiting batch request once", got)
	}
	if got := metricValue(t, g.reg, "usher_preempted_total"); got != 0 {
		t.Errorf("usher_preempted_total %v, want 0", got)
	}
}

// A batch stream already relaying to its client is never preempted: the interactive request
// waits for its slot.
func TestStreamBeingRelayedIsNotPreempted(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.linger = true })
	spec := w.spec("w")
	spec.MaxConcurrency = 1
	g := startTierGateway(t, []routing.WorkerSpec{spec}, everyClassTier)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(streamBody))
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set(headerPriority, "batch")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	inter := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	select {
	case r := <-inter:
		t.Fatalf("the interactive request was answered %d while the only slot relays a stream", r.StatusCode)
	case <-time.After(200 * time.Millisecond):
	}
	cancel()
	if r := <-inter; r.StatusCode != http.StatusOK {
		t.Fatalf("interactive: %d", r.StatusCode)
	}
	if got := metricValue(t, g.reg, "usher_preempted_total"); got != 0 {
		t.Errorf("usher_preempted_total %v, want 0", got)
	}
}

// metricValue sums every series of the named counter or gauge in reg (0 when absent).
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	return metricLabelValue(t, reg, name, "", "")
}

// queuedCount is the number of calls of model waiting in its queue.
func queuedCount(d *dispatcher, model string) int {
	return classSum(d, model, func(c queue.ClassSnapshot) int { return c.Queued })
}

// inFlightCount is the number of calls of model released by its queue and not done.
func inFlightCount(d *dispatcher, model string) int {
	return classSum(d, model, func(c queue.ClassSnapshot) int { return c.InFlight })
}

// classSum sums count over the classes of model's queue (0 without one).
func classSum(d *dispatcher, model string, count func(queue.ClassSnapshot) int) int {
	d.mu.Lock()
	q := d.queues[model]
	d.mu.Unlock()
	n := 0
	if q != nil {
		for _, c := range q.Snapshot().Classes {
			n += count(c)
		}
	}
	return n
}

// metricLabelValue is the value of the counter or gauge name whose label is value, summed over
// its other labels; with label "", every series of name (0 when absent).
func metricLabelValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetName() == label && l.GetValue() == value
			}
			if match {
				sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
	}
	return sum
}

// usher publishes its own added latency: one observation per answered request, well under the
// request's whole time (the worker's and the queue's time are not in it).
func TestOverheadHistogramExcludesTheWorker(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w")}, nil)
	for range 3 {
		if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	families, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "usher_gateway_overhead_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			if h.GetSampleCount() != 3 {
				t.Fatalf("%d observations, want 3", h.GetSampleCount())
			}
			if h.GetSampleSum() <= 0 || h.GetSampleSum() > 1 {
				t.Fatalf("sum %v s, want a positive time under 1 s", h.GetSampleSum())
			}
			return
		}
	}
	t.Fatal("no usher_gateway_overhead_seconds")
}

// A batch stream whose worker answered its headers but no event yet (the engine is prefilling
// the prompt) is still preemptible: nothing has reached its client.
func TestBatchStreamPreemptedBeforeItsFirstEvent(t *testing.T) {
	hold := make(chan struct{})
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold, w.headersFirst = hold, true })
	spec := w.spec("w")
	spec.MaxConcurrency = 1
	g := startTierGateway(t, []routing.WorkerSpec{spec}, everyClassTier)
	batch := g.postLater(t, "/v1/chat/completions", testKey, streamBody, map[string]string{headerPriority: "batch"})
	waitFor(t, "the worker holds the batch stream", func() bool { return w.started.Load() == 1 })
	inter := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	waitFor(t, "the interactive request reaches the worker", func() bool { return w.started.Load() == 2 })
	close(hold)
	if resp := <-inter; resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive: %d", resp.StatusCode)
	}
	resp := <-batch
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch stream: %d", resp.StatusCode)
	}
	if events := readEvents(t, resp.Body); len(events) == 0 || events[len(events)-1] != "[DONE]" || strings.Contains(strings.Join(events, ""), `"error"`) {
		t.Fatalf("batch stream events %q, want a whole answer", events)
	}
	if got := metricValue(t, g.reg, "usher_preempted_total"); got != 1 {
		t.Errorf("usher_preempted_total %v, want 1", got)
	}
}

// A worker that stops sending mid-stream (hung, its health check still passing) is cut off after
// server.upstream_idle_timeout: the client gets an error event, and the attempt counts as the
// worker's failure, so its circuit breaker takes it out.
func TestSilentWorkerIsCutOffAndCountedFailed(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.chunks, w.hangAfter = 5, 2 })
	g := startGateway(t, []routing.WorkerSpec{w.spec("w")}, func(c *Config) { c.UpstreamIdleTimeout = 150 * time.Millisecond })
	start := time.Now()
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	events := readEvents(t, resp.Body)
	if len(events) != 3 || !strings.Contains(events[2], "sent nothing") {
		t.Fatalf("events %q, want two chunks and an error event saying the worker sent nothing", events)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the stream ended after %v, want about the idle timeout", d)
	}
	failed := 0.0
	families, _ := g.reg.Gather()
	for _, f := range families {
		if f.GetName() != "usher_routing_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == "failed" {
					failed += m.GetCounter().GetValue()
				}
			}
		}
	}
	if failed != 1 {
		t.Errorf("failed attempts counted: %v, want 1", failed)
	}
}

// A preemption cancels first the newest attempt whose engine is generating tokens (it stops at
// the next one); and only when none is, the newest attempt (still in prefill, or waiting in the
// engine).
func TestPreemptionPrefersAnAttemptBeingDecoded(t *testing.T) {
	var p preemption
	w := &routing.Worker{}
	var cancelled []int
	add := func(i int) *victim {
		v := &victim{worker: w, tokens: 100, cancel: func(error) { cancelled = append(cancelled, i) }}
		p.add("m", v)
		return v
	}
	add(0)
	second := add(1)
	add(2)
	p.decoding(second)
	short := []routing.Shortfall{{Worker: w, Requests: 1, InFlight: 3}}
	if p.preemptFor("m", short) != w || !slices.Equal(cancelled, []int{1}) {
		t.Fatalf("cancelled %v, want the decoding attempt 1", cancelled)
	}
	short[0].InFlight = 2
	if p.preemptFor("m", short) != w || !slices.Equal(cancelled, []int{1, 2}) {
		t.Fatalf("cancelled %v, then want the newest, 2", cancelled)
	}
	short[0].InFlight = 1
	if p.preemptFor("m", short) != w || p.preemptFor("m", short) != nil || !slices.Equal(cancelled, []int{1, 2, 0}) {
		t.Fatalf("cancelled %v, want 0 last and then nothing", cancelled)
	}
}

// An interactive call that finds no room cancels the fewest attempts that make room for it on
// one worker, in requests and in tokens (a replica's share of a worker lowered under its
// requests in flight, a long prompt in its tokens), and none where that would not give it room.
func TestPreemptionMakesRoomOnOneWorker(t *testing.T) {
	a, b := &routing.Worker{}, &routing.Worker{}
	type attempt struct {
		worker *routing.Worker
		tokens int64
	}
	cases := []struct {
		name     string
		attempts []attempt // oldest first
		short    []routing.Shortfall
		want     []int
	}{
		{"the worker that takes the fewest", []attempt{{a, 100}, {a, 100}, {b, 100}, {b, 100}},
			[]routing.Shortfall{{Worker: a, Requests: 1, InFlight: 2}, {Worker: b, Requests: 2, InFlight: 2}},
			[]int{1}},
		{"more than one, where the share is two short", []attempt{{a, 100}, {b, 100}, {b, 100}, {b, 100}},
			[]routing.Shortfall{{Worker: b, Requests: 2, InFlight: 3}},
			[]int{3, 2}},
		{"tokens: as many as the tokens lacking take", []attempt{{a, 400}, {a, 300}, {a, 200}},
			[]routing.Shortfall{{Worker: a, Tokens: 450, InFlight: 4}},
			[]int{2, 1}},
		{"tokens: an idle worker takes any request", []attempt{{a, 100}, {a, 100}},
			[]routing.Shortfall{{Worker: a, Tokens: 5000, InFlight: 2}},
			[]int{1, 0}},
		{"nothing while a worker has room", []attempt{{a, 100}, {b, 100}},
			[]routing.Shortfall{{Worker: a, Requests: 1, InFlight: 1}, {Worker: b}},
			nil},
		{"nothing where the attempts cannot make room", []attempt{{a, 100}, {a, 100}, {b, 100}},
			[]routing.Shortfall{{Worker: a, Tokens: 5000, InFlight: 3}, {Worker: b, Requests: 2, InFlight: 2}},
			nil},
		{"nothing to preempt, none ever preemptible", nil,
			[]routing.Shortfall{{Worker: a, Requests: 1, InFlight: 1}},
			nil},
		{"at most maxPreempted", []attempt{{a, 1}, {a, 1}, {a, 1}, {a, 1}, {a, 1}, {a, 1}},
			[]routing.Shortfall{{Worker: a, Requests: maxPreempted + 1, InFlight: 6}},
			nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var p preemption
			var cancelled []int
			for i, at := range tc.attempts {
				p.add("m", &victim{worker: at.worker, tokens: at.tokens,
					cancel: func(error) { cancelled = append(cancelled, i) }})
			}
			at := p.preemptFor("m", tc.short)
			if !slices.Equal(cancelled, tc.want) {
				t.Fatalf("cancelled %v, want %v", cancelled, tc.want)
			}
			if (at != nil) != (tc.want != nil) || at != nil && at != tc.attempts[tc.want[0]].worker {
				t.Errorf("preempted on %p, want the worker of attempt(s) %v", at, tc.want)
			}
			if left := len(p.running["m"]); left != len(tc.attempts)-len(tc.want) {
				t.Errorf("%d attempts still preemptible, want %d", left, len(tc.attempts)-len(tc.want))
			}
		})
	}
}
