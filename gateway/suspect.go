package gateway

import (
	"fmt"

	"github.com/usherllm/usher/routing"
)

// Suspect answers, a part of the proxy and dispatch stages. A worker that answers an attempt with
// a server error (a 5xx status) may be broken, or may have met input its engine cannot take:
// Python engines answer 500 to some requests they fail to validate (SGLang raises a TypeError on
// a list where it wants a string), and then every worker answers that request so. Were each such
// answer the worker's failure, one tenant repeating the request would open every worker's
// circuit. So the attempt is tried on another worker as before, but its worker's breaker counts
// the error only once another worker has served the same request (confirmFailures): a broken
// worker among working ones still opens its circuit, a poisonous request opens none. A request
// that maxSuspects workers answered with a server error is not tried again: it is the request's.
// The cost: a model served by one worker never opens its circuit on server errors alone
// (connection errors, hung workers and broken streams still count, and health checks still take
// a dead engine out).

// maxSuspects is how many workers may answer one call with a server error before it is not tried
// again.
const maxSuspects = 2

// suspectAnswer ends an attempt whose worker answered status, a server error: the lease is
// released as suspect (see routing.Outcome.Suspect), the worker is excluded from the call's
// next attempts, and the call is tried again unless maxSuspects workers have answered it so.
func (s *Server) suspectAnswer(cl *call, lease *routing.Lease, status string) (retry bool, err error) {
	w := lease.Worker
	lease.Release(routing.Outcome{Suspect: true})
	cl.suspects = append(cl.suspects, w)
	cl.route.Exclude = append(cl.route.Exclude, w.ID())
	s.log.Warn("worker attempt failed", "worker", w.ID(), "model", cl.model, "status", status)
	err = fmt.Errorf("worker %s answered %s", w.ID(), status)
	if len(cl.suspects) >= maxSuspects {
		return false, fmt.Errorf("%w: %d workers answered it with a server error, the last: %v", errUpstream, len(cl.suspects), err)
	}
	return true, err
}

// confirmFailures counts the call's suspect answers against their workers' circuit breakers: the
// call was served by another worker since, so their errors were theirs. Called once, when a call
// ends with an answer the client was sent successfully.
func (s *Server) confirmFailures(cl *call) {
	for _, w := range cl.suspects {
		s.pool.ConfirmFailure(w)
	}
	cl.suspects = nil
}
