package routing

import (
	"cmp"
	"iter"
	"slices"
	"time"
)

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

// PredictIdleTypical is what a typical worker of model's set for stage predicts for a request
// on it idle, the prediction the default latency objectives are relative to: over the workers of
// that set (the model's workers for a whole request; a disaggregated model's prefill or decode
// pool) that take requests and can predict, the median of their PredictIdle, TTFT and TPOT each
// their own (of an even count, the mean of the middle two). So an objective is the model's for
// the prompt, not that of w, the worker that served it: a placement on a worker whose model
// learnt itself faster (engines sharing a machine's cores learn different idle times) is not
// held to a tighter promise, nor one on a slower worker to a looser. When none of them can say,
// w's own prediction; ok is false when that cannot say either. Costs one PredictIdle per worker
// of the set; no allocation up to 16 workers; safe for concurrent use.
func (p *Pool) PredictIdleTypical(model string, stage Stage, w *Worker, promptTokens, cachedTokens int) (Prediction, bool) {
	var buf [16]Prediction
	idle := buf[:0]
	if ms := p.snap.Load().models[model]; ms != nil {
		if set := ms.stageSet(stage); set != nil {
			for _, x := range set.workers {
				if !x.takesRequests() {
					continue
				}
				if pr, ok := x.PredictIdle(promptTokens, cachedTokens); ok {
					idle = append(idle, pr)
				}
			}
		}
	}
	if len(idle) == 0 {
		return w.PredictIdle(promptTokens, cachedTokens)
	}
	return TypicalPrediction(idle), true
}

// TypicalPrediction is the median of ps, TTFT and TPOT each their own (of an even count, the
// mean of the middle two); the zero Prediction for none. TPOT's is over the predictions that
// carry one (a worker whose model has not learnt its steps says 0, which is no time): 0 when
// none does. It reorders ps.
func TypicalPrediction(ps []Prediction) Prediction {
	if len(ps) == 0 {
		return Prediction{}
	}
	ttft := func(p Prediction) time.Duration { return p.TTFT }
	tpot := func(p Prediction) time.Duration { return p.TPOT }
	typical := Prediction{TTFT: median(ps, ttft)}
	// Sorted by TPOT, those that carry none lead.
	slices.SortFunc(ps, func(a, b Prediction) int { return cmp.Compare(a.TPOT, b.TPOT) })
	if i := slices.IndexFunc(ps, func(p Prediction) bool { return p.TPOT > 0 }); i >= 0 {
		typical.TPOT = median(ps[i:], tpot)
	}
	return typical
}

// median is the median of of(p) over ps, not empty (of an even count, the mean of the middle
// two). It reorders ps.
func median(ps []Prediction, of func(Prediction) time.Duration) time.Duration {
	slices.SortFunc(ps, func(a, b Prediction) int { return cmp.Compare(of(a), of(b)) })
	n := len(ps)
	return (of(ps[(n-1)/2]) + of(ps[n/2])) / 2
}
