package routing

import "time"

// The default interactive TTFT objective, which the gateway judges interactive requests against
// when their tier states none, and which the prefill admission below keeps: 1.5x what the
// worker's cost model predicts for the prompt on an idle worker, at least 50 ms (the reasons are
// the gateway's; see its objective.go).
const (
	InteractiveObjectiveFactor = 1.5
	MinTTFTObjective           = 50 * time.Millisecond
)

// InteractiveObjective is the default interactive TTFT objective for a prompt whose idle
// prediction is idle: InteractiveObjectiveFactor times it, at least MinTTFTObjective.
func InteractiveObjective(idle time.Duration) time.Duration {
	return max(time.Duration(float64(max(idle, 0))*InteractiveObjectiveFactor), MinTTFTObjective)
}

// admitsLowerPrefill reports whether w may start prefilling tokens more of a standard or batch
// prompt while interactive requests are present (see Request.Interactive): yes while nothing
// of the lower classes is in prefill there (so they always make progress), else while the
// interactive prompt expected next (interactivePrompt tokens, the recent average) is predicted
// its first token within the default interactive objective beside everything on w now and
// this prompt too. Until w's cost model can predict, a fixed budget stands in: at most budget
// lower-class prompt tokens in prefill at once.
//
// The objective, not a count of tokens, is the bound: an engine that prefills fast takes many
// lower-class prompts at once, a slow one few, and a worker already busy with its running
// sequences (which slow every step) fewer still. Costs a prediction (well under 2 µs), no
// allocation; safe for concurrent use.
func (w *Worker) admitsLowerPrefill(tokens, budget int64, interactivePrompt int) bool {
	lower := w.prefill.tokens.Load()
	if lower <= 0 {
		return true
	}
	c := w.cost.coefficients()
	if !c.ttftOK {
		return lower+tokens <= budget
	}
	u := uncached(max(interactivePrompt, 1), 0)
	idle, _ := c.predict(u, placement{})
	// Placed now, the lower-class prompt runs beside the others and its tokens are in prefill;
	// the interactive request after it comes one more in flight.
	pl := w.placementNow(w.inFlight.Load() + 1)
	pl.prefilling = bounded(pl.prefilling+float64(tokens), maxCostTokens)
	next, _ := c.predict(u, pl)
	return next.TTFT <= InteractiveObjective(idle.TTFT)
}
