package routing

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// While interactive requests are being picked, each worker prefills one background prompt at a
// time, for as long as its learned prefill rate says that prompt takes.
func TestBackgroundPrefillIsOneAtATimePerWorkerWhileInteractiveIsPresent(t *testing.T) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	cfg := Config{Policy: "least_request", Workers: testWorkers(2, "m"), MaxConcurrency: 16}
	cfg.Concurrency.Initial = 16
	p, err := NewPool(cfg, Options{Now: now, Registerer: prometheus.NewRegistry(), Rand: rand.NewPCG(1, 2)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pick := func(r Request) (*Lease, error) { return p.Pick(ctx, &r) }
	batch := Request{Model: "m", PromptTokens: 1000, Background: true}

	// No rate learned yet, and no interactive traffic: no budget.
	for range 4 {
		if _, err := pick(batch); err != nil {
			t.Fatalf("before any rate is learned: %v", err)
		}
	}
	// Both workers learn 1,000 prompt tokens/s from streamed answers.
	for _, id := range []string{"w0", "w1"} {
		w, _ := p.find(id)
		w.prefill.observe(500, 500*time.Millisecond)
	}
	if _, err := pick(Request{Model: "m"}); err != nil { // interactive traffic is present
		t.Fatal(err)
	}
	first, err := pick(batch)
	if err != nil {
		t.Fatal(err)
	}
	second, err := pick(batch)
	if err != nil || second.Worker == first.Worker {
		t.Fatalf("second background prefill: %v on %v, want the other worker", err, second)
	}
	if _, err := pick(batch); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("third background prefill while both workers prefill one: %v, want ErrNoWorker", err)
	}
	if _, err := pick(Request{Model: "m"}); err != nil {
		t.Fatalf("an interactive request is never held by the budget: %v", err)
	}
	clock.Add(int64(time.Second))
	if _, err := pick(batch); err != nil {
		t.Fatalf("a second later, the first prefill is done: %v", err)
	}
	clock.Add(int64(interactiveWindow + time.Second))
	for range 3 {
		if _, err := pick(batch); err != nil {
			t.Fatalf("no interactive request for %v: no budget, got %v", interactiveWindow, err)
		}
	}
}

func TestPrefillRateIsLearnedFromStreamedAnswers(t *testing.T) {
	var c prefillClock
	if got := c.estimate(1000); got != 0 {
		t.Fatalf("before any answer: estimate %v, want 0", got)
	}
	c.observe(0, time.Second) // everything cached: nothing learned
	c.observe(2000, time.Second)
	if got := c.estimate(1000); got != 500*time.Millisecond {
		t.Fatalf("at 2,000 tokens/s: 1,000 tokens take %v, want 500ms", got)
	}
}
