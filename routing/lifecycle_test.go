package routing

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/test/redistest"
)

// fakeClock is a settable clock for tests; safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func pickIDs(t *testing.T, p *Pool, model string, n int) map[string]int {
	t.Helper()
	got := map[string]int{}
	for range n {
		l, err := p.Pick(context.Background(), &Request{Model: model})
		if err != nil {
			got[""]++
			continue
		}
		got[l.Worker.ID()]++
		l.Release(Outcome{})
	}
	return got
}

func TestAddAndRemove(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(1, "m")})
	if err := p.Add(WorkerSpec{ID: "x", URL: "http://127.0.0.1:7", Models: []string{"m", "fresh"}}); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got := pickIDs(t, p, "m", 4); got["w0"] != 2 || got["x"] != 2 {
		t.Errorf("picks after Add: got %v, want w0 and x twice each", got)
	}
	if !p.Serves("fresh") {
		t.Errorf("Serves(fresh) after Add: got false, want true")
	}
	if err := p.Add(WorkerSpec{ID: "x", URL: "http://127.0.0.1:8", Models: []string{"m"}}); !errors.Is(err, ErrWorkerExists) {
		t.Errorf("Add of a duplicate id: got %v, want ErrWorkerExists", err)
	}
	if err := p.Add(WorkerSpec{ID: "y", URL: "nope", Models: []string{"m"}}); err == nil || !strings.Contains(err.Error(), "worker.url:") {
		t.Errorf("Add of a bad url: got %v, want an error naming worker.url", err)
	}
	l, err := p.Pick(context.Background(), &Request{Model: "fresh"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Remove("x"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	l.Release(Outcome{}) // a lease on a removed worker still releases
	if got := pickIDs(t, p, "m", 3); got["w0"] != 3 {
		t.Errorf("picks after Remove: got %v, want only w0", got)
	}
	if p.Serves("fresh") {
		t.Errorf("Serves(fresh) after its only worker left: got true, want false")
	}
	if _, err := p.Pick(context.Background(), &Request{Model: "fresh"}); !errors.Is(err, ErrUnknownModel) {
		t.Errorf("Pick of a model without workers: got %v, want ErrUnknownModel", err)
	}
	if err := p.Remove("x"); !errors.Is(err, ErrUnknownWorker) {
		t.Errorf("second Remove: got %v, want ErrUnknownWorker", err)
	}
	if got := len(p.Workers()); got != 1 {
		t.Errorf("Workers after Remove: got %d, want 1", got)
	}
}

func TestDrain(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(2, "m")})
	l, err := p.Pick(context.Background(), &Request{Model: "m", TargetWorker: "w0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Drain(context.Background(), "w0"); err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if got := pickIDs(t, p, "m", 4); got["w1"] != 4 {
		t.Errorf("picks while w0 drains: got %v, want only w1", got)
	}
	if st, _ := p.Worker("w0"); st.State != StateDraining || st.InFlight != 1 {
		t.Errorf("draining with one in flight: got %s with %d, want %s with 1", st.State, st.InFlight, StateDraining)
	}
	l.Release(Outcome{})
	if st, _ := p.Worker("w0"); st.State != StateDrained {
		t.Errorf("after the last release: got %s, want %s", st.State, StateDrained)
	}
	if err := p.Undrain(context.Background(), "w0"); err != nil {
		t.Fatalf("Undrain: %v", err)
	}
	if got := pickIDs(t, p, "m", 4); got["w0"] != 2 {
		t.Errorf("picks after Undrain: got %v, want w0 twice", got)
	}
	for _, err := range []error{p.Drain(context.Background(), "nope"), p.Undrain(context.Background(), "nope")} {
		if !errors.Is(err, ErrUnknownWorker) {
			t.Errorf("unknown worker: got %v, want ErrUnknownWorker", err)
		}
	}
}

// breakerPool is a pool of one worker, w0 of model m, whose circuit opens after 3 failures for
// 10 s of clock; finish picks it for r and releases the lease with an outcome; state is w0's.
func breakerPool(t *testing.T) (p *Pool, clock *fakeClock, r *Request, finish func(Outcome) *Worker, state func() WorkerState) {
	t.Helper()
	clock = newFakeClock()
	cfg := Config{Workers: testWorkers(1, "m"), Breaker: BreakerConfig{Failures: 3, Cooldown: 10 * time.Second}}
	cfg.SetDefaults()
	p, err := NewPool(cfg, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	r = &Request{Model: "m"}
	finish = func(o Outcome) *Worker {
		t.Helper()
		l, err := p.Pick(context.Background(), r)
		if err != nil {
			t.Fatalf("Pick: got %v, want a lease", err)
		}
		l.Release(o)
		return l.Worker
	}
	state = func() WorkerState { st, _ := p.Worker("w0"); return st.State }
	return p, clock, r, finish, state
}

func TestCircuitBreaker(t *testing.T) {
	p, clock, r, release, state := breakerPool(t)
	ctx := context.Background()
	finish := func(failed bool) { t.Helper(); release(Outcome{Failed: failed}) }

	finish(true)
	finish(true)
	finish(false) // a success resets the count
	finish(true)
	finish(true)
	if got := state(); got != StateHealthy {
		t.Fatalf("after 2 consecutive failures of 3: got %s, want healthy", got)
	}
	finish(true)
	if got := state(); got != StateCircuitOpen {
		t.Fatalf("after 3 consecutive failures: got %s, want %s", got, StateCircuitOpen)
	}
	if _, err := p.Pick(ctx, r); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("open circuit: got %v, want ErrNoWorker", err)
	}
	clock.Advance(10 * time.Second)
	probe, err := p.Pick(ctx, r)
	if err != nil {
		t.Fatalf("after the cool-down: got %v, want the half-open probe", err)
	}
	if _, err := p.Pick(ctx, r); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("second request while the probe is in flight: got %v, want ErrNoWorker", err)
	}
	probe.Release(Outcome{Failed: true})
	if got := state(); got != StateCircuitOpen {
		t.Fatalf("after a failed probe: got %s, want %s", got, StateCircuitOpen)
	}
	clock.Advance(9 * time.Second)
	if _, err := p.Pick(ctx, r); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("within the new cool-down: got %v, want ErrNoWorker", err)
	}
	clock.Advance(time.Second)
	finish(false)
	if got := state(); got != StateHealthy {
		t.Fatalf("after a successful probe: got %s, want healthy", got)
	}
	finish(false)
}

