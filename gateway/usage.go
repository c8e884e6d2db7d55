package gateway

import (
	"context"
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

// Budgets enforces the tiers' day and month budgets; *tenants.Budgets implements it.
type Budgets interface {
	// Reserve holds one request and tokens (the call's estimate) in p's budgets (a nil Spend: no
	// budget applies) or refuses it with a *tenants.BudgetError. The Spend is settled or
	// released once.
	Reserve(ctx context.Context, p tenants.Principal, tokens int64) (*tenants.Spend, error)
}

// recordUsage counts the call in the ledger: every call that reached a queue, with what it was
// served (the engine's usage, or what the stream relayed when that never came), how it ended and
// its verdicts against its objectives.
func (s *Server) recordUsage(cl *call, err error, v verdicts) {
	u, outcome := cl.usage, outcomeOf(err)
	if outcome == tenants.OutcomeServed && errors.Is(err, errClientGone) && u.PromptTokens+u.CompletionTokens == 0 {
		outcome = tenants.OutcomeOther // the client left before anything was served
	}
	if s.ledger == nil || !cl.classed {
		return
	}
	s.ledger.Record(tenants.UsageRecord{
		Tenant: cl.principal.TenantID, Key: cl.principal.KeyID, Model: cl.model, Class: cl.class.String(),
		At:           cl.start,
		PromptTokens: int64(u.PromptTokens), CachedTokens: int64(u.cachedTokens()), CompletionTokens: int64(u.CompletionTokens),
		Estimated: u.estimated,
		Outcome:   outcome,
		TTFT:      v.ttft, TPOT: v.tpot,
	})
}

// outcomeOf says how a call that ended with err ended, in the ledger's words.
func outcomeOf(err error) tenants.Outcome {
	switch {
	case err == nil, errors.Is(err, errClientGone):
		return tenants.OutcomeServed
	case errors.Is(err, tenants.ErrRateLimited):
		return tenants.OutcomeRefusedLimit
	case errors.Is(err, tenants.ErrBudgetExceeded):
		return tenants.OutcomeRefusedBudget
	case errors.Is(err, queue.ErrQueueFull):
		return tenants.OutcomeQueueFull
	case errors.Is(err, queue.ErrDeadlineExceeded), errors.Is(err, queue.ErrDeadlineUnreachable):
		return tenants.OutcomeDeadline
	case errors.Is(err, errUpstream), errors.Is(err, errUpstreamAnswer), errors.Is(err, routing.ErrNoWorker):
		return tenants.OutcomeWorkerError
	}
	return tenants.OutcomeOther
}
