package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// slotCache is a fake of llama-server's prompt cache with --cache-ram 0: each of its slots keeps
// the last prompt it computed; a prompt takes the slot sharing the longest prefix with it if that
// is more than half of the slot's prompt, else the least recently used slot, and reuses the shared
// prefix. A token is 4 bytes.
type slotCache struct {
	slots []string
	used  []int // last use of each slot
	clock int
}

func newSlotCache(n int) *slotCache {
	return &slotCache{slots: make([]string, n), used: make([]int, n)}
}

// serve computes prompt and returns the usage the engine reports: prompt and cached tokens.
func (e *slotCache) serve(prompt string) (promptTokens, cachedTokens int) {
	e.clock++
	best, bestLCP := -1, 0
	for i, s := range e.slots {
		if k := commonPrefix(s, prompt); k > bestLCP && 2*k > len(s) {
			best, bestLCP = i, k
		}
	}
	if best < 0 {
		best = 0
		for i := range e.slots {
			if e.used[i] < e.used[best] {
				best = i
			}
		}
		bestLCP = commonPrefix(e.slots[best], prompt)
	}
	e.slots[best], e.used[best] = prompt, e.clock
	return len(prompt) / 4, bestLCP / 4
}

func TestCacheAwareLearnsWhatTheEngineKeeps(t *testing.T) {
	a, b, cc := strings.Repeat("a", 1000), strings.Repeat("b", 1000), strings.Repeat("c", 1000)
	tests := []struct {
		name      string
		limit     int64 // learned before; 0 for none
		outcome   Outcome
		wantLimit int64
		wantHeld  []string // prompts the worker is taken to hold afterwards
	}{
		{name: "engine held less: the limit becomes what displaced the prefix",
			outcome:   Outcome{PromptTokens: 250, CachedTokens: 0, CacheReported: true},
			wantLimit: 2000, wantHeld: []string{a, cc}},
		{name: "engine held what the tree said: the ceiling stays",
			outcome:   Outcome{PromptTokens: 250, CachedTokens: 249, CacheReported: true},
			wantLimit: 1 << 20, wantHeld: []string{a, b, cc}},
		{name: "engine held what the tree said under a learned limit: it grows a sixteenth of the prompt",
			limit:     3000,
			outcome:   Outcome{PromptTokens: 250, CachedTokens: 240, CacheReported: true},
			wantLimit: 3000 + 1000/16, wantHeld: []string{a, b, cc}},
		{name: "engine held more than the tree: the limit grows by the difference",
			limit:     1000,
			outcome:   Outcome{PromptTokens: 250, CachedTokens: 250, CacheReported: true},
			wantLimit: 2000, wantHeld: []string{a, cc}},
		{name: "no cache count reported: nothing learned",
			outcome:   Outcome{PromptTokens: 250},
			wantLimit: 1 << 20, wantHeld: []string{a, b, cc}},
		{name: "failed request: nothing learned",
			outcome:   Outcome{Failed: true, PromptTokens: 250, CacheReported: true},
			wantLimit: 1 << 20, wantHeld: []string{a, b, cc}},
		{name: "a cached count above the prompt counts as the whole prompt",
			outcome:   Outcome{PromptTokens: 250, CachedTokens: 1 << 40, CacheReported: true},
			wantLimit: 1 << 20, wantHeld: []string{a, b, cc}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clock := newTestCacheAware(t, CacheAwareConfig{Threshold: 0.01})
			ws := cacheWorkers(t, 1)
			for _, p := range []string{a, b, cc} {
				clock.advance(time.Second)
				c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, ws)
			}
			if tt.limit > 0 {
				c.tree.workers[0].limit = tt.limit
				c.tree.workers[0].horizon = c.tree.horizon(0, tt.limit)
				c.tree.limited++
			}
			clock.advance(time.Second)
			held, _ := c.tree.heldBy(c.tree.descend(c.tree.scopeRoot(anonymous, false), a), 0, c.tree.workers[0].horizon)
			_, _, pred := c.pickLearning(context.Background(), choice{Request: &Request{Model: "m", Prompt: a}}, ws)
			if pred.worker != "w0" || pred.prompt != 1000 || pred.held != held {
				t.Fatalf("prediction: got %+v, want w0 holding %d of 1000 bytes", pred, held)
			}
			c.learn(pred, tt.outcome)
			if got := c.Limit("w0"); got != tt.wantLimit {
				t.Errorf("limit: got %d, want %d", got, tt.wantLimit)
			}
			var got []string
			for _, p := range []string{a, b, cc} {
				if held, _ := c.tree.heldBy(c.tree.descend(c.tree.scopeRoot(anonymous, false), p), 0, c.tree.workers[0].horizon); held == len(p) {
					got = append(got, p)
				}
				if treeHoldings(c.tree, p)["w0"] != len(p) {
					t.Errorf("the tree forgot %s...: want it kept as where it lived", p[:1])
				}
			}
			if !slices.Equal(got, tt.wantHeld) {
				t.Errorf("w0 holds %d prompts (%v), want %d", len(got), firstBytes(got), len(tt.wantHeld))
			}
			checkTree(t, c.tree)
		})
	}
}

