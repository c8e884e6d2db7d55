package test

import (
	"context"
	"encoding/json"
	"testing"
)

// TestEngineCacheAwareLearnsSlotCaches is issue 13's run on real engines: three llama-server
// workers with two slots each and --cache-ram 0 (each slot keeps only its last prompt, far
// below the 1 MiB the tree assumes of a worker), 8 groups x 12 questions with system prompts of
// about 1,500 tokens. cache_aware learns each engine's real cache from the cached tokens it
// reports: its cached share is clearly above round_robin's, and after warm-up its median
// prediction of what the chosen engine holds is within 10% of the prompt.
func TestEngineCacheAwareLearnsSlotCaches(t *testing.T) {
	const warmUp = 24
	w := newCacheWorkload(engineModel, 8, 12, 400)
	run := func(policy string) (share float64, below, count float64) {
		s := startEngineStack(t, engineStackOptions{workers: 3, slots: 2, policy: policy, engineArgs: []string{"--cache-ram", "0"}})
		var prompt, cached int
		var below0, count0 float64
		for i, body := range w.requests {
			if i == warmUp {
				below0, count0 = scrapePredictionErrors(t, s.gw.url)
			}
			resp := s.mustPost(context.Background(), t, body)
			var c chatResponse
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if c.Usage == nil {
				t.Fatalf("request %d: no usage", i)
			}
			if i >= warmUp {
				prompt += c.Usage.PromptTokens
				cached += c.Usage.PromptTokensDetails.CachedTokens
			}
		}
		below, count = scrapePredictionErrors(t, s.gw.url)
		return float64(cached) / float64(prompt), below - below0, count - count0
	}
	rr, _, _ := run("round_robin")
	ca, below, count := run("cache_aware")
	t.Logf("cached share: round_robin %.3f, cache_aware %.3f; predictions within 10%% of the prompt after warm-up: %.0f of %.0f",
		rr, ca, below, count)
	if ca < rr+0.15 {
		t.Errorf("cached share: got cache_aware %.3f, want at least 0.15 above round_robin's %.3f", ca, rr)
	}
	if count != float64(len(w.requests)-warmUp) || 2*below < count {
		t.Errorf("predictions after warm-up: %.0f of %.0f within 10%% of the prompt, want %d and at least half", below, count, len(w.requests)-warmUp)
	}
}

// scrapePredictionErrors reads, from the gateway's /metrics, the requests cache_aware predicted
// within 10% of the prompt and all it predicted.
func scrapePredictionErrors(t *testing.T, url string) (below, count float64) {
	t.Helper()
	return gatewayCounter(t, url, "usher_routing_cache_prediction_error_ratio_bucket", `le="0.1"`),
		gatewayCounter(t, url, "usher_routing_cache_prediction_error_ratio_count", "")
}
