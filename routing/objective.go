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

// The default TPOT objectives' factors of the idle step (the TPOT on an idle worker, learnt from
// the gaps of the worker's streams): one more than the TTFT's. A prompt pays a busy engine's
// step once; a decode pays the lower classes' share of every step, as each prefill a batch sends
// takes the engine's time from the decode steps (a chunking engine puts a chunk in most of
// them). Measured on the vLLM-like simulators beside a prefill-heavy flood (docs/benchmarks.md,
// "The idle step from the streams' gaps, 2026-12-07"): with batch at 0.79 of what interactive
// left, the interactive TPOT was 1.9x the idle step with nothing paced, and holding 2x at the
// 99th percentile paced the batch's pieces down to 0.65 of it, a trade nobody chose. 3x the
// step of a 13 ms engine is 40 ms, 25 tokens a second: faster than anyone reads.
const (
	InteractiveTPOTFactor = InteractiveObjectiveFactor + 1
	StandardTPOTFactor    = StandardObjectiveFactor + 1
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
