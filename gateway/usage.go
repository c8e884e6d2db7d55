package gateway

import (
	"errors"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Ledger records every call's usage for the usage ledger; *tenants.Ledger implements it.
type Ledger interface {
	// Record counts one call. It must be cheap (no I/O): settle calls it on the request path.
	Record(tenants.UsageRecord)
}

// recordUsage counts the call in the ledger: every call that reached a queue, with what it was
// served (the engine's usage, or what the stream relayed when that never came) and how it ended.
func (s *Server) recordUsage(cl *call, err error) {
	if s.ledger == nil || !cl.classed {
		return
	}
	u := cl.usage
	s.ledger.Record(tenants.UsageRecord{
		Tenant: cl.principal.TenantID, Key: cl.principal.KeyID, Model: cl.model, Class: cl.class.String(),
		At:           cl.start,
		PromptTokens: int64(u.PromptTokens), CachedTokens: int64(u.cachedTokens()), CompletionTokens: int64(u.CompletionTokens),
		Estimated: u.estimated,
		Outcome:   outcomeOf(err),
	})
}

// outcomeOf says how a call that ended with err ended, in the ledger's words.
func outcomeOf(err error) tenants.Outcome {
	switch {
	case err == nil, errors.Is(err, errClientGone):
		return tenants.OutcomeServed
	case errors.Is(err, tenants.ErrRateLimited):
		return tenants.OutcomeRefusedLimit
	case errors.Is(err, queue.ErrQueueFull):
		return tenants.OutcomeQueueFull
	case errors.Is(err, queue.ErrDeadlineExceeded), errors.Is(err, queue.ErrDeadlineUnreachable):
		return tenants.OutcomeDeadline
	case errors.Is(err, errUpstream), errors.Is(err, errUpstreamAnswer), errors.Is(err, routing.ErrNoWorker):
		return tenants.OutcomeWorkerError
	}
	return tenants.OutcomeOther
}