// A suspect answer (a 5xx the request may have caused) does not move the circuit breaker, neither
// as a failure nor as a success, until the gateway confirms it; the half-open probe's counts at
// once.
func TestSuspectAnswersOpenTheCircuitOnlyOnceConfirmed(t *testing.T) {
	p, clock, _, finish, state := breakerPool(t)

	for range 10 {
		finish(Outcome{Suspect: true})
	}
	if got := state(); got != StateHealthy {
		t.Fatalf("after 10 unconfirmed suspect answers: got %s, want healthy", got)
	}
	finish(Outcome{Failed: true})
	w := finish(Outcome{Suspect: true}) // not a success: the count of failures stays
	finish(Outcome{Failed: true})
	if got := state(); got != StateHealthy {
		t.Fatalf("after 2 failures and a suspect answer: got %s, want healthy", got)
	}
	p.ConfirmFailure(w)
	if got := state(); got != StateCircuitOpen {
		t.Fatalf("after the suspect answer was confirmed, 3 failures: got %s, want %s", got, StateCircuitOpen)
	}
	clock.Advance(10 * time.Second)
	finish(Outcome{Suspect: true}) // the probe
	if got := state(); got != StateCircuitOpen {
		t.Fatalf("after the probe's suspect answer: got %s, want %s", got, StateCircuitOpen)
	}
}