func firstBytes(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p[:1]
	}
	return out
}

// TestCacheAwareLearningFollowsSlotEngines routes groups of prompts sharing a system prompt to
// three engines that each keep only their two slots' prompts (llama-server with --cache-ram 0),
// once trusting the tree's 1 MiB ceiling and once learning from every answer. After warm-up,
// learning must predict what the chosen engine holds within 10% of the prompt for most requests,
// mispredict far fewer of them than the fixed tree, and serve no less from cache.
func TestCacheAwareLearningFollowsSlotEngines(t *testing.T) {
	const groups, requests, warmUp = 8, 600, 100
	systems := make([]string, groups)
	for g := range systems {
		systems[g] = strings.Repeat(fmt.Sprintf("system prompt of group %d. ", g), 200) // ~5 KB
	}
	type result struct {
		share, medianErr, wrong float64 // wrong: share of requests off by more than 10%
	}
	run := func(learn bool) result {
		c, clock := newTestCacheAware(t, CacheAwareConfig{})
		ws := cacheWorkers(t, 3)
		engines := map[string]*slotCache{}
		for _, w := range ws {
			engines[w.ID()] = newSlotCache(2)
		}
		rng := rand.New(rand.NewPCG(7, 11))
		var promptTokens, cachedTokens int
		var errs []float64
		for i := range requests {
			clock.advance(time.Second)
			prompt := fmt.Sprintf("%squestion %d?", systems[rng.IntN(groups)], rng.IntN(12))
			w, _, pred := c.pickLearning(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt}}, ws)
			pt, ct := engines[w.ID()].serve(prompt)
			if learn {
				c.learn(pred, Outcome{PromptTokens: pt, CachedTokens: ct, CacheReported: true})
			}
			if i >= warmUp {
				promptTokens += pt
				cachedTokens += ct
				observed := float64(len(prompt)) * float64(ct) / float64(pt)
				errs = append(errs, max(float64(pred.held)-observed, observed-float64(pred.held))/float64(len(prompt)))
			}
		}
		slices.Sort(errs)
		wrong := len(errs) - sort.SearchFloat64s(errs, 0.1000001)
		return result{float64(cachedTokens) / float64(promptTokens), errs[len(errs)/2], float64(wrong) / float64(len(errs))}
	}
	fixed, learned := run(false), run(true)
	t.Logf("fixed tree: %+v; learning: %+v", fixed, learned)
	if learned.medianErr > 0.1 {
		t.Errorf("median prediction error after warm-up: got %.3f of the prompt, want <= 0.1", learned.medianErr)
	}
	if learned.wrong > fixed.wrong/2 {
		t.Errorf("requests mispredicted by more than 10%%: got %.3f learning, want at most half the fixed tree's %.3f", learned.wrong, fixed.wrong)
	}
	if learned.share < fixed.share-0.01 {
		t.Errorf("cached share: got %.3f learning, want no less than the fixed tree's %.3f", learned.share, fixed.share)
	}
}

