package routing

import "slices"

// choice is one request as Pool.Pick hands it to a policy: the request, what Prepare found for
// it, and the protections in force for this one pick, which the pool sets and the request never
// carries. Its Eligible and Prepared hide the Request's: Eligible is the request's own test and
// every protection's filter, so a policy cannot filter without the protections; Prepared is a
// copy of the request's, which a preparer builds on (sticky_session adds its pin to what its
// fallback found) without writing to the Request.
//
// Pick builds it on its stack and passes it by value: a pick allocates nothing for it. The zero
// protections filter nothing: choice{Request: r, Prepared: r.Prepared} is r as Prepare sees it.
type choice struct {
	*Request
	Prepared Prepared

	// prefillBudget bounds the lower-class prompt tokens in prefill on a worker (see
	// withinPrefillBudget); 0: no bound.
	prefillBudget int64
	// piece is the size of the pieces in which the prompt goes to the engine (see
	// Lease.PrefillPiece); 0: whole. basePiece is the pool's piece it was cut from
	// (Pool.pieceTokens). Both, and prefillBudget, are this replica's alone: on a worker that
	// several replicas send lower-class prompts to, prefillOn divides them.
	piece, basePiece int
	// spread keeps an interactive request off a worker with another interactive prompt in
	// prefill (see clearOfInteractivePrefill).
	spread bool
	// full lists workers an earlier attempt of the same Pick found at capacity: skipped like
	// Request.Exclude, but not held against them (a pin to one stays).
	full []string
}

// Eligible reports whether w may take the request in this pick: the request's own test
// (Request.Eligible: health, drain, circuit, room, Exclude) and the filter of every protection in
// force. Every policy filters with it. It costs what Request.Eligible costs, a few atomic loads
// more and a scan of full; it modifies nothing.
func (c *choice) Eligible(w *Worker) bool {
	return c.Request.Eligible(w) && c.withinPrefillBudget(w) && c.clearOfInteractivePrefill(w) &&
		c.notHeldForInteractive(w) && !slices.Contains(c.full, w.spec.ID)
}

// protect sets the protections of interactive requests that are in force for c now, among
// workers: while interactive requests are present, a standard or batch request gets the prefill
// budget (prefill_budget.go), no more than one piece while pieces are on, and, for a long prompt,
// its pieces (prefill_pieces.go); an interactive request not sent to a target worker nor pinned
// prefers, of several workers, one with no interactive prompt in prefill
// (interactive_spread.go). Cost: a clock read.
func (p *Pool) protect(c *choice, workers []*Worker) {
	switch {
	case !c.Interactive && p.interactivePresent():
		c.prefillBudget = int64(p.cfg.Concurrency.LowerPrefillTokens)
		piece := p.pieceTokens()
		if piece > 0 {
			// A piece is what the interactive objective's slack allows in the step an
			// interactive prompt waits for: two pieces prefilled together would take twice it.
			c.prefillBudget = min(c.prefillBudget, int64(piece))
		}
		c.piece, c.basePiece = prefillPiece(piece, c.PromptTokens), piece
	case c.Interactive && c.TargetWorker == "" && c.Prepared.pin == nil && len(workers) > 1:
		c.spread = true
	}
}
