package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
)

func TestSetQuotaHeaders(t *testing.T) {
	h := http.Header{}
	setQuotaHeaders(h, tenants.Quota{LimitRequests: 60, RemainingRequests: 59, ResetRequests: time.Second,
		LimitTokens: 1000, RemainingTokens: 10, ResetTokens: 6*time.Minute + 300*time.Millisecond})
	want := map[string]string{
		"X-Ratelimit-Limit-Requests": "60", "X-Ratelimit-Remaining-Requests": "59", "X-Ratelimit-Reset-Requests": "1s",
		"X-Ratelimit-Limit-Tokens": "1000", "X-Ratelimit-Remaining-Tokens": "10", "X-Ratelimit-Reset-Tokens": "6m0s",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("%s: got %q, want %q", k, got, v)
		}
	}
	h = http.Header{}
	setQuotaHeaders(h, tenants.Quota{})
	if len(h) != 0 {
		t.Errorf("unlimited: got headers %v, want none", h)
	}
}
