package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// testWorkers returns n specs w0..w(n-1) serving model on unroutable URLs (no health checks run
// unless a test calls Run).
func testWorkers(n int, model string) []WorkerSpec {
	specs := make([]WorkerSpec, n)
	for i := range specs {
		specs[i] = WorkerSpec{ID: fmt.Sprintf("w%d", i), URL: fmt.Sprintf("http://127.0.0.1:%d", 1+i), Models: []string{model}}
	}
	return specs
}

// newTestPool builds a pool with a seeded random source and a private registry.
//
// The policies' tests are about choice, not limits: unless cfg says otherwise, a worker starts
// with its whole ceiling (routing.max_concurrency) as its limit instead of learning it.
func newTestPool(t testing.TB, cfg Config) (*Pool, *prometheus.Registry) {
	t.Helper()
	return newTestPoolWith(t, cfg, Options{})
}

// newTestPoolWith is newTestPool with opts, whose Registerer and Rand it sets.
func newTestPoolWith(t testing.TB, cfg Config, opts Options) (*Pool, *prometheus.Registry) {
	t.Helper()
	if cfg.Concurrency.Initial == 0 {
		cfg.Concurrency.Initial = max(cfg.MaxConcurrency, DefaultMaxConcurrency)
	}
	reg := prometheus.NewRegistry()
	opts.Registerer, opts.Rand = reg, rand.NewPCG(1, 2)
	p, err := NewPool(cfg, opts)
	if err != nil {
		t.Fatalf("NewPool: %v", err)
	}
	return p, reg
}

// modelWorkers is the snapshot a policy of model sees.
func modelWorkers(t testing.TB, p *Pool, model string) []*Worker {
	t.Helper()
	ms := p.snap.Load().models[model]
	if ms == nil {
		t.Fatalf("model %q has no workers", model)
	}
	return ms.workers
}

func markDown(w *Worker) { w.health.Store(int32(healthDown)) }

// picker picks model's requests from p, failing the test on an unexpected answer.
type picker struct {
	t     *testing.T
	p     *Pool
	model string
}

// pick is a lease for r, prepared and then picked, which must be picked.
func (k picker) pick(what string, r Request) *Lease {
	k.t.Helper()
	r.Model = k.model
	k.p.Prepare(context.Background(), &r)
	l, err := k.p.Pick(context.Background(), &r)
	if err != nil {
		k.t.Fatalf("%s: %v", what, err)
	}
	return l
}

// refused checks that r, prepared, is not picked (and releases what was).
func (k picker) refused(what string, r Request) {
	k.t.Helper()
	r.Model = k.model
	k.p.Prepare(context.Background(), &r)
	if l, err := k.p.Pick(context.Background(), &r); err == nil {
		l.Release(Outcome{})
		k.t.Errorf("%s: picked %s, want refused", what, l.Worker.ID())
	}
}

// wholePromptPool is a pool of one worker "w" of model "m" (10 requests at once) that sends
// prompts whole (pieces off), on the clock *now, and a picker for it.
func wholePromptPool(t *testing.T, now *time.Time) (*Pool, picker) {
	t.Helper()
	p, err := NewPool(Config{Workers: []WorkerSpec{{ID: "w", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: 10}},
		Concurrency: ConcurrencyConfig{PrefillPieceTokens: -1}},
		Options{Now: func() time.Time { return *now }})
	if err != nil {
		t.Fatal(err)
	}
	return p, picker{t, p, "m"}
}
