package routing

// The routing side of preemption (the gateway's, see gateway/preempt.go): an interactive request
// that finds no room ends lower-class requests in flight to make it some. Shortfalls tells the
// gateway what each worker lacks, so it ends the fewest requests on one worker rather than any;
// HoldForInteractive keeps the room they free for the interactive request: the requests end one by
// one, and a standard or batch request waiting for room would otherwise take what the first one
// frees before the interactive request fits (measured: docs/benchmarks.md, "Preemption that makes
// room").

// Shortfall is what one worker lacks for a request now (see Pool.Shortfalls).
type Shortfall struct {
	Worker *Worker
	// Requests and Tokens are how many of the requests and tokens in flight on the worker would
	// have to end before the request fits there (both 0: it fits); so would all of InFlight,
	// since an idle worker takes a request of any size.
	Requests, Tokens, InFlight int64
}

// Shortfalls is, for each worker of r's model (of r's stage) that may take r by waiting for room
// (healthy, not draining, circuit not open, not excluded, r's target if it has one), what it lacks
// for r now by the room test of Request.Eligible (Request.shortfall), for a caller that can end
// requests in flight to make room. Nil when r's model has no such worker. Cost: an allocation and
// a few atomic loads a worker.
func (p *Pool) Shortfalls(r *Request) []Shortfall {
	ms := p.snap.Load().models[r.Model]
	if ms != nil {
		ms = ms.stageSet(r.Stage)
	}
	if ms == nil {
		return nil
	}
	var out []Shortfall
	for _, w := range ms.workers {
		if !r.mayWaitFor(w) || r.TargetWorker != "" && r.TargetWorker != w.spec.ID {
			continue
		}
		s := Shortfall{Worker: w}
		s.Requests, s.Tokens, s.InFlight = r.shortfall(w)
		out = append(out, s)
	}
	return out
}

// HoldForInteractive keeps w for interactive requests until the returned function is called
// (once): meanwhile no standard or batch request is placed on it. For an interactive request
// waiting for the room that requests ended for it free there; the caller ends the hold once the
// request is placed, anywhere, or gives up. Holds add up. Cost: an atomic add.
func (w *Worker) HoldForInteractive() (end func()) {
	w.interactiveHolds.Add(1)
	return func() { w.interactiveHolds.Add(-1) }
}

// notHeldForInteractive is the filter of held workers (HoldForInteractive): whether c may take w,
// an interactive request always. Cost: an atomic load.
func (c *choice) notHeldForInteractive(w *Worker) bool {
	return c.Interactive || w.interactiveHolds.Load() == 0
}
