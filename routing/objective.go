package routing

import "time"

// The default TTFT objectives, which the gateway judges requests against when their tier states
// none (interactive and standard; batch has none), and which the pool warns of when a worker's
// engine steps make the interactive one unreachable (see Pool.checkObjective): a factor of what
// the worker's cost model predicts for the prompt on an idle worker, plus one engine step there,
// at least 50 ms (the reasons are the gateway's; see its objective.go).
//
// The step is the idle prediction's time per output token: one decode step of an engine with
// nothing else running. An engine runs in steps and does not stop one, so a prompt that arrives
// while the engine is busy waits for the step in progress before its own prefill begins: on a
// shared worker that wait is the engine's, and no placement removes it. The factor is the room
// beyond it: with 2, one more prompt of the same size prefilled beside it (the size of the pieces
// long lower-class prompts go to the engine in, see prefillPiece).
const (
	InteractiveObjectiveFactor = 2.0
	StandardObjectiveFactor    = 3.0
	MinTTFTObjective           = 50 * time.Millisecond
)

// TTFTObjective is the default TTFT objective of factor for a prompt whose idle prediction is
// idle: factor times its TTFT plus one step (its TPOT), at least MinTTFTObjective, at most bound.
func TTFTObjective(idle Prediction, factor float64, bound time.Duration) time.Duration {
	d := factor*float64(max(idle.TTFT, 0)) + float64(max(idle.TPOT, 0))
	return max(time.Duration(min(d, float64(bound))), MinTTFTObjective)
}

// InteractiveObjective is the default interactive TTFT objective for a prompt whose idle
// prediction is idle (TTFTObjective of InteractiveObjectiveFactor, at most an hour).
func InteractiveObjective(idle Prediction) time.Duration {
	return TTFTObjective(idle, InteractiveObjectiveFactor, time.Hour)
}
