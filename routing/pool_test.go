package routing

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestPoolModels(t *testing.T) {
	cfg := Config{Workers: []WorkerSpec{
		{ID: "a", URL: "http://127.0.0.1:1", Models: []string{"zeta", "alpha"}},
		{ID: "b", URL: "http://127.0.0.1:2", Models: []string{"alpha"}},
	}, Models: map[string]ModelConfig{"unserved": {Policy: "random"}}}
	p, _ := newTestPool(t, cfg)
	if got, want := p.Models(), []string{"alpha", "zeta"}; !slices.Equal(got, want) {
		t.Errorf("Models: got %v, want %v", got, want)
	}
	for model, want := range map[string]bool{"alpha": true, "zeta": true, "unserved": false, "": false} {
		if got := p.Serves(model); got != want {
			t.Errorf("Serves(%q): got %v, want %v", model, got, want)
		}
	}
}

func TestPoolReady(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(2, "m")})
	if !p.Ready() {
		t.Fatalf("fresh pool: got not ready, want ready (unchecked workers count as healthy)")
	}
	ws := modelWorkers(t, p, "m")
	markDown(ws[0])
	ws[1].draining.Store(true)
	if p.Ready() {
		t.Errorf("one worker down, one draining: got ready, want not ready")
	}
	empty, _ := newTestPool(t, Config{})
	if empty.Ready() {
		t.Errorf("empty pool: got ready, want not ready")
	}
}

func TestPickErrors(t *testing.T) {
	tests := []struct {
		name    string
		req     Request
		prepare func(ws []*Worker)
		wantErr error
		want    string
		route   Route
	}{
		{name: "unknown model", req: Request{Model: "other"}, wantErr: ErrUnknownModel},
		{name: "no eligible worker", req: Request{Model: "m"}, prepare: func(ws []*Worker) { markDown(ws[0]); markDown(ws[1]) }, wantErr: ErrNoWorker},
		{name: "all excluded", req: Request{Model: "m", Exclude: []string{"w0", "w1"}}, wantErr: ErrNoWorker},
		{name: "target", req: Request{Model: "m", TargetWorker: "w1"}, want: "w1", route: RouteTarget},
		{name: "target of another model", req: Request{Model: "m", TargetWorker: "x"}, wantErr: ErrUnknownWorker},
		{name: "target down", req: Request{Model: "m", TargetWorker: "w1"}, prepare: func(ws []*Worker) { markDown(ws[1]) }, wantErr: ErrNoWorker},
		{name: "policy pick", req: Request{Model: "m"}, want: "w0", route: RouteRoundRobin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Policy: "round_robin", Workers: append(testWorkers(2, "m"), WorkerSpec{ID: "x", URL: "http://127.0.0.1:9", Models: []string{"n"}})}
			p, _ := newTestPool(t, cfg)
			if tt.prepare != nil {
				tt.prepare(modelWorkers(t, p, "m"))
			}
			l, err := p.Pick(context.Background(), &tt.req)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got error %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			defer l.Release(Outcome{})
			if l.Worker.ID() != tt.want || l.Route != tt.route {
				t.Errorf("got %s by %q, want %s by %q", l.Worker.ID(), l.Route, tt.want, tt.route)
			}
		})
	}
}

func TestLeaseAccountingUnderConcurrency(t *testing.T) {
	const (
		workers    = 4
		goroutines = 16
		rounds     = 300
		maxConc    = 3
	)
	cfg := Config{Workers: testWorkers(workers, "m"), MaxConcurrency: maxConc, MaxTokensInFlight: 1 << 30}
	p, reg := newTestPool(t, cfg)
	ws := modelWorkers(t, p, "m")
	var over atomic.Bool
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				l, err := p.Pick(context.Background(), &Request{Model: "m", Tokens: 10})
				if errors.Is(err, ErrNoWorker) {
					refused.Add(1)
					continue
				}
				if err != nil {
					t.Errorf("Pick: %v", err)
					return
				}
				granted.Add(1)
				if l.Worker.InFlight() > maxConc {
					over.Store(true)
				}
				l.Release(Outcome{})
				l.Release(Outcome{}) // a second Release does nothing
			}
		})
	}
	wg.Wait()
	if over.Load() {
		t.Errorf("a worker went above its max concurrency of %d", maxConc)
	}
	for _, w := range ws {
		if w.InFlight() != 0 || w.InFlightTokens() != 0 {
			t.Errorf("worker %s after all releases: got %d requests and %d tokens in flight, want 0 and 0", w.ID(), w.InFlight(), w.InFlightTokens())
		}
	}
	if got, want := granted.Load()+refused.Load(), int64(goroutines*rounds); got != want {
		t.Errorf("got %d outcomes, want %d", got, want)
	}
	if got := testutil.ToFloat64(p.metrics.outcomes.WithLabelValues("w0", "ok")) + testutil.ToFloat64(p.metrics.outcomes.WithLabelValues("w1", "ok")) +
		testutil.ToFloat64(p.metrics.outcomes.WithLabelValues("w2", "ok")) + testutil.ToFloat64(p.metrics.outcomes.WithLabelValues("w3", "ok")); got != float64(granted.Load()) {
		t.Errorf("usher_routing_requests_total: got %v, want %d", got, granted.Load())
	}
	if n, err := testutil.GatherAndCount(reg, "usher_routing_worker_in_flight_requests"); err != nil || n != workers {
		t.Errorf("in-flight gauge series: got %d (%v), want %d", n, err, workers)
	}
}

