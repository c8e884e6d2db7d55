package routing

import (
	"math"
	"sync/atomic"
	"time"
)

// An engine computes the prompts of the requests it starts (prefill) in the same steps as
// everything else it runs, so an interactive request's time to first token grows with the batch
// prompts being prefilled beside it. While interactive traffic is present, each worker therefore
// prefills one background (standard or batch) prompt at a time: a background request may go to a
// worker only once the worker's previous background prefill is expected to be done. The
// expectation is the request's prompt tokens over the worker's prefill rate, learned from the
// time to first token and uncached prompt tokens of its streamed answers (Outcome). Until a rate
// is learned, or when no interactive request was picked in the last interactiveWindow, there is no
// budget.
//
// Cost: a few atomic loads on every background pick, a CAS on the worker's prefill clock when
// one is placed.

// interactiveWindow is how long after an interactive pick the budget applies.
const interactiveWindow = 5 * time.Second

// prefillRateWeight is the weight of a new sample in a worker's prefill rate.
const prefillRateWeight = 0.2

// prefillClock is one worker's background prefill budget state.
type prefillClock struct {
	busyUntil atomic.Int64  // unix ns when its background prefill in progress is expected done
	rate      atomic.Uint64 // math.Float64bits of prompt tokens per second; 0: not learned
}

// observe feeds one streamed answer: tokens prompt tokens computed (not cached) in ttft.
func (c *prefillClock) observe(tokens int, ttft time.Duration) {
	if tokens <= 0 || ttft <= 0 {
		return
	}
	sample := float64(tokens) / ttft.Seconds()
	for {
		old := c.rate.Load()
		next := sample
		if old != 0 {
			r := math.Float64frombits(old)
			next = r + prefillRateWeight*(sample-r)
		}
		if c.rate.CompareAndSwap(old, math.Float64bits(next)) {
			return
		}
	}
}

// estimate is how long tokens of prompt take to prefill on the worker; 0 when its rate is not
// learned.
func (c *prefillClock) estimate(tokens int) time.Duration {
	r := math.Float64frombits(c.rate.Load())
	if r <= 0 || tokens <= 0 {
		return 0
	}
	return time.Duration(float64(tokens) / r * float64(time.Second))
}

// PrefillEstimate is how long the worker is expected to take to prefill a prompt of tokens
// tokens, from the rate its streamed answers showed; 0 while no rate is learned.
func (w *Worker) PrefillEstimate(tokens int) time.Duration { return w.prefill.estimate(tokens) }

// prefillFree reports whether a background request may start prefilling on w at now.
func (r *Request) prefillFree(w *Worker) bool {
	return !r.Background || r.interactiveAt == 0 || r.now-r.interactiveAt > int64(interactiveWindow) ||
		r.now >= w.prefill.busyUntil.Load()
}

// placePrefill books a background request's prefill on w from now.
func (w *Worker) placePrefill(now int64, tokens int) {
	d := int64(w.prefill.estimate(tokens))
	if d == 0 {
		return
	}
	for {
		old := w.prefill.busyUntil.Load()
		if w.prefill.busyUntil.CompareAndSwap(old, max(old, now)+d) {
			return
		}
	}
}
