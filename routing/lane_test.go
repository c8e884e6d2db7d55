package routing

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"
)

// The prefill line is learned from answers: a least-squares line of time to first token over
// prompt tokens; with prompts all of one size, a line through the origin.
func TestPrefillClockLearnsTheCostOfAPrompt(t *testing.T) {
	var c prefillClock
	c.observe(200, 30*time.Millisecond)
	c.observe(400, 50*time.Millisecond)
	c.mu.Lock()
	_, ok := c.costLocked(500)
	c.mu.Unlock()
	if ok {
		t.Fatal("a cost after two answers, want none before minPrefillSamples")
	}
	for range 20 {
		c.observe(200, 30*time.Millisecond)
		c.observe(400, 50*time.Millisecond)
		c.observe(600, 70*time.Millisecond)
	}
	c.mu.Lock()
	got, ok := c.costLocked(500)
	c.mu.Unlock()
	if want := 60 * time.Millisecond; !ok || got < want-time.Millisecond || got > want+time.Millisecond {
		t.Errorf("cost of 500 tokens on the line 10ms + 0.1ms a token: %v (%v), want %v", got, ok, want)
	}

	var same prefillClock
	for range 5 {
		same.observe(400, 40*time.Millisecond)
	}
	same.mu.Lock()
	got, ok = same.costLocked(800)
	same.mu.Unlock()
	if want := 80 * time.Millisecond; !ok || got < want-time.Millisecond || got > want+time.Millisecond {
		t.Errorf("cost of 800 tokens after prompts of 400 only: %v (%v), want %v", got, ok, want)
	}
}

