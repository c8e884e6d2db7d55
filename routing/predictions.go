package routing

import "iter"

// WorkerPrediction is what one worker's cost model predicts for a request: placed on the worker
// as it is now (Now), and on it idle (Idle), which the default latency objectives are relative to.
type WorkerPrediction struct {
	Worker    string
	Now, Idle Prediction
}

// Predictions yields what each worker of model that takes requests now (healthy, not draining,
// circuit not open) predicts for a request of promptTokens prompt tokens, cachedTokens of them
// held in the engine's cache, in configuration order; a worker whose cost model cannot predict
// yet is left out, so an empty sequence means nobody can say. It does no I/O, takes no lock and
// costs about two predictions per worker; safe for concurrent use.
func (p *Pool) Predictions(model string, promptTokens, cachedTokens int) iter.Seq[WorkerPrediction] {
	return func(yield func(WorkerPrediction) bool) {
		ms := p.snap.Load().models[model]
		if ms == nil {
			return
		}
		for _, w := range ms.workers {
			if !w.takesRequests() {
				continue
			}
			now, ok := w.Predict(promptTokens, cachedTokens)
			if !ok {
				continue
			}
			idle, _ := w.PredictIdle(promptTokens, cachedTokens)
			if !yield(WorkerPrediction{Worker: w.spec.ID, Now: now, Idle: idle}) {
				return
			}
		}
	}
}
