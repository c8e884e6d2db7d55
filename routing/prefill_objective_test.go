package routing

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestInteractiveObjective(t *testing.T) {
	for _, tt := range []struct{ idle, want time.Duration }{
		{400 * time.Millisecond, 600 * time.Millisecond},
		{time.Millisecond, MinTTFTObjective},
		{-time.Second, MinTTFTObjective},
	} {
		if got := InteractiveObjective(tt.idle); got != tt.want {
			t.Errorf("InteractiveObjective(%v): got %v, want %v", tt.idle, got, tt.want)
		}
	}
}

// While interactive requests are present, a worker takes lower-class prompts into prefill as
// long as the next interactive prompt is predicted its first token within the default objective
// beside them: how many tokens that is follows from what the worker has learnt, not a count.
// Before it has learnt, the fixed budget holds; with nothing lower in prefill, anything goes.
func TestLowerPrefillAdmittedWithinTheInteractiveObjective(t *testing.T) {
	now := time.Unix(0, 0)
	w := newCostWorker(func() time.Time { return now })
	const budget, interactivePrompt = 512, 200

	// Not learnt: the budget.
	w.prefill.start(400)
	w.promptsInPrefill.Store(400)
	if !w.admitsLowerPrefill(100, budget, interactivePrompt) || w.admitsLowerPrefill(200, budget, interactivePrompt) {
		t.Errorf("before the model has learnt: want 400+100 tokens within the budget of %d, 400+200 not", budget)
	}

	// The law of the tests (steps): an interactive prompt of 200 tokens takes 35 ms idle, so its
	// objective is the 50 ms floor, and each 1,000 prompt tokens in prefill beside it add 60 ms:
	// about 250 tokens of lower-class prefill keep it, with nothing else running.
	rng := rand.New(rand.NewPCG(5, 6))
	for range 400 {
		pl := randomPlacement(rng)
		w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.01))
	}
	w.prefill.done(400)
	w.promptsInPrefill.Store(0)
	tests := []struct {
		name     string
		lower    int64 // lower-class prompt tokens in prefill already
		inFlight int64
		tokens   int64
		want     bool
	}{
		{"nothing lower in prefill: anything", 0, 0, 5000, true},
		{"a little beside a little", 100, 1, 100, true},
		{"past what the objective allows", 100, 1, 400, false},
		{"a busy worker takes less", 100, 20, 100, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w.prefill.tokens.Store(tt.lower)
			w.promptsInPrefill.Store(tt.lower)
			w.inFlight.Store(tt.inFlight)
			if got := w.admitsLowerPrefill(tt.tokens, budget, interactivePrompt); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}

	// A faster engine (a tenth of the prefill cost) takes more than the fixed budget at once.
	fast := newCostWorker(func() time.Time { return now })
	law := steps
	law.perKToken, law.perKPrefilling = steps.perKToken/10, steps.perKPrefilling/10
	for range 400 {
		pl := randomPlacement(rng)
		fast.cost.observe(pl, pl.running, law.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.01))
	}
	fast.prefill.tokens.Store(300)
	fast.promptsInPrefill.Store(300)
	fast.inFlight.Store(1)
	if !fast.admitsLowerPrefill(1000, budget, interactivePrompt) {
		t.Error("a fast engine: got 300+1,000 lower-class tokens refused, want them admitted past the fixed budget")
	}
}
