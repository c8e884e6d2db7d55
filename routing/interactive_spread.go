package routing

// Interactive prompts spread over the workers: two interactive prompts in prefill on one worker
// share its steps, so each waits for the other's prefill as well as its own, while another worker
// may have none. An interactive request not sent to a target worker and not pinned (a session's
// pin keeps it on the worker that holds its cache) prefers a worker with no interactive prompt in
// prefill (see clearOfInteractivePrefill); when no such worker has room, any (Pool.Pick drops the
// filter). Measured on the demo, where the slowest interactive requests had met another
// interactive prompt on their worker: docs/benchmarks.md, "Pieces sized by the objective".

// clearOfInteractivePrefill is the filter that spreads interactive requests: whether w has no
// interactive prompt in prefill, when c spreads; every worker otherwise. Cost: an atomic load.
func (c *choice) clearOfInteractivePrefill(w *Worker) bool {
	return !c.spread || w.interactivePrefilling() == 0
}
