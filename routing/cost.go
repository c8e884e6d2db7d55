package routing

import "time"

// Prediction is what a worker's cost model expects of one request: the time to its first token
// and the time per output token after it.
type Prediction struct {
	TTFT time.Duration
	TPOT time.Duration
}

// PredictIdle is what w's cost model, learnt from its answers, predicts for a request of
// promptTokens prompt tokens, cachedTokens of which the engine holds in its cache, on w with
// nothing else running. ok is false while the model has not learnt enough to say. It does no
// I/O and is safe for concurrent use.
//
// Not learnt yet: it reports ok false until the cost model lands (issue 31).
func (w *Worker) PredictIdle(promptTokens, cachedTokens int) (p Prediction, ok bool) {
	return Prediction{}, false
}
