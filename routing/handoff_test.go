package routing

import (
	"context"
	"testing"
	"time"
)

// handoffLaw is a decode worker's hand-off as the tests make it: 5 ms and 20 ms per thousand
// prompt tokens.
func handoffLaw(prompt int) time.Duration {
	return 5*time.Millisecond + time.Duration(prompt)*20*time.Millisecond/1000
}

// The hand-off model of a decode worker learns from the first events of the decode stages it
// served, as the gateway measures them (Outcome.Handoff), and predicts the next ones once it
// has learnt from 32; the prefill stages' answers, failed decodes and absurd times teach it
// nothing, and a lease predicts with the fit it was placed under.
func TestHandoffModelLearnsFromDecodeStages(t *testing.T) {
	// w0, w1 prefill; w2, w3 decode.
	p, _ := newTestPool(t, Config{Workers: disaggWorkers()[:4], Models: map[string]ModelConfig{
		"m": {Disaggregation: DisaggregationConfig{PrefillPolicy: "round_robin", DecodePolicy: "round_robin"}}}})
	ctx := context.Background()
	byID := map[string]*Worker{}
	for _, w := range p.snap.Load().models["m"].allWorkers() {
		byID[w.ID()] = w
	}
	prompts := []int{300, 1200, 4000, 800, 6000, 2500, 150}
	stages := func(n int, decodeOutcome func(prompt int) Outcome) {
		t.Helper()
		for i := range n {
			prompt := prompts[i%len(prompts)]
			pre, dec, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: prompt + 1, PromptTokens: prompt},
				&Request{Model: "m", Stage: StageDecode, Tokens: prompt + 50, PromptTokens: prompt})
			if err != nil {
				t.Fatal(err)
			}
			// The prefill's answer: its TTFT is the prefill's, no hand-off.
			pre.Release(Outcome{PromptTokens: prompt, CompletionTokens: 1, TTFT: 300 * time.Millisecond, Answered: 300 * time.Millisecond})
			dec.Release(decodeOutcome(prompt))
		}
	}
	answered := func(prompt int) Outcome {
		return Outcome{PromptTokens: prompt, CompletionTokens: 20, TTFT: handoffLaw(prompt), Handoff: handoffLaw(prompt),
			Answered: handoffLaw(prompt) + 19*10*time.Millisecond}
	}
	// Decodes that teach nothing: failed (two: the breaker stays closed), usage estimated,
	// absurd, unmeasured (a whole answer).
	n := 0
	stages(40*3, func(prompt int) Outcome {
		o := answered(prompt)
		switch n++; {
		case n <= 2:
			o.Failed = true
		case n%3 == 0:
			o.UsageEstimated = true
		case n%3 == 1:
			o.Handoff = 2 * maxCostDuration
		default:
			o.Handoff = 0
		}
		return o
	})
	for _, id := range []string{"w0", "w1", "w2", "w3"} {
		if d, ok := byID[id].PredictHandoffIdle(1000); ok {
			t.Fatalf("%s predicts a hand-off of %v from answers that teach nothing", id, d)
		}
	}
	stages(31*2, answered) // 31 decodes on each of w2 and w3
	if d, ok := byID["w2"].PredictHandoffIdle(1000); ok {
		t.Fatalf("w2 predicts %v after 31 decodes, want nothing before 32", d)
	}
	stages(30*2, answered)
	for _, id := range []string{"w2", "w3"} {
		for _, prompt := range []int{500, 3000, 5000} {
			got, ok := byID[id].PredictHandoffIdle(prompt)
			if want := handoffLaw(prompt); !ok || !within(got, want, 0.1) {
				t.Errorf("%s, prompt of %d: predicted %v (ok %v), want about %v", id, prompt, got, ok, want)
			}
		}
	}
	for _, id := range []string{"w0", "w1"} {
		if d, ok := byID[id].PredictHandoffIdle(1000); ok {
			t.Errorf("prefill worker %s predicts a hand-off of %v, want none: it served no decode", id, d)
		}
	}
	pre, dec, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 3001, PromptTokens: 3000},
		&Request{Model: "m", Stage: StageDecode, Tokens: 3050, PromptTokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	idle, _ := dec.Worker.PredictHandoffIdle(3000)
	if got, ok := dec.PredictedHandoff(3000); !ok || got != idle {
		t.Errorf("the decode lease, placed on an idle worker, predicted %v (ok %v), want the idle prediction %v", got, ok, idle)
	}
	if got, ok := pre.PredictedHandoff(3000); ok {
		t.Errorf("the prefill lease predicted a hand-off of %v, want none", got)
	}
	// The lease keeps the fit it was placed under, whatever its worker learns after.
	for range 40 {
		dec.Worker.handoff.observe(0, 3000, time.Second)
	}
	if got, _ := dec.PredictedHandoff(3000); got != idle {
		t.Errorf("after the worker learnt more, the lease predicted %v, want %v as when it was placed", got, idle)
	}
	pre.Release(Outcome{})
	dec.Release(Outcome{})
}

// The hand-off model costs no allocation to learn or to predict.
func TestHandoffModelAllocatesNothing(t *testing.T) {
	h := newHandoffModel()
	i := 0
	if n := testing.AllocsPerRun(100, func() {
		i++
		h.observe(float64(i%4), 100+i*37%5000, handoffLaw(100+i*37%5000))
		c := h.coefficients()
		_, _ = c.predict(2000, 1)
	}); n != 0 {
		t.Fatalf("%v allocations per observe and predict, want 0", n)
	}
}

// A decode stage's whole answer teaches its worker's TPOT with its first token where the
// hand-off model puts it, and nothing while that model cannot say: not where the TTFT law,
// learnt from the prompts the worker prefilled itself (interactive requests served whole there),
// puts a prompt of one uncached token. Else the decodes' answers, less that extrapolation, teach
// a TPOT below the worker's decode step, and the objectives judged against it.
func TestDecodeStageWholeAnswersTeachTPOTAfterTheHandoff(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: disaggWorkers()[:4]})
	ctx := context.Background()
	const step = 13 * time.Millisecond
	for i := range 200 {
		if i%5 == 0 {
			// An interactive request served whole: TTFT 40 ms + 100 µs per prompt token.
			prompt := 128 + (i*37)%256
			l, err := p.Pick(ctx, &Request{Model: "m", Stage: StageLocal, TargetWorker: "w2", Interactive: true, PromptTokens: prompt, Tokens: prompt + 64})
			if err != nil {
				t.Fatal(err)
			}
			ttft := 40*time.Millisecond + time.Duration(prompt)*100*time.Microsecond
			l.Release(Outcome{PromptTokens: prompt, CompletionTokens: 64, CacheReported: true, TTFT: ttft, Answered: ttft + 63*step})
			continue
		}
		// A batch decode, answered whole: the KV transfer and a step (20 ms), then 6 more steps.
		l, err := p.Pick(ctx, &Request{Model: "m", Stage: StageDecode, TargetWorker: "w2", PromptTokens: 520, Tokens: 527})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(Outcome{PromptTokens: 520, CachedTokens: 519, CompletionTokens: 7, CacheReported: true, Answered: 20*time.Millisecond + 6*step})
	}
	w := p.snap.Load().models["m"].decode.byID["w2"]
	got, ok := w.PredictIdle(256, 0)
	if !ok || got.TPOT < step-time.Millisecond || got.TPOT > step+time.Millisecond {
		t.Fatalf("w2's idle TPOT: got %v (ok %v), want its decode step, %v", got.TPOT, ok, step)
	}
}
