package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/test/redistest"
)

// peakEngine answers every inference request after a pause and counts the requests it
// holds at once, as an engine's own counters would.
type peakEngine struct {
	srv       *httptest.Server
	now, peak atomic.Int64
	served    atomic.Int64
	pause     time.Duration
}

func newPeakEngine(t *testing.T, pause time.Duration) *peakEngine {
	t.Helper()
	e := &peakEngine{pause: pause}
	e.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		n := e.now.Add(1)
		for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
		}
		time.Sleep(e.pause)
		e.now.Add(-1)
		e.served.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestFleetKeepsWorkerWithinItsLimit: two gateway replicas on one Redis, each sent 24
// concurrent requests for one worker whose limit is 4. With the worker's limit split among
// them (routing.ShareStore) the engine never holds more than 4 at once, and every request is
// served; each replica alone would send it up to 4 of its own.
func TestFleetKeepsWorkerWithinItsLimit(t *testing.T) {
	srv := redistest.Start(t)
	engine := newPeakEngine(t, 20*time.Millisecond)
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{
		{ID: "w1", URL: engine.srv.URL, Models: []string{testModel}, MaxConcurrency: 4}}}
	var gws []*testGateway
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		g := startGatewayPool(t, rcfg, routing.Options{Shares: routing.NewRedisStore(rdb, 0)}, nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.srv.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		gws = append(gws, g)
	}
	const each = 24
	var wg sync.WaitGroup
	statuses := make(chan int, 2*each)
	for _, g := range gws {
		for range each {
			wg.Go(func() {
				resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
				statuses <- resp.StatusCode
			})
		}
	}
	wg.Wait()
	close(statuses)
	for code := range statuses {
		if code != http.StatusOK {
			t.Fatalf("a request got status %d, want every one 200", code)
		}
	}
	if got := engine.served.Load(); got != 2*each {
		t.Fatalf("the engine served %d requests, want %d", got, 2*each)
	}
	if peak := engine.peak.Load(); peak > 4 {
		t.Fatalf("the engine held %d requests at once, over the worker's limit 4", peak)
	}
}

// TestFleetReserveServesInteractiveAtAnyReplica: two replicas on one Redis, each with a backlog
// of batch requests for one worker of limit 8 and 400 tokens, the fleet's interactive reserve
// half of it (4 requests, 200 tokens). Each replica's batch fills its part of the worker's
// tokens (its share of the limit less the reserve; a replica that placed more while the shares
// settled holds the excess), and the engine holds the requests; an interactive request that
// arrives at b then reaches the engine at once, on room b takes from the reserve (for itself,
// and for what b holds beyond its share), preemption off; with two more interactive requests,
// one at each replica, the replicas together never hold more than the worker's limits. Without
// the fleet's reserve each replica's batch fills its whole part of the worker's tokens (a
// replica's queue keeps a tenth of the whole worker's, less than one request), and b's
// interactive request waits for b's batch to end.
func TestFleetReserveServesInteractiveAtAnyReplica(t *testing.T) {
	srv := redistest.Start(t)
	hold := make(chan struct{})
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	spec := w.spec("w")
	spec.MaxConcurrency, spec.MaxTokensInFlight = 8, 400
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{spec}}
	gws := startFleetGateways(t, srv.Addr(), rcfg, 0.5, func(c *Config) { c.DisablePreemption = true })
	// Released before the gateways stop (cleanups run last first): they wait for the requests
	// the engine holds.
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) })
	a, b := gws[0], gws[1]
	const body = `{"model":"m1","max_tokens":90,"messages":[{"role":"user","content":"hello"}]}`
	answers := make(chan *http.Response, 11)
	send := func(g *testGateway, class string) {
		go func() {
			answers <- g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: class})
		}()
	}
	for range 4 {
		send(a, "batch")
		send(b, "batch")
	}
	waitFor(t, "batch requests at the engine", func() bool { return w.started.Load() >= 2 })
	time.Sleep(300 * time.Millisecond) // six exchanges: the shares settle
	batch := w.started.Load()
	send(b, "interactive")
	waitFor(t, "b's interactive request at the engine beside the batch", func() bool { return w.started.Load() == batch+1 })
	send(a, "interactive")
	send(b, "interactive")
	time.Sleep(200 * time.Millisecond) // four exchanges
	var requests, tokens int64
	for _, g := range gws {
		st := g.srv.pool.Workers()[0]
		requests, tokens = requests+st.InFlight, tokens+st.InFlightTokens
	}
	if requests > 8 || tokens > 400 || w.started.Load() != requests {
		t.Fatalf("the replicas hold %d requests of %d tokens on the worker (the engine %d), over its limits 8 and 400",
			requests, tokens, w.started.Load())
	}
	release.Do(func() { close(hold) })
	for range 11 {
		if resp := <-answers; resp.StatusCode != http.StatusOK {
			t.Fatalf("a request got status %d, want every one 200", resp.StatusCode)
		}
	}
}

