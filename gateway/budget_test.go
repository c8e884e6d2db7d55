package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// TestParallelRequestsCannotOverrunABudget is issue 26's item 5 through the gateway: 50
// requests at once against caps of 10 requests and 1,000 tokens a day all passed, since the
// budget was checked at admission and charged only at the end. Admission reserves the request
// and its estimate now: 10 reach the worker, the other 40 get 429 budget_exceeded.
func TestParallelRequestsCannotOverrunABudget(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = make(chan struct{}) })
	metered := &tenants.Tier{Name: "metered", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}, Budget: tenants.Budget{RequestsPerDay: 10, TokensPerDay: 1000, SoftThreshold: 0.8}}
	spec := w.spec("w1")
	spec.MaxConcurrency = 64 // room for all 50 at once: only the budget stops any
	g := startGatewayWith(t, []routing.WorkerSpec{spec}, nil, func(d *Deps) {
		d.Auth = tierAuth{metered}
		d.Budgets = tenants.NewBudgets(tenants.BudgetsOptions{})
	})
	body := `{"model":"m1","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}` // about 55 tokens each
	var served, refused, other atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 50 {
		wg.Go(func() {
			<-start
			req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				other.Add(1)
				return
			}
			defer resp.Body.Close()
			var e errorBody
			switch {
			case resp.StatusCode == http.StatusOK:
				served.Add(1)
			case resp.StatusCode == http.StatusTooManyRequests && json.NewDecoder(resp.Body).Decode(&e) == nil && e.Error.Code == "budget_exceeded":
				refused.Add(1)
			default:
				other.Add(1)
			}
		})
	}
	close(start)
	// The worker holds what reaches it until every request has reached it or been answered, so
	// that none is charged before the others are admitted.
	for deadline := time.Now().Add(5 * time.Second); w.started.Load()+refused.Load()+other.Load() < 50 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	close(w.hold)
	wg.Wait()
	if served.Load() != 10 || refused.Load() != 40 || other.Load() != 0 {
		t.Errorf("50 at once against 10 requests / 1,000 tokens a day: %d served, %d refused budget_exceeded, %d other; want 10, 40, 0",
			served.Load(), refused.Load(), other.Load())
	}
	if got := w.requests.Load(); got != 10 {
		t.Errorf("requests that reached the worker: got %d, want 10", got)
	}
}
