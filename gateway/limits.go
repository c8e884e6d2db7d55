package gateway

import (
	"context"
	"errors"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/tenants"
)

// Limits is the tiers' rate limiter as the gateway uses it; *tenants.Limiter implements it.
type Limits interface {
	// Admit reserves a request slot, a concurrency slot and the token estimate, or refuses
	// (tenants.ErrModelNotAllowed, tenants.ErrPromptTooLong, *tenants.LimitError).
	Admit(ctx context.Context, p tenants.Principal, d tenants.Demand) (*tenants.Admission, error)
}

// admitLimits applies the tenant's limits; the caller calls Done on the admission (when not nil)
// with the tokens really used. The quota goes out in OpenAI's x-ratelimit-* headers, on a
// refusal too.
func (s *Server) admitLimits(c echo.Context, p tenants.Principal, d tenants.Demand) (*tenants.Admission, error) {
	if s.limits == nil {
		return nil, nil
	}
	adm, err := s.limits.Admit(c.Request().Context(), p, d)
	var le *tenants.LimitError
	if errors.As(err, &le) {
		le.Quota.Apply(c.Response().Header())
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	adm.Quota.Apply(c.Response().Header())
	return adm, nil
}
