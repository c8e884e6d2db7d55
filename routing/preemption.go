package routing

import (
	"cmp"
	"slices"
)

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

// Yield is room this replica keeps on a worker beyond its share of the fleet's split while other
// replicas queue interactive requests for the worker (see Pool.Yields).
type Yield struct {
	Worker *Worker
	// Requests is how many of this replica's requests in flight on the worker are beyond its
	// share and its hold of the fleet's reserve, at most Waiting.
	Requests int64
	// Waiting is the interactive requests the other replicas queued for the worker's models at
	// their last exchanges (the same requests count on every worker of a model).
	Waiting int64
}

// Yields is, after an exchange of the fleet's split (SyncShares), each worker on which this
// replica keeps more requests in flight than its share because the split moved room to other
// replicas' queued interactive requests, most requests beyond the share first. Those requests
// hold the room until they end (a long batch answer, seconds) while the others' interactive
// requests wait for it: a caller that can end some of its lower-class requests there (the
// gateway's preemption) gives the room back at its next exchange, and the others take it at
// theirs. Nil without a ShareStore, while the last exchange failed, or while the split rejoins
// after a cut. Cost: a few atomic loads a worker, under the exchange's lock.
func (p *Pool) Yields() []Yield {
	s := p.shares
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing || p.now().Before(s.rejoinUntil) {
		return nil
	}
	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	var out []Yield
	for _, w := range workers {
		f := s.fleet[w.spec.ID]
		if f == nil || f.self < 0 {
			continue
		}
		var waiting int64
		for i, d := range f.demands {
			if i != f.self {
				waiting += max(d.Interactive, 0)
			}
		}
		over := w.inFlight.Load() - w.capacity() - w.reserve.Load()
		if waiting > 0 && over > 0 {
			out = append(out, Yield{Worker: w, Requests: min(over, waiting), Waiting: waiting})
		}
	}
	slices.SortStableFunc(out, func(a, b Yield) int { return cmp.Compare(b.Requests, a.Requests) })
	return out
}
