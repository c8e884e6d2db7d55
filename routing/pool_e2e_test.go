package routing

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine is a worker with /health and vLLM-style /metrics whose health and queue the test sets.
type fakeEngine struct {
	*httptest.Server
	healthy atomic.Bool
	waiting atomic.Int64
}

func newFakeEngine(t *testing.T) *fakeEngine {
	e := &fakeEngine{}
	e.healthy.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		if !e.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"m\"} 1\nvllm:num_requests_waiting{model_name=\"m\"} %d\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\n", e.waiting.Load())
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

// waitFor polls cond every few milliseconds for up to five seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPoolAgainstLiveWorkers(t *testing.T) {
	engines := []*fakeEngine{newFakeEngine(t), newFakeEngine(t), newFakeEngine(t)}
	var specs []WorkerSpec
	for i, e := range engines[:2] {
		specs = append(specs, WorkerSpec{ID: fmt.Sprint("e", i), URL: e.URL, Models: []string{"m"}})
	}
	cfg := Config{
		Policy:  "power_of_two",
		Workers: specs,
		// Checks and readings must not fail by the machine's load alone: a healthy engine gets
		// 200 ms to answer its check, and a reading stays fresh for the whole test (an engine
		// turned unhealthy answers 503 at once).
		Health: HealthConfig{Interval: 200 * time.Millisecond, Timeout: 200 * time.Millisecond, HealthyThreshold: 1, UnhealthyThreshold: 1},
		Scrape: ScrapeConfig{Interval: 10 * time.Millisecond, MaxAge: time.Minute},
	}
	p, _ := newTestPool(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	// The worker reporting a long queue loses every power-of-two comparison.
	engines[0].waiting.Store(40)
	waitFor(t, "both scraped", func() bool {
		ws := p.Workers()
		return ws[0].Load.Waiting == 40 && !ws[1].Load.At.IsZero()
	})
	if got := pickIDs(t, p, "m", 20); got["e1"] != 20 {
		t.Errorf("e0 reports 40 waiting: got %v, want all on e1", got)
	}

	// e1 fails its health check: everything goes to e0 despite its queue.
	engines[1].healthy.Store(false)
	waitFor(t, "e1 unhealthy", func() bool { st, _ := p.Worker("e1"); return st.State == StateUnhealthy })
	if got := pickIDs(t, p, "m", 10); got["e0"] != 10 {
		t.Errorf("e1 unhealthy: got %v, want all on e0", got)
	}

	// A worker added at run time is checked, scraped and picked.
	if err := p.Add(WorkerSpec{ID: "e2", URL: engines[2].URL, Models: []string{"m"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "e2 scraped", func() bool { st, _ := p.Worker("e2"); return !st.Load.At.IsZero() })
	if got := pickIDs(t, p, "m", 10); got["e2"] != 10 {
		t.Errorf("e2 idle, e0 queued, e1 down: got %v, want all on e2", got)
	}

	// e1 recovers; e2 drains.
	engines[1].healthy.Store(true)
	waitFor(t, "e1 healthy", func() bool { st, _ := p.Worker("e1"); return st.State == StateHealthy })
	if err := p.Drain(ctx, "e2"); err != nil {
		t.Fatal(err)
	}
	if got := pickIDs(t, p, "m", 10); got["e1"] != 10 {
		t.Errorf("e2 draining, e1 back: got %v, want all on e1", got)
	}
	if !p.Ready() {
		t.Errorf("Ready: got false, want true")
	}
}