func TestLeaseHoldsCapacity(t *testing.T) {
	specs := testWorkers(1, "m")
	specs[0].MaxConcurrency = 2
	p, _ := newTestPool(t, Config{Workers: specs})
	r := &Request{Model: "m", Tokens: 100}
	a, err := p.Pick(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Pick(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Worker.InFlightTokens(); got != 200 {
		t.Errorf("tokens in flight: got %d, want 200", got)
	}
	if _, err := p.Pick(context.Background(), r); !errors.Is(err, ErrNoRoom) || !errors.Is(err, ErrNoWorker) {
		t.Errorf("third pick on a worker of max 2: got %v, want ErrNoRoom and ErrNoWorker", err)
	}
	if _, err := p.Pick(context.Background(), &Request{Model: "m", Exclude: []string{"w0"}}); !errors.Is(err, ErrNoWorker) || errors.Is(err, ErrNoRoom) {
		t.Errorf("pick with the full worker excluded: got %v, want ErrNoWorker without ErrNoRoom", err)
	}
	var room []string
	p.OnRoom(func(model string) { room = append(room, model) })
	a.Release(Outcome{})
	p.OnRoom(nil)
	if !slices.Equal(room, []string{"m"}) {
		t.Errorf("a release told OnRoom's function of %v, want [m]", room)
	}
	c, err := p.Pick(context.Background(), r)
	if err != nil {
		t.Errorf("pick after a release: got %v, want a lease", err)
	} else {
		c.Release(Outcome{})
	}
	b.Release(Outcome{})
}

func TestDecisionMetrics(t *testing.T) {
	p, reg := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(1, "m")})
	l, err := p.Pick(context.Background(), &Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release(Outcome{Failed: true})
	markDown(l.Worker)
	_, _ = p.Pick(context.Background(), &Request{Model: "m"})
	want := `
# HELP usher_routing_decisions_total Routing decisions by model, policy and route; route "none" counts picks that found no eligible worker.
# TYPE usher_routing_decisions_total counter
usher_routing_decisions_total{model="m",policy="round_robin",route="none"} 1
usher_routing_decisions_total{model="m",policy="round_robin",route="round_robin"} 1
# HELP usher_routing_requests_total Requests released by worker and result (ok, failed: connect error or 5xx before the first byte).
# TYPE usher_routing_requests_total counter
usher_routing_requests_total{result="failed",worker="w0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "usher_routing_decisions_total", "usher_routing_requests_total"); err != nil {
		t.Error(err)
	}
}

// healthServer is a worker's /health endpoint whose answer the test switches.
type healthServer struct {
	*httptest.Server
	ok   atomic.Bool
	hits atomic.Int64
}

func newHealthServer(t *testing.T) *healthServer {
	h := &healthServer{}
	h.ok.Store(true)
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.hits.Add(1)
		if r.URL.Path != "/health" || !h.ok.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(h.Close)
	return h
}

func TestHealthTransitions(t *testing.T) {
	srv := newHealthServer(t)
	cfg := Config{
		Workers: []WorkerSpec{{ID: "a", URL: srv.URL, Models: []string{"m"}}},
		Health:  HealthConfig{HealthyThreshold: 2, UnhealthyThreshold: 3},
	}
	p, _ := newTestPool(t, cfg)
	w := modelWorkers(t, p, "m")[0]
	ctx := context.Background()
	steps := []struct {
		ok      bool
		healthy bool
	}{
		{ok: true, healthy: true},   // first check decides: up
		{ok: false, healthy: true},  // 1 failure of 3
		{ok: false, healthy: true},  // 2 of 3
		{ok: true, healthy: true},   // a pass resets the count
		{ok: false, healthy: true},  // 1 of 3
		{ok: false, healthy: true},  // 2 of 3
		{ok: false, healthy: false}, // 3 of 3: down
		{ok: true, healthy: false},  // 1 pass of 2
		{ok: true, healthy: true},   // 2 of 2: up
	}
	for i, s := range steps {
		srv.ok.Store(s.ok)
		p.check(ctx, w)
		if got := w.Healthy(); got != s.healthy {
			t.Fatalf("step %d (server ok=%v): got healthy=%v, want %v", i, s.ok, got, s.healthy)
		}
	}
}

func TestHealthFirstFailedCheckDecides(t *testing.T) {
	srv := newHealthServer(t)
	srv.ok.Store(false)
	p, _ := newTestPool(t, Config{Workers: []WorkerSpec{{ID: "a", URL: srv.URL, Models: []string{"m"}}}})
	w := modelWorkers(t, p, "m")[0]
	if !w.Healthy() {
		t.Fatalf("before any check: got unhealthy, want healthy")
	}
	p.check(context.Background(), w)
	if w.Healthy() {
		t.Errorf("after a first failed check: got healthy, want unhealthy at once")
	}
}

func TestHealthUnreachableWorker(t *testing.T) {
	srv := newHealthServer(t)
	url := srv.URL
	srv.Close()
	p, _ := newTestPool(t, Config{Workers: []WorkerSpec{{ID: "a", URL: url, Models: []string{"m"}}}})
	w := modelWorkers(t, p, "m")[0]
	p.check(context.Background(), w)
	if w.Healthy() {
		t.Errorf("closed server: got healthy, want unhealthy")
	}
}

func TestRunChecksAndStops(t *testing.T) {
	up := newHealthServer(t)
	down := newHealthServer(t)
	down.ok.Store(false)
	cfg := Config{
		Workers: []WorkerSpec{
			{ID: "up", URL: up.URL, Models: []string{"m"}},
			{ID: "down", URL: down.URL, Models: []string{"m"}},
		},
		Health: HealthConfig{Interval: 20 * time.Millisecond, Timeout: 20 * time.Millisecond},
	}
	sent := &sentCounter{}
	p, err := NewPool(cfg, Options{Client: sent.client(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	// A check of "up" that a busy machine slows past the timeout fails, and the next ones bring
	// it back: the states are asserted once both settled, with a bound only on a hang.
	ws := modelWorkers(t, p, "m")
	deadline := time.Now().Add(10 * time.Second)
	for up.hits.Load() < 3 || down.hits.Load() < 3 || !ws[0].Healthy() || ws[1].Healthy() {
		if time.Now().After(deadline) {
			t.Fatalf("after %d and %d checks in 10s: got up healthy=%v, down healthy=%v; want true, false", up.hits.Load(), down.hits.Load(), ws[0].Healthy(), ws[1].Healthy())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// Counted where the pool starts them, not where the servers receive them: a check sent just
	// before Run returned may reach its server any time later on a loaded machine.
	before := sent.all()
	time.Sleep(200 * time.Millisecond) // checks every 20 ms would start about twenty
	if got := sent.all(); got != before {
		t.Errorf("requests started after Run returned: got %d, want 0", got-before)
	}
}

// sentCounter counts the requests a pool starts, and those it sends to each host with a live
// context: a request whose context ended before it was sent is refused by the transport and
// never leaves.
type sentCounter struct {
	mu      sync.Mutex // guards the fields below
	started int
	sent    map[string]int
}

func (c *sentCounter) client() *http.Client {
	return &http.Client{Transport: c}
}

func (c *sentCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	c.started++
	if req.Context().Err() == nil {
		if c.sent == nil {
			c.sent = map[string]int{}
		}
		c.sent[req.URL.Host]++
	}
	c.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// to is the number of requests sent to host so far.
func (c *sentCounter) to(host string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent[host]
}

// all is the number of requests started so far, sent or not.
func (c *sentCounter) all() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started
}

func TestNewPoolErrors(t *testing.T) {
	if _, err := NewPool(Config{Workers: []WorkerSpec{{ID: "a", URL: "x", Models: []string{"m"}}}}, Options{}); err == nil || !strings.Contains(err.Error(), "routing.workers[0].url:") {
		t.Errorf("bad config: got %v, want an error naming routing.workers[0].url", err)
	}
	_, reg := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	if _, err := NewPool(Config{}, Options{Registerer: reg}); err == nil {
		t.Errorf("second pool on one registry: got no error, want a registration error")
	}
}

// Shortfalls says what each worker a request may wait for lacks for it, in requests and in
// tokens by the room test Pick applies, and leaves out a worker the request may not use.
func TestShortfalls(t *testing.T) {
	specs := testWorkers(3, "m")
	for i := range specs {
		specs[i].MaxConcurrency, specs[i].MaxTokensInFlight = 2, 1000
	}
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: specs})
	ctx := context.Background()
	// w0: two requests of 300 tokens (full); w1: one of 800 (tokens short); w2 excluded.
	for _, pick := range []struct {
		worker string
		tokens int
	}{{"w0", 300}, {"w0", 300}, {"w1", 800}} {
		if _, err := p.Pick(ctx, &Request{Model: "m", Tokens: pick.tokens, TargetWorker: pick.worker}); err != nil {
			t.Fatal(err)
		}
	}
	r := &Request{Model: "m", Tokens: 400, Exclude: []string{"w2"}}
	if _, err := p.Pick(ctx, r); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("pick: got %v, want ErrNoRoom", err)
	}
	got := map[string]Shortfall{}
	for _, s := range p.Shortfalls(r) {
		got[s.Worker.ID()] = s
	}
	want := map[string][3]int64{"w0": {1, 0, 2}, "w1": {0, 200, 1}}
	if len(got) != len(want) {
		t.Fatalf("shortfalls on %v, want on w0 and w1 only", slices.Collect(maps.Keys(got)))
	}
	for id, w := range want {
		if s := got[id]; [3]int64{s.Requests, s.Tokens, s.InFlight} != w {
			t.Errorf("%s: requests, tokens, in flight short %d, %d, %d; want %v", id, s.Requests, s.Tokens, s.InFlight, w)
		}
	}
	if s := p.Shortfalls(&Request{Model: "m", Tokens: 100, Exclude: []string{"w0"}}); len(s) != 2 ||
		s[0].Requests+s[0].Tokens+s[1].Requests+s[1].Tokens != 0 {
		t.Errorf("a request with room on w1 and w2: shortfalls %+v, want none short", s)
	}
	// An idle worker takes a request of any size.
	if s := p.Shortfalls(&Request{Model: "m", Tokens: 5000, TargetWorker: "w2"}); len(s) != 1 || s[0] != (Shortfall{Worker: s[0].Worker}) {
		t.Errorf("a request over the token cap, the idle w2: shortfalls %+v, want none short", s)
	}
}

// A worker held for interactive requests takes no standard or batch request until the hold
// ends, and interactive ones all the while.
func TestHoldForInteractive(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(2, "m")})
	ctx := context.Background()
	held := p.snap.Load().models["m"].workers[0]
	if held.ID() != "w0" {
		t.Fatalf("first worker %s, want w0", held.ID())
	}
	stop := held.HoldForInteractive()
	again := held.HoldForInteractive()
	for i := range 4 {
		l, err := p.Pick(ctx, &Request{Model: "m"})
		if err != nil || l.Worker.ID() != "w1" {
			t.Fatalf("batch pick %d beside the held w0: %v on %v, want w1", i, err, l)
		}
	}
	if _, err := p.Pick(ctx, &Request{Model: "m", TargetWorker: "w0"}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("batch pick sent to the held w0: got %v, want ErrNoRoom", err)
	}
	if l, err := p.Pick(ctx, &Request{Model: "m", Interactive: true, TargetWorker: "w0"}); err != nil || l.Worker.ID() != "w0" {
		t.Fatalf("interactive pick on the held w0: %v", err)
	}
	stop()
	if _, err := p.Pick(ctx, &Request{Model: "m", TargetWorker: "w0"}); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("batch pick while one of two holds stays: got %v, want ErrNoRoom", err)
	}
	again()
	if l, err := p.Pick(ctx, &Request{Model: "m", TargetWorker: "w0"}); err != nil || l.Worker.ID() != "w0" {
		t.Fatalf("batch pick on w0 once its holds ended: %v", err)
	}
}
