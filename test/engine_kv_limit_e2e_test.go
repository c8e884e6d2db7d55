package test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/test/sim"
)

// A KV-bound engine (usher sim in kv mode, as vLLM) states the size of its KV cache on /metrics.
// With the default config the gateway sends a flood no faster than that cache can hold every
// request to its last token: the engine never evicts a running request for lack of KV (vLLM's
// preemption, which throws its work away) and the waiting happens in usher's queue. With the
// request limit alone, it doubles past what the cache holds at its first scrapes.
func TestKVBoundEngineIsSentNoMoreThanItsCacheHolds(t *testing.T) {
	const kvTokens = 2048
	s := startStack(t, stackOptions{policy: "least_request",
		sim: func(_ int, c *sim.Config) {
			c.Mode, c.KVCacheTokens, c.TimeScale = sim.ModeKV, kvTokens, 0.2
		},
		routing: func(c *routing.Config, _ []*sim.Engine) {
			c.Scrape.Interval, c.Scrape.Timeout = 40*time.Millisecond, 40*time.Millisecond
		}})
	engine := s.engines[0]
	eventually(t, 5*time.Second, "the pool sizes the token limit from the engine's KV cache", func() bool {
		var st routing.WorkerStatus
		s.admin(t, http.MethodGet, "/workers/sim-0", &st)
		return st.TokenLimitSource == routing.LimitEngine && st.MaxTokensInFlight >= kvTokens && st.Load.KVTokens == kvTokens
	})

	// 48 requests at once, each ~245 prompt tokens and 64 output tokens: 15,000 tokens of KV in
	// all, seven times the cache; the first 8 the initial request limit lets through would
	// need 2,500 tokens.
	prompt := strings.TrimSpace(strings.Repeat("lorem ipsum dolor sit amet consectetur ", 40))
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := s.do(context.Background(), t, "/v1/chat/completions", chat(fmt.Sprintf("%d %s", i, prompt), 64, false))
			_, _ = io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	st := engine.Stats()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of 48 requests failed", n)
	}
	if st.Completed != 48 || st.GeneratedTokens != 48*64 {
		t.Errorf("the engine completed %d requests and generated %d tokens; want 48 and %d", st.Completed, st.GeneratedTokens, 48*64)
	}
	if st.Preemptions != 0 {
		t.Errorf("the engine evicted %d running requests for lack of KV cache; want none", st.Preemptions)
	}
}
