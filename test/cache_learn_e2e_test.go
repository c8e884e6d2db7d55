package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/test/sim"
)

// cacheWorkload is groups of chat requests sharing a long system prompt per group, the shape of
// issue 13's real-engine run (8 groups x 12 questions), in a seeded interleaved order.
type cacheWorkload struct {
	systems  []string
	requests []string // bodies
}

func newCacheWorkload(model string, groups, questions, systemWords int) cacheWorkload {
	var w cacheWorkload
	for g := range groups {
		words := make([]string, systemWords)
		for i := range words {
			words[i] = fmt.Sprintf("g%dw%d", g, i%50)
		}
		w.systems = append(w.systems, strings.Join(words, " "))
	}
	rng := rand.New(rand.NewPCG(13, 13))
	for _, i := range rng.Perm(groups * questions) {
		g, q := i%groups, i/groups
		w.requests = append(w.requests, fmt.Sprintf(`{"model":%q,"max_tokens":2,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
			model, w.systems[g], fmt.Sprintf("question %d of group %d?", q, g)))
	}
	return w
}

// cacheRun is what one policy made of a cacheWorkload.
type cacheRun struct {
	share     float64 // cached prompt tokens / prompt tokens, after warm-up
	medianLow bool    // the median prediction error after warm-up is at most 10% of the prompt
	samples   uint64  // predictions after warm-up
}

// runCacheWorkload sends w's requests one at a time through a gateway of policy in front of
// three sim engines with small caches made by simCfg.
func runCacheWorkload(t *testing.T, policy string, w cacheWorkload, warmUp int, simCfg func(c *sim.Config)) cacheRun {
	t.Helper()
	s := startStack(t, stackOptions{workers: 3, policy: policy, sim: func(_ int, c *sim.Config) { simCfg(c) }})
	var prompt, cached int
	var below0, count0 uint64
	for i, body := range w.requests {
		if i == warmUp {
			below0, count0 = predictionErrors(t, s.reg)
		}
		resp := s.do(context.Background(), t, "/v1/chat/completions", body)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s request %d: status %d: %s", policy, i, resp.StatusCode, b)
		}
		var answer struct {
			Usage struct {
				PromptTokens        int `json:"prompt_tokens"`
				PromptTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(b, &answer); err != nil {
			t.Fatal(err)
		}
		if i >= warmUp {
			prompt += answer.Usage.PromptTokens
			cached += answer.Usage.PromptTokensDetails.CachedTokens
		}
	}
	below, count := predictionErrors(t, s.reg)
	below, count = below-below0, count-count0
	return cacheRun{share: float64(cached) / float64(prompt), medianLow: 2*below >= count, samples: count}
}

// predictionErrors returns, from cache_aware's prediction error histogram, the requests whose
// error was at most 10% of the prompt and all requests.
func predictionErrors(t *testing.T, g prometheus.Gatherer) (below, count uint64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "usher_routing_cache_prediction_error_ratio" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			count += h.GetSampleCount()
			for _, b := range h.GetBucket() {
				if b.GetUpperBound() == 0.1 {
					below += b.GetCumulativeCount()
				}
			}
		}
	}
	return below, count
}

// TestCacheAwareLearnsSmallEngineCaches runs issue 13's workload against engines whose caches
// hold two or three of the groups' prompts, far below the 1 MiB the tree assumes of a worker by
// default: llama-server's slots without a RAM cache (each slot keeps its last prompt), and a vLLM
// with a small block cache. cache_aware must learn each engine's real cache from the cached tokens
// it reports: it serves a clearly larger share of prompt tokens from cache than round_robin, and
// after warm-up its median prediction of what the chosen worker holds is within 10% of the prompt.
func TestCacheAwareLearnsSmallEngineCaches(t *testing.T) {
	w := newCacheWorkload(model, 8, 12, 300)
	modes := []struct {
		name string
		cfg  func(c *sim.Config)
	}{
		{"llama-server slots", func(c *sim.Config) {
			c.Mode, c.Slots, c.KVCacheTokens, c.MaxNumBatchedTokens = sim.ModeSlots, 2, 2*512, 2048
		}},
		{"vLLM small block cache", func(c *sim.Config) { c.KVCacheTokens = 1024 }},
	}
	for _, m := range modes {
		t.Run(m.name, func(t *testing.T) {
			rr := runCacheWorkload(t, "round_robin", w, 24, m.cfg)
			ca := runCacheWorkload(t, "cache_aware", w, 24, m.cfg)
			t.Logf("cached share: round_robin %.3f, cache_aware %.3f; cache_aware median error <= 10%%: %v over %d requests",
				rr.share, ca.share, ca.medianLow, ca.samples)
			if ca.share < rr.share+0.15 {
				t.Errorf("cached share: got cache_aware %.3f, want at least 0.15 above round_robin's %.3f", ca.share, rr.share)
			}
			if ca.samples != uint64(len(w.requests)-24) {
				t.Errorf("predictions after warm-up: got %d, want %d", ca.samples, len(w.requests)-24)
			}
			if !ca.medianLow {
				t.Errorf("median prediction error after warm-up: above 10%% of the prompt")
			}
		})
	}
}
