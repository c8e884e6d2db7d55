package routing

import (
	"sync"
	"time"
)

// The hand-off model: one per worker, learnt from the decode stages of disaggregated requests
// it served (Outcome.Handoff: from sending a decode to its first event, beyond a prefill that
// ran beside it). That time is the KV transfer from the prefill worker, the decode engine's wait
// to admit the request between the steps of its running sequences, and its first step:
//
//	H = h0 + hp·P + hb·B
//
// where P is the prompt's tokens (thousands: the engine pulls the KV of every one, whatever the
// prefill worker found cached) and B the sequences running beside it on the worker when it was
// placed. A two-staged request's first token comes after its prefill and this hand-off, so what
// it is predicted and what its default objective is relative to are the prefill worker's TTFT
// plus the decode worker's H; without it a disaggregated fleet would be judged against a
// prefill-only time its clients never see.
//
// The worker's cost model (cost.go) learns TTFT from these same answers (for a worker of role
// decode it is all it sees) but by the prompt's uncached tokens, which the transfer does not
// follow, and for a worker of role both mixed with whole requests' prefills: hence a law of its
// own. It is fitted as the cost model's laws are (recursive least squares with forgetting,
// bounded residuals and leverage, priors held, costs non-negative, a lost fit started again), in
// fixed memory; an answer costs about a hundred floating-point operations under the model's
// mutex, allocates nothing, and a prediction reads the published coefficients without a lock.

const handoffInputs = 3 // 1, P, B

// handoffPrior is the prior variance of each coefficient (ms², per unit of its input): wide for
// the transfer's fixed part and per prompt token, as a transfer over TCP on CPU may take
// seconds per thousand tokens, narrower per running sequence (see ttftPrior).
var handoffPrior = [maxInputs]float64{1e6, 1e8, 1e4}

// handoffModel is one worker's hand-off model. observe is called from any goroutine (each
// Release of a decode lease); coefficients reads the published fit without the lock.
type handoffModel struct {
	mu  sync.Mutex // guards fit
	fit costFit
	// pub is the fit as of the last answer, as predictions read it.
	pub publishedFit
}

func newHandoffModel() *handoffModel {
	h := &handoffModel{}
	h.fit.reset(handoffInputs, &handoffPrior)
	return h
}

// handoffCoefficients is a snapshot of a hand-off model's fit; the zero value predicts nothing.
type handoffCoefficients struct {
	theta [maxInputs]float64
	ok    bool
}

func handoffX(promptTokens int, running float64) [maxInputs]float64 {
	p := min(max(promptTokens, 0), maxCostTokens)
	return [maxInputs]float64{1, float64(p) / 1000, bounded(running, maxCostLoad)}
}

// observe learns one hand-off of took for a prompt of promptTokens, placed beside running
// sequences. A time beyond maxCostDuration, or none, or no prompt, teaches nothing.
func (h *handoffModel) observe(running float64, promptTokens int, took time.Duration) {
	took = validDuration(took)
	if took == 0 || promptTokens <= 0 {
		return
	}
	x := handoffX(promptTokens, running)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fit.update(&x, ms(took))
	h.pub.publish(&h.fit, handoffInputs)
}

func (h *handoffModel) coefficients() handoffCoefficients {
	theta, ok := h.pub.load(handoffInputs)
	return handoffCoefficients{theta: theta, ok: ok}
}

// predict is the hand-off of a prompt of promptTokens beside running sequences; ok is false
// while the model has not learnt enough.
func (c *handoffCoefficients) predict(promptTokens int, running float64) (time.Duration, bool) {
	if !c.ok {
		return 0, false
	}
	return max(msDuration(dot(&c.theta, handoffX(promptTokens, running), handoffInputs)), minPrediction), true
}

// PredictHandoffIdle is what w's hand-off model, learnt from the decode stages it served,
// predicts for the decode of a prompt of promptTokens (clamped to [0, 2^20]) with nothing else
// running on w: the time from sending the decode to its first event. ok is false while it has
// learnt from fewer than 32 decodes' first events. It does no I/O, takes no lock, allocates
// nothing, and is safe for concurrent use.
func (w *Worker) PredictHandoffIdle(promptTokens int) (time.Duration, bool) {
	c := w.handoff.coefficients()
	return c.predict(promptTokens, 0)
}

// PredictedHandoff is what the hand-off model of the lease's worker predicted, when the decode
// stage was placed (its fit and the sequences running there then), for a prompt of
// promptTokens. ok is false for a lease of another stage, or when the model could not say then.
// No allocation; safe for concurrent use.
func (l *Lease) PredictedHandoff(promptTokens int) (time.Duration, bool) {
	return l.handoff.predict(promptTokens, l.placed.running)
}
