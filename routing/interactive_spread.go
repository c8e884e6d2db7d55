package routing

// Interactive prompts spread over the workers: two interactive prompts in prefill on one worker
// share its steps, so each waits for the other's prefill as well as its own, while another worker
// may have none. An interactive request not sent to a target worker and not pinned (a session's
// pin keeps it on the worker that holds its cache) prefers a worker with no interactive prompt in
// prefill (see clearOfInteractivePrefill); when no such worker has room, any (Pool.Pick drops the
// filter). Measured on the demo, where the slowest interactive requests had met another
// interactive prompt on their worker: docs/benchmarks.md, "Pieces sized by the objective".
//
// On a disaggregated model's prefill pool the filter is stricter: a prefill worker with no
// prompt of any class in prefill. A prefill worker prefills prompts back to back, so one
// prefilling a batch prompt makes an interactive prompt wait for all of it, where the pool
// staged the request because some prefill worker was free (see servedLocally); before, the
// prefill policy could still pick a busy one. On a pd fleet beside a prefill-heavy flood the
// handed-off interactive prefills went from 86/112 ms (p90/max) to 58/80, batch's share equal
// (docs/benchmarks.md, "One lower-class piece a step").

// clearOfInteractivePrefill is the filter that spreads interactive requests: whether w has no
// interactive prompt in prefill (on the prefill stage: no prompt in prefill), when c spreads;
// every worker otherwise. Cost: an atomic load.
func (c *choice) clearOfInteractivePrefill(w *Worker) bool {
	switch {
	case !c.spread:
		return true
	case c.Stage == StagePrefill:
		return w.promptsInPrefill.Load() <= 0
	}
	return w.interactivePrefills.Load() == 0
}