func TestRunWatchesAddedWorkers(t *testing.T) {
	srv := newHealthServer(t)
	srv.ok.Store(false)
	sent := &sentCounter{}
	p, err := NewPool(Config{Health: HealthConfig{Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond}},
		Options{Client: sent.client(), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if err := p.Add(WorkerSpec{ID: "late", URL: srv.URL, Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _ := p.Worker("late"); st.State == StateUnhealthy {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("added worker never checked: want unhealthy within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := p.Remove("late"); err != nil {
		t.Fatal(err)
	}
	// Counted where the pool sends them: a check under way when Remove returned was sent
	// before, and one the pool starts later finds its context ended and never leaves.
	host := strings.TrimPrefix(srv.URL, "http://")
	before := sent.to(host)
	time.Sleep(100 * time.Millisecond) // checks every 10 ms would send about ten
	if got := sent.to(host); got != before {
		t.Errorf("checks sent after Remove: got %d more, want 0", got-before)
	}
}

func TestDrainSharedThroughRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	newGateway := func() *Pool {
		store := NewRedisStore(newRedisClient(t, srv), 0)
		p, err := NewPool(Config{Workers: testWorkers(2, "m")}, Options{Pins: store, Drains: store})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := newGateway(), newGateway()
	state := func(p *Pool, id string) WorkerState { st, _ := p.Worker(id); return st.State }

	if err := a.Drain(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	if got := state(b, "w1"); got != StateHealthy {
		t.Fatalf("b before it syncs: got %s, want healthy", got)
	}
	b.syncDrains(ctx)
	if got := state(b, "w1"); got != StateDrained {
		t.Errorf("b after a drained w1: got %s, want %s", got, StateDrained)
	}
	if err := b.Undrain(ctx, "w1"); err != nil {
		t.Fatal(err)
	}
	a.syncDrains(ctx)
	if got := state(a, "w1"); got != StateHealthy {
		t.Errorf("a after b undrained w1: got %s, want healthy", got)
	}

	srv.Stop()
	if err := a.Drain(ctx, "w0"); err == nil {
		t.Errorf("Drain without Redis: got no error, want one")
	}
	if got := state(a, "w0"); got != StateHealthy {
		t.Errorf("after a failed Drain: got %s, want healthy (unchanged)", got)
	}
	a.syncDrains(ctx) // fails and keeps the state
	if got := state(a, "w0"); got != StateHealthy {
		t.Errorf("after a failed sync: got %s, want healthy", got)
	}
}

func TestRetireRemovesOnceEmpty(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(2, "m")})
	held, err := p.Pick(context.Background(), &Request{Model: "m", TargetWorker: "w1"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Retire("w1"); err != nil {
		t.Fatalf("Retire: %v", err)
	}
	if got := pickIDs(t, p, "m", 4); got["w0"] != 4 {
		t.Fatalf("picks while w1 retires: got %v, want w0 4 times", got)
	}
	p.removeRetired(context.Background())
	if st, err := p.Worker("w1"); err != nil || st.State != StateDraining {
		t.Fatalf("w1 with a request in flight: got %v, %v; want still there, draining", st.State, err)
	}
	held.Release(Outcome{})
	p.removeRetired(context.Background())
	if _, err := p.Worker("w1"); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("w1 after its last request: got %v, want ErrUnknownWorker", err)
	}
	if err := p.Retire("w1"); !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("Retire of a removed worker: got %v, want ErrUnknownWorker", err)
	}
}

func TestRetiringIgnoresSharedUndrain(t *testing.T) {
	rs := redistest.Start(t)
	store := NewRedisStore(newRedisClient(t, rs), 0)
	p, err := NewPool(Config{Workers: testWorkers(1, "m")}, Options{Drains: store})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Retire("w0"); err != nil {
		t.Fatal(err)
	}
	p.syncDrains(context.Background())
	if st, _ := p.Worker("w0"); st.State != StateDrained {
		t.Fatalf("retiring worker after a drain sync that lists it not: got %s, want drained", st.State)
	}
}

func TestReplaceKeepsLeasesAndDrainState(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(2, "m")})
	old, err := p.Pick(context.Background(), &Request{Model: "m", TargetWorker: "w0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Drain(context.Background(), "w1"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		spec    WorkerSpec
		wantErr error
		wantMsg string
	}{
		{"new url and model", WorkerSpec{ID: "w0", URL: "http://127.0.0.1:9", Models: []string{"m", "n"}, MaxConcurrency: 7}, nil, ""},
		{"drained worker", WorkerSpec{ID: "w1", URL: "http://127.0.0.1:10", Models: []string{"m"}}, nil, ""},
		{"unknown", WorkerSpec{ID: "zz", URL: "http://127.0.0.1:9", Models: []string{"m"}}, ErrUnknownWorker, ""},
		{"bad url", WorkerSpec{ID: "w0", URL: "ftp://x", Models: []string{"m"}}, nil, "worker.url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := p.Replace(tt.spec)
			switch {
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("got %v, want %v", err, tt.wantErr)
			case tt.wantMsg != "" && (err == nil || !strings.Contains(err.Error(), tt.wantMsg)):
				t.Fatalf("got %v, want an error naming %s", err, tt.wantMsg)
			case tt.wantErr == nil && tt.wantMsg == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			}
		})
	}
	w0, _ := p.Worker("w0")
	if w0.URL != "http://127.0.0.1:9" || w0.MaxConcurrency != 7 || w0.InFlight != 0 || !p.Serves("n") {
		t.Fatalf("w0 after Replace: got %+v, want the new spec with nothing in flight", w0)
	}
	if w1, _ := p.Worker("w1"); w1.State != StateDrained || w1.URL != "http://127.0.0.1:10" {
		t.Fatalf("w1 after Replace: got %s at %s, want drained at the new URL", w1.State, w1.URL)
	}
	old.Release(Outcome{})
	if old.Worker.InFlight() != 0 {
		t.Fatalf("old lease released: in flight %d, want 0", old.Worker.InFlight())
	}
}

func TestDrainRetireAndRemoveReleasePins(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "manual", Workers: testWorkers(4, "m")})
	ctx := context.Background()
	for key, worker := range map[string]string{"a": "w0", "b": "w0", "c": "w1", "d": "w2", "e": "w3"} {
		if err := p.Pin(ctx, "m", "t", key, worker, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	pinned := func(worker string) int {
		t.Helper()
		pins, err := p.Pins(ctx, PinFilter{Worker: worker})
		if err != nil {
			t.Fatal(err)
		}
		return len(pins)
	}
	steps := []struct {
		name   string
		worker string
		do     func() error
	}{
		{"drain", "w0", func() error { return p.Drain(ctx, "w0") }},
		{"retire", "w1", func() error { return p.Retire("w1") }},
		{"remove", "w2", func() error { return p.Remove("w2") }},
	}
	for _, st := range steps {
		if err := st.do(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got := pinned(st.worker); got != 0 {
			t.Errorf("pins of %s after %s: got %d, want 0", st.worker, st.name, got)
		}
	}
	if got := pinned("w3"); got != 1 {
		t.Errorf("pins of the untouched w3: got %d, want 1", got)
	}
}

// brokenPins is a PinStore whose every call fails.
type brokenPins struct{ PinStore }

func (brokenPins) List(context.Context, PinFilter) ([]Pin, error) {
	return nil, errors.New("pin store down")
}

func TestDrainWithoutPinStoreStillDrains(t *testing.T) {
	p, err := NewPool(Config{Workers: testWorkers(2, "m")}, Options{Pins: brokenPins{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Drain(context.Background(), "w0"); err != nil {
		t.Fatalf("Drain with the pin store down: got %v, want nil (the pins move at their next request)", err)
	}
	if st, _ := p.Worker("w0"); st.State != StateDrained {
		t.Errorf("got %s, want drained", st.State)
	}
}
