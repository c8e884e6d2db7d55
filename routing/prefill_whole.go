package routing

import "slices"

// With pieces on (prefill_pieces.go) and several workers, one worker keeps its steps to pieces
// while the others may prefill a long lower-class prompt whole at full speed (see takeWhole), and
// interactive requests go to a worker with no such prompt in prefill first (see
// clearOfWholePrefill); when none has room, to any (Pool.Pick drops the filter).

// steersInteractive reports whether interactive requests prefer, among workers, one with no
// long lower-class prompt in prefill whole: pieces are on, on one worker only (see takeWhole),
// and there are several.
func (p *Pool) steersInteractive(workers []*Worker) bool {
	c := p.cfg.Concurrency
	return c.PrefillPieceTokens >= 0 && !c.PiecesEverywhere && len(workers) > 1
}

// clearOfWholePrefill is the filter that steers interactive requests: whether w has no long
// lower-class prompt in prefill whole, when c avoids such workers; every worker otherwise. Cost:
// an atomic load.
func (c *choice) clearOfWholePrefill(w *Worker) bool {
	return !c.avoidWhole || w.wholePrefills.Load() == 0
}

// takeWhole reports whether a long lower-class prompt, picked for w while interactive requests
// are present, may go whole, and if so counts it in w.wholePrefills: nothing else of the lower
// classes is in prefill on w, and another of the model's workers that takes requests has no
// whole one in prefill, so an interactive request has a worker whose steps hold only pieces.
// With one worker it never may.
func (p *Pool) takeWhole(workers []*Worker, w *Worker) bool {
	p.wholeMu.Lock()
	defer p.wholeMu.Unlock()
	if w.prefill.tokens.Load() > 0 || w.wholePrefills.Load() > 0 ||
		!slices.ContainsFunc(workers, func(o *Worker) bool { return o != w && o.takesRequests() && o.wholePrefills.Load() == 0 }) {
		return false
	}
	w.wholePrefills.Add(1)
	return true
}