// While interactive requests are present, one of two workers stays clear of standard and batch
// prefill (or within ClearWithin of its end), and interactive requests go to the clear one.
func TestLaneKeepsAWorkerClearForInteractive(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	// Prompts go whole (pieces off): the lane is what is tested.
	p, err := NewPool(Config{Workers: testWorkers(2, "m"), Concurrency: ConcurrencyConfig{ClearWithin: 30 * time.Millisecond, PrefillPieceTokens: -1}},
		Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	k := picker{t, p, "m"}
	batch := Request{PromptTokens: 500, Tokens: 510}
	// Both workers have learnt that a prefill costs 10ms + 0.1ms a token.
	for _, id := range []string{"w0", "w1"} {
		w, _ := p.find(id)
		for range 10 {
			w.prefill.observe(200, 30*time.Millisecond)
			w.prefill.observe(600, 70*time.Millisecond)
		}
	}

	k.pick("an interactive request", Request{Interactive: true, PromptTokens: 50}).Release(Outcome{TTFT: time.Millisecond})
	b1 := k.pick("a batch prompt: both workers clear", batch)
	other := "w1"
	if b1.Worker.ID() == "w1" {
		other = "w0"
	}
	k.refused("a second batch prompt: the other worker is the only clear one", batch)
	if rem := b1.Worker.prefill.remaining(now); rem < 59*time.Millisecond || rem > 61*time.Millisecond {
		t.Errorf("the first prompt's prefill is expected to last %v, want 60ms", rem)
	}

	room := make(chan string, 1)
	p.OnRoom(func(model string) {
		select {
		case room <- model:
		default:
		}
	})
	now = now.Add(35 * time.Millisecond) // 25ms left: within ClearWithin (30ms)
	select {
	case <-room:
	case <-time.After(5 * time.Second):
		t.Fatal("OnRoom's function was not told when the first prefill came within ClearWithin of its end")
	}
	p.OnRoom(nil)
	b2 := k.pick("a second batch prompt once the first is within ClearWithin of its end", batch)
	if b2.Worker.ID() != other {
		t.Errorf("the second batch prompt went to %s, want %s", b2.Worker.ID(), other)
	}
	i := k.pick("an interactive request beside two prefills", Request{Interactive: true, PromptTokens: 50})
	if i.Worker != b1.Worker {
		t.Errorf("the interactive request went to %s, whose prefill has 60ms left; want %s, with 25ms", i.Worker.ID(), b1.Worker.ID())
	}
	i.Prefilled()
	b1.Prefilled()
	if rem := b1.Worker.prefill.remaining(now); rem != 0 {
		t.Errorf("after its first token, the prefill is expected to last %v, want 0", rem)
	}
	for _, l := range []*Lease{b1, b2, i} {
		l.Release(Outcome{})
	}
}

// A worker that has not yet answered enough to know its prefill cost counts as busy until the
// first token comes back; one worker alone is never held back, nor any by default (the lane off).
func TestLaneWithoutALearntCostOrASecondWorker(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	on := Config{Workers: testWorkers(2, "m"), Concurrency: ConcurrencyConfig{ClearWithin: 30 * time.Millisecond}}
	p, err := NewPool(on, Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := func(interactive bool) *Request {
		return &Request{Model: "m", Interactive: interactive, PromptTokens: 500, Tokens: 510}
	}
	l, err := p.Pick(ctx, r(true))
	if err != nil {
		t.Fatal(err)
	}
	l.Release(Outcome{})
	b1, err := p.Pick(ctx, r(false))
	if err != nil {
		t.Fatal(err)
	}
	if rem := b1.Worker.prefill.remaining(now.Add(time.Hour)); rem != math.MaxInt64 {
		t.Errorf("a prefill of unknown cost is expected to last %v an hour on, want for ever", rem)
	}
	if l, err := p.Pick(ctx, r(false)); err == nil {
		t.Errorf("a second batch prompt beside a prefill of unknown cost went to %s, want refused", l.Worker.ID())
	}
	b1.Prefilled()
	b2, err := p.Pick(ctx, r(false))
	if err != nil {
		t.Fatalf("a batch prompt once the first one's first token came: %v", err)
	}
	b1.Release(Outcome{})
	b2.Release(Outcome{})

	on.Workers = testWorkers(1, "m")
	one, err := NewPool(on, Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := one.Pick(ctx, r(true)); err != nil {
		t.Fatal(err)
	} else {
		l.Release(Outcome{})
	}
	lone, err := one.Pick(ctx, r(false))
	if err != nil {
		t.Fatalf("one worker alone, interactive present: a batch prompt refused (%v), want sent", err)
	}
	lone.Release(Outcome{})

	off, err := NewPool(Config{Workers: testWorkers(2, "m")}, Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := off.Pick(ctx, r(true)); err != nil {
		t.Fatal(err)
	} else {
		l.Release(Outcome{})
	}
	var leases []*Lease
	for i := range 2 {
		l, err := off.Pick(ctx, r(false))
		if err != nil {
			t.Fatalf("by default, interactive present: batch prompt %d refused (%v), want one on each worker", i, err)
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// askOnce is a test policy that, like kv_aware, keeps what it learnt of a request (its token
// ids) on the Request for the request's retries, and counts how often it had to learn it.
type askOnce struct{ asked atomic.Int32 }

func (a *askOnce) Pick(_ context.Context, r *Request, workers []*Worker) (*Worker, Route) {
	if r.kvTokens == nil {
		a.asked.Add(1)
		ids := []uint64{1, 2, 3}
		r.kvTokens = &ids
	}
	for _, w := range workers {
		if r.Eligible(w) {
			return w, RouteLeastRequest
		}
	}
	return nil, RouteLeastRequest
}

func init() {
	registerPolicy("test_ask_once", func(policyEnv) (Policy, error) { return &askOnce{}, nil })
}

// While interactive requests are present Pick works on a copy of a batch request; what the
// policy kept on it reaches the caller's, so a retry of the same request does not ask again.
func TestPickKeepsWhatThePolicyLearntOfTheRequest(t *testing.T) {
	p, err := NewPool(Config{Workers: testWorkers(2, "m"), Policy: "test_ask_once"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if l, err := p.Pick(ctx, &Request{Model: "m", Interactive: true, PromptTokens: 10, Tokens: 20}); err != nil {
		t.Fatal(err)
	} else {
		l.Release(Outcome{})
	}
	r := &Request{Model: "m", PromptTokens: 10, Tokens: 20}
	for range 2 {
		l, err := p.Pick(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(Outcome{})
	}
	p.mu.Lock()
	policy := p.policies["m"].Policy.(*askOnce)
	p.mu.Unlock()
	if got := policy.asked.Load(); got != 2 { // the interactive request, and the batch one once

		t.Errorf("the policy learnt the requests %d times, want 2: the batch request's two picks asked once", got)
	}
}
