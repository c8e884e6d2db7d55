package routing

import (
	"context"
	"sync/atomic"
	"testing"
)

// askOnce is a test policy that, like kv_aware, keeps what it learnt of a request (its token
// ids) on the Request for the request's retries, and counts how often it had to learn it.
type askOnce struct{ asked atomic.Int32 }

func (a *askOnce) Pick(_ context.Context, r *Request, workers []*Worker) (*Worker, Route) {
	if r.kvTokens == nil {
		a.asked.Add(1)
		ids := []uint64{1, 2, 3}
		r.kvTokens = &ids
	}
	for _, w := range workers {
		if r.Eligible(w) {
			return w, RouteLeastRequest
		}
	}
	return nil, RouteLeastRequest
}

func init() {
	registerPolicy("test_ask_once", func(policyEnv) (Policy, error) { return &askOnce{}, nil })
}

// While interactive requests are present Pick works on a copy of a batch request; what the
// policy kept on it reaches the caller's, so a retry of the same request does not ask again.
func TestPickKeepsWhatThePolicyLearntOfTheRequest(t *testing.T) {
	p, err := NewPool(Config{Workers: testWorkers(2, "m"), Policy: "test_ask_once"}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if l, err := p.Pick(ctx, &Request{Model: "m", Interactive: true, PromptTokens: 10, Tokens: 20}); err != nil {
		t.Fatal(err)
	} else {
		l.Release(Outcome{})
	}
	r := &Request{Model: "m", PromptTokens: 10, Tokens: 20}
	for range 2 {
		l, err := p.Pick(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		l.Release(Outcome{})
	}
	p.mu.Lock()
	policy := p.policies["m"].Policy.(*askOnce)
	p.mu.Unlock()
	if got := policy.asked.Load(); got != 2 { // the interactive request, and the batch one once

		t.Errorf("the policy learnt the requests %d times, want 2: the batch request's two picks asked once", got)
	}
}
