package gateway

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

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
		setQuotaHeaders(c.Response().Header(), le.Quota)
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	setQuotaHeaders(c.Response().Header(), adm.Quota)
	return adm, nil
}

// setQuotaHeaders sets OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers
// from q; a limit of 0 (unlimited) leaves its three headers out.
func setQuotaHeaders(h http.Header, q tenants.Quota) {
	if q.LimitRequests > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(q.LimitRequests, 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(q.RemainingRequests, 10))
		h.Set("x-ratelimit-reset-requests", resetString(q.ResetRequests))
	}
	if q.LimitTokens > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(q.LimitTokens, 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(q.RemainingTokens, 10))
		h.Set("x-ratelimit-reset-tokens", resetString(q.ResetTokens))
	}
}

// resetString formats d as OpenAI does ("20ms", "1s", "6m0s").
func resetString(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// limitsError maps the limiter's refusals; it is part of toAPIError.
func limitsError(err error) (*apiError, bool) {
	var le *tenants.LimitError
	switch {
	case errors.As(err, &le):
		return &apiError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "rate_limit_exceeded",
			Message: "rate limit reached for " + string(le.Limit) + "; retry later", RetryAfter: le.RetryAfter}, true
	case errors.Is(err, tenants.ErrModelNotAllowed):
		return &apiError{Status: http.StatusForbidden, Type: "permission_error", Code: "model_not_allowed",
			Param: "model", Message: "your tier does not include this model"}, true
	case errors.Is(err, tenants.ErrPromptTooLong):
		return &apiError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "context_length_exceeded",
			Param: "messages", Message: "the prompt is longer than your tier allows"}, true
	}
	return nil, false
}