// TestPoolFeedsCacheAwareTheOutcome checks the path through the Pool: the lease of a cache_aware
// pick hands the outcome to the policy, which learns the worker's limit and records its error.
func TestPoolFeedsCacheAwareTheOutcome(t *testing.T) {
	p, reg := newTestPool(t, Config{Workers: testWorkers(1, "m"), Policy: "cache_aware"})
	prompt := strings.Repeat("x", 4000)
	for _, o := range []Outcome{
		{PromptTokens: 1000, CacheReported: true},                     // cold, and predicted cold: error 0
		{PromptTokens: 1000, CacheReported: true, CachedTokens: 500},  // predicted all: error 0.5
		{PromptTokens: 1000, CacheReported: true, CachedTokens: 1000}, // limit is the prompt: right
	} {
		l, err := p.Pick(context.Background(), &Request{Model: "m", Prompt: prompt, Tokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(o)
	}
	ca := p.snap.Load().models["m"].policy.(*CacheAware)
	if got, want := ca.Limit("w0"), int64(4000+4000/16); got != want {
		t.Errorf("limit of w0: got %d, want %d", got, want)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP usher_routing_cache_limit_bytes Prompt bytes cache_aware counts as held by the worker: max_bytes_per_worker until the engine's reported cached tokens showed a smaller cache, then what it was found to keep.
# TYPE usher_routing_cache_limit_bytes gauge
usher_routing_cache_limit_bytes{model="m",worker="w0"} 4250
`), "usher_routing_cache_limit_bytes"); err != nil {
		t.Error(err)
	}
	const metric = "usher_routing_cache_prediction_error_ratio"
	if n, err := testutil.GatherAndCount(reg, metric); err != nil || n != 1 {
		t.Fatalf("%s: got %d series (%v), want 1", metric, n, err)
	}
	h := ca.predictionError.(interface{ Write(*dto.Metric) error })
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetHistogram().GetSampleCount(); got != 3 {
		t.Errorf("%s count: got %d, want 3", metric, got)
	}
	if got := m.GetHistogram().GetSampleSum(); got != 0.5 {
		t.Errorf("%s sum: got %v, want 0.5", metric, got)
	}
}

// TestCacheAwareDroppedPrefixGoesHome: a prefix past its worker's learned limit no longer counts
// as held, yet goes back to that worker rather than to an emptier one.
func TestCacheAwareDroppedPrefixGoesHome(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{})
	ws := cacheWorkers(t, 2)
	a, b := strings.Repeat("a", 1000), strings.Repeat("b", 1000)
	for _, p := range []string{a, b} {
		clock.advance(time.Second)
		// Both on w0: it is the first idle worker and holds them.
		c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, []*Worker{ws[0]})
	}
	clock.advance(time.Second)
	_, _, pred := c.pickLearning(context.Background(), choice{Request: &Request{Model: "m", Prompt: b}}, ws)
	c.learn(pred, Outcome{PromptTokens: 250, CachedTokens: 249, CacheReported: true}) // right: nothing moves
	c.tree.workers[0].limit, c.tree.limited = 1000, 1
	c.tree.workers[0].horizon = c.tree.horizon(0, 1000)

	clock.advance(time.Second)
	w, route, pred := c.pickLearning(context.Background(), choice{Request: &Request{Model: "m", Prompt: a + "?"}}, ws)
	if w != ws[0] || route != RouteCacheAffinity {
		t.Errorf("dropped prefix: got %s by %s, want w0 by %s", w.ID(), route, RouteCacheAffinity)
	}
	if pred.held != 0 {
		t.Errorf("prediction of a dropped prefix: got %d bytes held, want 0", pred.held)
	}
	clock.advance(time.Second)
	if w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: "zzz"}}, ws); w != ws[1] || route != RouteCacheMiss {
		t.Errorf("new prefix: got %s by %s, want w1 by %s", w.ID(), route, RouteCacheMiss)
	}
}
