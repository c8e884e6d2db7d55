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
// worker among working ones still opens its circuit, a poisonous request opens none (and, as any
// failing request, is tried on server.max_attempts workers at most).
// The cost: a model served by one worker never opens its circuit on server errors alone
// (connection errors, hung workers and broken streams still count, and health checks still take
// a dead engine out).

// suspectAnswer ends an attempt whose worker answered status, a server error: the lease is
// released as suspect (see routing.Outcome.Suspect), and the call is to be tried again on another
// worker (see suspected).
func (s *Server) suspectAnswer(cl *call, lease *routing.Lease, status string) (retry bool, err error) {
	lease.Release(routing.Outcome{Suspect: true})
	s.log.Warn("worker attempt failed", "worker", lease.Worker.ID(), "model", cl.model, "status", status)
	return cl.suspected(lease.Worker, status)
}

// suspected records that w answered the call with status, a server error, for a lease released
// as suspect: w is excluded from the call's next attempts (of the stage it served), and the call
// is to be tried again.
func (cl *call) suspected(w *routing.Worker, status string) (retry bool, err error) {
	cl.suspects = append(cl.suspects, w)
	cl.exclude(w.ID())
	return true, fmt.Errorf("worker %s answered %s", w.ID(), status)
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