// TestFleetPreemptsForAnotherReplicasInteractive: two replicas on one Redis share a worker of 4
// requests, of which the fleet's interactive reserve keeps one. a's batch fills the other three
// and an interactive request of a's holds the reserve. An interactive request that then arrives
// at b finds no room, none in the reserve and nothing of b's own to preempt: b calls the fleet,
// a lends the reserve the room of one of its batch requests and ends that request, and b's
// interactive request reaches the engine while the others are still held there. The preempted
// batch request waits in a's queue and is served once after; every request is answered 200; the
// replicas never hold more than the worker's limit. Without the calls b's request waited for
// a's batch to end.
func TestFleetPreemptsForAnotherReplicasInteractive(t *testing.T) {
	srv := redistest.Start(t)
	hold := make(chan struct{})
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	spec := w.spec("w")
	spec.MaxConcurrency = 4
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{spec}}
	gws := startFleetGateways(t, srv.Addr(), rcfg, 0.25, nil)
	var release sync.Once
	var answers []<-chan *http.Response
	answered := 0 // of answers, those the test has read
	// Run before the gateways stop (cleanups run last first), so that a test failing with
	// requests queued ends: once released, the shares let every one be served.
	t.Cleanup(func() {
		release.Do(func() { close(hold) })
		for _, ch := range answers[answered:] {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
			}
		}
	})
	a, b := gws[0], gws[1]
	send := func(g *testGateway, class string) {
		answers = append(answers, g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: class}))
	}
	for range 3 {
		send(a, "batch")
	}
	waitFor(t, "a's batch at the engine", func() bool { return w.started.Load() == 3 })
	send(a, "interactive")
	waitFor(t, "a's interactive request at the engine on the reserve", func() bool { return w.started.Load() == 4 })
	time.Sleep(150 * time.Millisecond) // three exchanges: b knows the reserve held
	send(b, "interactive")
	waitFor(t, "b's interactive request at the engine beside a's held requests", func() bool { return w.started.Load() == 5 })
	if got := metricValue(t, a.reg, "usher_preempted_total"); got != 1 {
		t.Fatalf("a preempted %v requests, want 1", got)
	}
	var held int64
	for _, g := range gws {
		held += g.srv.pool.Workers()[0].InFlight
	}
	if held > 4 {
		t.Fatalf("the replicas hold %d requests on the worker, over its limit 4", held)
	}
	release.Do(func() { close(hold) })
	for _, ch := range answers {
		resp := <-ch
		answered++
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a request got status %d, want every one 200", resp.StatusCode)
		}
	}
	if got := w.requests.Load(); got != 6 {
		t.Errorf("the engine saw %d requests, want 6 (the preempted batch request twice)", got)
	}
}

// startFleetGateways starts two gateways (replicas) whose pools share the Redis at addr, with
// the fleet's interactive reserve of the worker's limit and config changed by mutate (nil: the
// defaults), each running (Server.Run) until the test's cleanups; tenants have every class.
func startFleetGateways(t *testing.T, addr string, rcfg routing.Config, reserve float64, mutate func(*Config)) []*testGateway {
	t.Helper()
	var gws []*testGateway
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		g := startGatewayPool(t, rcfg, routing.Options{Shares: routing.NewRedisStore(rdb, 0), InteractiveReserve: reserve},
			mutate, func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.srv.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		gws = append(gws, g)
	}
	return gws
}
