package gateway

import (
	"context"
	"errors"

	"github.com/labstack/echo/v4"

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
	// Check admits a request of p (a nil Spend: no budget applies) or refuses it with a
	// *tenants.BudgetError.
	Check(ctx context.Context, p tenants.Principal) (*tenants.Spend, error)
}

// checkBudget refuses the call when its tenant's budget is spent; settle charges what it was
// served.
func (s *Server) checkBudget(c echo.Context, cl *call) error {
	if s.budgets == nil {
		return nil
	}
	spend, err := s.budgets.Check(c.Request().Context(), cl.principal)
	cl.spend = spend
	return err
}

// recordUsage counts the call in the ledger: every call that reached a queue, with what it was
// served (the engine's usage, or what the stream relayed when that never came) and how it ended;
// and charges a served call to its tenant's budget.
func (s *Server) recordUsage(cl *call, err error) {
	u, outcome := cl.usage, outcomeOf(err)
	if outcome == tenants.OutcomeServed && errors.Is(err, errClientGone) && u.PromptTokens+u.CompletionTokens == 0 {
		outcome = tenants.OutcomeOther // the client left before anything was served
	}
	if outcome == tenants.OutcomeServed {
		cl.spend.Done(int64(u.PromptTokens) + int64(u.CompletionTokens))
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
