package routing

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cacheClock is a fake clock for CacheAware: it moves only when a test says so.
type cacheClock struct{ ns atomic.Int64 }

func (c *cacheClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *cacheClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// cacheWorkers returns n idle workers w0..w(n-1) of model m, with the default caps, from a pool of
// their own that runs nothing.
func cacheWorkers(t testing.TB, n int) []*Worker {
	t.Helper()
	p, _ := newTestPool(t, Config{Workers: testWorkers(n, "m")})
	return modelWorkers(t, p, "m")
}

func newTestCacheAware(t testing.TB, cfg CacheAwareConfig) (*CacheAware, *cacheClock) {
	t.Helper()
	clock := &cacheClock{}
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c, err := NewCacheAware(cfg, clock.now)
	if err != nil {
		t.Fatalf("NewCacheAware: %v", err)
	}
	return c, clock
}

func TestCacheAwareConfig(t *testing.T) {
	var def CacheAwareConfig
	def.SetDefaults()
	want := CacheAwareConfig{Threshold: 0.5, BalanceAbsThreshold: 8, BalanceRelThreshold: 1.5,
		MaxBytesPerWorker: 1 << 20, EvictionInterval: 10 * time.Second, EvictNowFactor: 2, ShareInterval: 50 * time.Millisecond,
		Placement: PlacementThresholds}
	if def != want {
		t.Errorf("defaults: got %+v, want %+v", def, want)
	}
	tests := []struct {
		name    string
		cfg     CacheAwareConfig
		wantErr []string
	}{
		{name: "zero takes defaults", cfg: CacheAwareConfig{}},
		{name: "full", cfg: CacheAwareConfig{Threshold: 1, BalanceAbsThreshold: 1, BalanceRelThreshold: 1,
			MaxBytesPerWorker: 1, EvictionInterval: time.Millisecond, EvictNowFactor: 1}},
		{name: "threshold above 1", cfg: CacheAwareConfig{Threshold: 1.2},
			wantErr: []string{"cache_aware.threshold: must be in (0, 1]"}},
		{name: "negative threshold", cfg: CacheAwareConfig{Threshold: -0.1},
			wantErr: []string{"cache_aware.threshold: must be in (0, 1]"}},
		{name: "placement by prediction", cfg: CacheAwareConfig{Placement: PlacementPredictedTTFT}},
		{name: "unknown placement", cfg: CacheAwareConfig{Placement: "fastest"},
			wantErr: []string{"cache_aware.placement: must be thresholds or predicted_ttft"}},
		{name: "everything negative", cfg: CacheAwareConfig{BalanceAbsThreshold: -1, BalanceRelThreshold: 0.5,
			MaxBytesPerWorker: -1, EvictionInterval: -time.Second, EvictNowFactor: 0.9, ShareInterval: -time.Second},
			wantErr: []string{
				"cache_aware.balance_abs_threshold: must not be negative",
				"cache_aware.balance_rel_threshold: must be at least 1",
				"cache_aware.max_bytes_per_worker: must be positive",
				"cache_aware.eviction_interval: must be positive",
				"cache_aware.evict_now_factor: must be at least 1",
				"cache_aware.share_interval: must be positive",
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := tt.cfg
			cfg.SetDefaults()
			err := cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("got error %q, want it to contain %q", err, w)
				}
			}
			if _, err := NewCacheAware(tt.cfg, nil); err == nil {
				t.Errorf("NewCacheAware: got no error, want one")
			}
		})
	}
}

func TestCacheAwareImbalanceTest(t *testing.T) {
	c, _ := newTestCacheAware(t, CacheAwareConfig{BalanceAbsThreshold: 32, BalanceRelThreshold: 1.5})
	tests := []struct {
		load, min int64
		want      bool
	}{
		{0, 0, false},
		{32, 0, false},    // absolute gap not above 32
		{33, 0, true},     // both tests hold
		{140, 100, false}, // gap 40 > 32, but 140 is not above 1.5 × 100
		{151, 100, true},
		{150, 100, false},
	}
	for _, tt := range tests {
		if got := c.overloaded(tt.load, tt.min); got != tt.want {
			t.Errorf("overloaded(%d, min %d): got %v, want %v", tt.load, tt.min, got, tt.want)
		}
	}
}

func TestCacheAwarePick(t *testing.T) {
	docA := strings.Repeat("a", 100)
	type held struct {
		worker int
		prompt string
	}
	tests := []struct {
		name   string
		held   []held
		loads  [4]int64
		tokens [4]int64
		setup  func(ws []*Worker, r *Request)
		prompt string
		want   int
		route  Route
	}{
		{name: "cold start goes to the first idle worker", prompt: docA, want: 0, route: RouteCacheMiss},
		{name: "warm worker takes a prompt it mostly holds",
			held: []held{{2, docA + "q1"}}, prompt: docA + "q2", want: 2, route: RouteCacheHit},
		{name: "below threshold goes to the least loaded",
			held: []held{{2, docA}}, loads: [4]int64{3, 1, 2, 5},
			prompt: docA[:40] + strings.Repeat("z", 100), want: 1, route: RouteCacheMiss},
		{name: "a match of exactly the threshold is a hit",
			held: []held{{3, docA[:50]}}, loads: [4]int64{0, 0, 0, 1},
			prompt: docA[:50] + strings.Repeat("z", 50), want: 3, route: RouteCacheHit},
		{name: "one byte short of the threshold is a miss",
			held: []held{{3, docA[:49]}}, loads: [4]int64{0, 0, 0, 1},
			prompt: docA[:49] + strings.Repeat("z", 51), want: 0, route: RouteCacheMiss},
		{name: "balanced load keeps a busier warm worker",
			held: []held{{2, docA}}, loads: [4]int64{0, 0, 30, 0}, prompt: docA + "?", want: 2, route: RouteCacheHit},
		{name: "holders of the same prefix: the lighter one",
			held: []held{{1, docA}, {2, docA}}, loads: [4]int64{0, 5, 2, 0}, prompt: docA + "?", want: 2, route: RouteCacheHit},
		{name: "holders of the same prefix and load: the most recent",
			held: []held{{2, docA}, {1, docA}}, prompt: docA + "?", want: 1, route: RouteCacheHit},
		{name: "the longest match wins over a lighter shorter one",
			held: []held{{1, docA + " question one"}, {2, docA}}, loads: [4]int64{0, 10, 0, 0},
			prompt: docA + " question one, more", want: 1, route: RouteCacheHit},
		{name: "imbalanced: a lighter warm worker beats the cold least loaded",
			held: []held{{1, docA + " question one"}, {2, docA}}, loads: [4]int64{0, 40, 5, 0},
			prompt: docA + " question one, more", want: 2, route: RouteCacheRebalance},
		{name: "imbalanced elsewhere: the best holder is not overloaded and keeps it",
			held: []held{{1, docA}}, loads: [4]int64{40, 0, 0, 0}, prompt: docA + "?", want: 1, route: RouteCacheHit},
		{name: "imbalanced and no light warm worker: the least loaded",
			held: []held{{1, docA}}, loads: [4]int64{3, 40, 1, 2}, prompt: docA + "?", want: 2, route: RouteCacheLoadFallback},
		{name: "imbalanced, the light holders hold too little: the least loaded",
			held: []held{{1, docA}, {2, docA[:10]}}, loads: [4]int64{3, 40, 1, 0}, prompt: docA + "?", want: 3, route: RouteCacheLoadFallback},
		{name: "absolute gap without the relative one is balanced",
			held: []held{{1, docA}}, loads: [4]int64{100, 140, 100, 100}, prompt: docA + "?", want: 1, route: RouteCacheHit},
		{name: "an ineligible worker's load does not make the pool imbalanced",
			loads: [4]int64{100, 1, 0, 2}, prompt: "zzz", want: 2, route: RouteCacheMiss,
			setup: func(ws []*Worker, _ *Request) { ws[0].draining.Store(true) }},
		{name: "an ineligible worker is not the least loaded",
			loads: [4]int64{1, 9, 0, 2}, prompt: "zzz", want: 0, route: RouteCacheMiss,
			setup: func(ws []*Worker, _ *Request) { markDown(ws[2]) }},
		{name: "a draining best holder is skipped for the next holder",
			held: []held{{1, docA + "xyz"}, {2, docA}}, prompt: docA + "xyz", want: 2, route: RouteCacheHit,
			setup: func(ws []*Worker, _ *Request) { ws[1].draining.Store(true) }},
		{name: "an excluded best holder is skipped",
			held: []held{{1, docA + "xyz"}, {2, docA}}, prompt: docA + "xyz", want: 2, route: RouteCacheHit,
			setup: func(_ []*Worker, r *Request) { r.Exclude = []string{"w1"} }},
		{name: "an unhealthy only holder leaves a miss",
			held: []held{{1, docA}}, prompt: docA, want: 0, route: RouteCacheMiss,
			setup: func(ws []*Worker, _ *Request) { markDown(ws[1]) }},
		{name: "cold ties go to the smallest mirrored cache",
			held:   []held{{0, strings.Repeat("b", 100)}, {1, strings.Repeat("c", 50)}, {2, "dddd"}, {3, strings.Repeat("e", 20)}},
			prompt: "zzz", want: 2, route: RouteCacheMiss},
		{name: "cold load ties go to the fewest tokens in flight",
			loads: [4]int64{1, 1, 1, 1}, tokens: [4]int64{500, 200, 300, 100}, prompt: "zzz", want: 3, route: RouteCacheMiss},
		{name: "empty prompt goes to the least loaded",
			held: []held{{0, docA}}, loads: [4]int64{2, 1, 3, 4}, prompt: "", want: 1, route: RouteCacheMiss},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, clock := newTestCacheAware(t, CacheAwareConfig{BalanceAbsThreshold: 32})
			ws := cacheWorkers(t, 4)
			for _, h := range tt.held {
				clock.advance(time.Second)
				treePutIn(c.tree, anonymous, ws[h.worker].ID(), h.prompt, clock.now().UnixNano())
			}
			for i, w := range ws {
				w.inFlight.Store(tt.loads[i])
				w.inFlightTokens.Store(tt.tokens[i])
			}
			r := &Request{Model: "m", Prompt: tt.prompt}
			if tt.setup != nil {
				tt.setup(ws, r)
			}
			w, route := c.Pick(context.Background(), choice{Request: r}, ws)
			if w == nil {
				t.Fatalf("got no worker, want w%d", tt.want)
			}
			if w != ws[tt.want] || route != tt.route {
				t.Errorf("got %s by %s, want w%d by %s", w.ID(), route, tt.want, tt.route)
			}
			if got := treeHoldings(c.tree, tt.prompt)[w.ID()]; got != len(tt.prompt) {
				t.Errorf("after the pick %s holds %d bytes of the prompt, want %d", w.ID(), got, len(tt.prompt))
			}
			checkTree(t, c.tree)
		})
	}
}

// slowPrefill is a law like steps but with a CPU engine's prefill: 8 s per thousand prompt tokens.
var slowPrefill = func() costLaw { l := steps; l.perKToken = 8 * time.Second; return l }()

// TestCacheAwarePredictedTTFT: once both workers' cost models predict, a warm worker with a
// queue and a cold idle one are weighed in predicted TTFT, whatever the balance thresholds say.
// w0 holds all but the question of the prompt on a 4-slot engine; w1 holds nothing and is idle.
// Without the cost models (a cold start), the heuristic decides as before.
func TestCacheAwarePredictedTTFT(t *testing.T) {
	doc := strings.Repeat("d", 4000)
	prompt := doc + " question?"
	tests := []struct {
		name       string
		warm, cold *costLaw // the laws each worker's model learnt; nil: it learnt nothing
		warmLoad   int64    // requests in flight on w0 (4 slots); w1 has none
		waiting    int      // Request.Waiting: requests queued behind this one
		placement  string   // CacheAwareConfig.Placement; empty: predicted_ttft
		want       int
		route      Route
	}{
		// Balanced by the thresholds (a gap of 6 <= 8): the heuristic keeps the cache hit on
		// w0, where the request waits 3 requests' service (~1.2 s) to save ~100 ms of prefill.
		{name: "a warm worker whose queue costs more than the prefill it saves loses to a cold idle one",
			warm: &steps, cold: &steps, warmLoad: 6, want: 1, route: RoutePredictedTTFT},
		// With 4 requests queued behind it, the ~100 ms of prefill w1 would compute again delays
		// each of them by half of it (two workers): w1 costs ~0.3 s in all, less than w0's queue.
		{name: "a short queue behind the request still leaves it to the cold idle worker",
			warm: &steps, cold: &steps, warmLoad: 6, waiting: 4, want: 1, route: RoutePredictedTTFT},
		// With 40 queued, the prefill computed again would delay them by ~2 s in all: more than
		// w0's queue costs the request, so the worker that holds the prompt takes it.
		{name: "a long queue behind the request makes the prefill a cold worker computes again cost more than the warm one's queue",
			warm: &steps, cold: &steps, warmLoad: 6, waiting: 40, want: 0, route: RoutePredictedTTFT},
		// Imbalanced by the thresholds (12 against 0): the heuristic sends it to w1, where its
		// prefill takes ~8 s; behind w0's queue of 9 (~3.6 s) the cached prompt costs little.
		{name: "a warm worker whose saved prefill is worth more than its queue wins over a cold idle one",
			warm: &slowPrefill, cold: &slowPrefill, warmLoad: 12, want: 0, route: RoutePredictedTTFT},
		{name: "the cold worker prefills slowly: the queued warm one wins",
			warm: &steps, cold: &slowPrefill, warmLoad: 12, want: 0, route: RoutePredictedTTFT},
		{name: "while a worker cannot predict, the thresholds decide",
			warm: &steps, warmLoad: 6, want: 0, route: RouteCacheHit},
		{name: "by default the thresholds decide though every worker predicts",
			warm: &steps, cold: &steps, warmLoad: 6, placement: PlacementThresholds, want: 0, route: RouteCacheHit},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			placement := cmp.Or(tt.placement, PlacementPredictedTTFT)
			c, clock := newTestCacheAware(t, CacheAwareConfig{Placement: placement})
			ws := cacheWorkers(t, 2)
			rng := rand.New(rand.NewPCG(1, 2))
			for i, law := range []*costLaw{tt.warm, tt.cold} {
				for range 400 {
					if law == nil {
						break
					}
					pl := randomPlacement(rng)
					ws[i].cost.observe(pl, pl.running, law.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.05))
				}
				ws[i].slots.Store(4)
			}
			clock.advance(time.Second)
			treePutIn(c.tree, anonymous, ws[0].ID(), doc, clock.now().UnixNano())
			ws[0].inFlight.Store(tt.warmLoad)
			r := &Request{Model: "m", Prompt: prompt, PromptTokens: 1000, Waiting: tt.waiting}
			w, route := c.Pick(context.Background(), choice{Request: r}, ws)
			if w == nil {
				t.Fatalf("got no worker, want w%d", tt.want)
			}
			if w != ws[tt.want] || route != tt.route {
				t.Errorf("got %s by %s, want w%d by %s", w.ID(), route, tt.want, tt.route)
			}
			checkTree(t, c.tree)
		})
	}
}

// TestCacheAwarePlacementWeighsTheSequencesItDelays: by predicted TTFT, a prompt goes to the worker
// holding half of it (~75 ms there against ~115 ms on an idle cold one) only while that worker
// runs nothing else: with 20 sequences running there, each would wait through its ~50 ms prefill
// and share its decode steps, which costs more than the request gains.
func TestCacheAwarePlacementWeighsTheSequencesItDelays(t *testing.T) {
	half := strings.Repeat("h", 2000)
	prompt := half + strings.Repeat("q", 2000)
	for _, tt := range []struct {
		name    string
		running int64 // requests in flight on w0, which holds half the prompt; w1 runs none
		want    int
	}{
		{name: "nothing running beside it: the worker holding half the prompt", running: 0, want: 0},
		{name: "twenty sequences running beside it: the idle cold worker", running: 20, want: 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, clock := newTestCacheAware(t, CacheAwareConfig{Placement: PlacementPredictedTTFT})
			ws := cacheWorkers(t, 2)
			rng := rand.New(rand.NewPCG(3, 4))
			for _, w := range ws {
				for range 400 {
					pl := randomPlacement(rng)
					w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.05))
				}
				w.slots.Store(64)
			}
			clock.advance(time.Second)
			treePutIn(c.tree, anonymous, ws[0].ID(), half, clock.now().UnixNano())
			ws[0].inFlight.Store(tt.running)
			r := &Request{Model: "m", Prompt: prompt, PromptTokens: 1000}
			w, route := c.Pick(context.Background(), choice{Request: r}, ws)
			if w != ws[tt.want] || route != RoutePredictedTTFT {
				got := "none"
				if w != nil {
					got = w.ID()
				}
				t.Errorf("got %s by %s, want w%d by %s", got, route, tt.want, RoutePredictedTTFT)
			}
		})
	}
}

// TestCacheAwareFollowsItsOwnInserts routes groups of prompts that share a system prompt with no
// tree set up by hand: each group settles on a worker, groups spread over idle workers.
func TestCacheAwareFollowsItsOwnInserts(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{})
	ws := cacheWorkers(t, 4)
	systems := []string{strings.Repeat("system one. ", 20), strings.Repeat("system two. ", 20), strings.Repeat("system three. ", 20)}
	first := map[int]*Worker{}
	for i := range 30 {
		clock.advance(time.Millisecond)
		g := i % len(systems)
		w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: fmt.Sprintf("%squestion %d", systems[g], i)}}, ws)
		if prev, ok := first[g]; !ok {
			if route != RouteCacheMiss {
				t.Errorf("request %d, first of group %d: got route %s, want %s", i, g, route, RouteCacheMiss)
			}
			for og, ow := range first {
				if ow == w {
					t.Errorf("group %d went to %s, already group %d's worker", g, w.ID(), og)
				}
			}
			first[g] = w
		} else if w != prev || route != RouteCacheHit {
			t.Errorf("request %d of group %d: got %s by %s, want %s by %s", i, g, w.ID(), route, prev.ID(), RouteCacheHit)
		}
	}
}

func TestCacheAwareEvictsLeastRecentlyUsed(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 100, EvictNowFactor: 10})
	ws := cacheWorkers(t, 1)
	prompts := []string{strings.Repeat("1", 40), strings.Repeat("2", 40), strings.Repeat("3", 40), strings.Repeat("4", 40)}
	for _, p := range append(prompts, prompts[0]) {
		clock.advance(time.Second)
		c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, ws)
	}
	if got, _, _ := c.CachedBytes("w0"); got != 160 {
		t.Fatalf("before eviction: got %d bytes, want 160", got)
	}
	if got := c.Evict(); got != 2 {
		t.Errorf("Evict: released %d entries, want 2", got)
	}
	checkTree(t, c.tree)
	for i, want := range []bool{true, false, false, true} {
		if got := treeHoldings(c.tree, prompts[i])["w0"] == 40; got != want {
			t.Errorf("prompt %d kept: got %v, want %v", i, got, want)
		}
	}
	if got, nodes, total := c.CachedBytes("w0"); got != 80 || nodes != 2 || total != 80 {
		t.Errorf("after eviction: got %d bytes, %d nodes, %d tree bytes; want 80, 2, 80", got, nodes, total)
	}
	if got := c.Evict(); got != 0 {
		t.Errorf("second Evict: released %d entries, want 0", got)
	}
}

func TestCacheAwareHardCap(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 100, EvictNowFactor: 1.5})
	ws := cacheWorkers(t, 1)
	for i := range 20 {
		clock.advance(time.Second)
		p := fmt.Sprintf("%02d%s", i, strings.Repeat("x", 38))
		c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, ws)
		if got, _, _ := c.CachedBytes("w0"); got > 150 {
			t.Fatalf("after pick %d: got %d bytes, want at most 150", i, got)
		}
		if got := treeHoldings(c.tree, p)["w0"]; got != len(p) {
			t.Fatalf("after pick %d: the newest prompt was evicted (%d bytes held)", i, got)
		}
	}
	if len(c.wake) != 1 {
		t.Errorf("Run was not woken after the hard cap")
	}
	checkTree(t, c.tree)
}

func TestCacheAwareLongPromptKeepsOnlyItsHead(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 100, EvictNowFactor: 2})
	ws := cacheWorkers(t, 1)
	for _, p := range []string{strings.Repeat("a", 50), strings.Repeat("b", 50), strings.Repeat("c", 500)} {
		clock.advance(time.Second)
		c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, ws)
	}
	got := treeHoldings(c.tree, strings.Repeat("c", 500))["w0"]
	if got != 100 {
		t.Errorf("long prompt: got %d bytes mirrored, want its first 100", got)
	}
	for _, p := range []string{strings.Repeat("a", 50), strings.Repeat("b", 50)} {
		if got := treeHoldings(c.tree, p)["w0"]; got != 50 {
			t.Errorf("prompt %.1s...: got %d bytes kept, want 50 (within the hard cap)", p, got)
		}
	}
	if w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: strings.Repeat("c", 150)}}, ws); w != ws[0] || route != RouteCacheHit {
		t.Errorf("the head of the long prompt: got %s by %s, want w0 by %s", w.ID(), route, RouteCacheHit)
	}
	checkTree(t, c.tree)
}

func TestCacheAwareRunTrimsWhenWoken(t *testing.T) {
	c, _ := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 100, EvictNowFactor: 1, EvictionInterval: time.Hour})
	ws := cacheWorkers(t, 2)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	// Grow w1 behind the policy's back, then let one Pick on w0 cross the hard cap and wake Run.
	c.mu.Lock()
	treePutIn(c.tree, anonymous, "w1", strings.Repeat("y", 300), 0)
	c.mu.Unlock()
	ws[1].draining.Store(true)
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: strings.Repeat("x", 80)}}, ws)
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: strings.Repeat("z", 80)}}, ws)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, _, _ := c.CachedBytes("w1")
		if got <= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("w1 still mirrors %d bytes 5s after the wake, want at most 100", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func TestCacheAwareWorkersChanged(t *testing.T) {
	c, _ := newTestCacheAware(t, CacheAwareConfig{})
	ws := cacheWorkers(t, 3)
	prompt := strings.Repeat("shared system prompt ", 10) + "user turn"
	w, _ := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt}}, ws)
	if w != ws[0] {
		t.Fatalf("first pick: got %s, want w0", w.ID())
	}
	ws[1].inFlight.Store(1)
	ws[2].inFlight.Store(2)
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt, Exclude: []string{"w0"}}}, ws) // w1 warms too

	without := []*Worker{ws[1], ws[2]} // the pool's new snapshot
	c.WorkersChanged(without)
	if got, _, _ := c.CachedBytes("w0"); got != 0 {
		t.Errorf("w0 after removal: got %d bytes, want 0", got)
	}
	checkTree(t, c.tree)
	if got := treeHoldings(c.tree, prompt); len(got) != 1 || got["w1"] != len(prompt) {
		t.Errorf("holdings after removal: got %v, want only w1 with %d", got, len(prompt))
	}

	if w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt}}, without); w != ws[1] || route != RouteCacheHit {
		t.Errorf("without w0: got %s by %s, want w1 by %s", w.ID(), route, RouteCacheHit)
	}
	again := cacheWorkers(t, 1)[0]
	ws[1].inFlight.Store(1)
	with := []*Worker{again, ws[1], ws[2]}
	c.WorkersChanged(with)
	if w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: "something new"}}, with); w != again || route != RouteCacheMiss {
		t.Errorf("new w0, cold prompt: got %s by %s, want the new w0 by %s", w.ID(), route, RouteCacheMiss)
	}
	if w, route := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt}}, with); w != ws[1] || route != RouteCacheHit {
		t.Errorf("new w0, old prompt: got %s by %s, want w1 by %s (the new w0 inherits nothing)", w.ID(), route, RouteCacheHit)
	}
	c.WorkersChanged(nil) // the model lost its last worker
	if _, nodes, total := c.CachedBytes(""); nodes != 0 || total != 0 {
		t.Errorf("after the last worker left: got %d nodes of %d bytes, want none", nodes, total)
	}
}

func TestCacheAwareForgetsWorkersMissingFromTheSnapshot(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{EvictionInterval: time.Minute})
	ws := cacheWorkers(t, 2)
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: "alpha!"}}, ws)
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: "bravo!"}}, ws)
	c.Evict()
	if got, _, _ := c.CachedBytes("w1"); got != 6 {
		t.Fatalf("w1 in the snapshot: got %d bytes, want 6", got)
	}
	// The pool drops w1 without telling the policy.
	c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: "alpha!"}}, ws[:1])
	for _, step := range []struct {
		advance time.Duration
		want    int64
	}{{0, 6}, {59 * time.Second, 6}, {time.Second, 0}} {
		clock.advance(step.advance)
		c.Evict()
		if got, _, _ := c.CachedBytes("w1"); got != step.want {
			t.Errorf("after %s more: got %d bytes for w1, want %d", step.advance, got, step.want)
		}
	}
	if got, _, _ := c.CachedBytes("w0"); got != 6 {
		t.Errorf("w0: got %d bytes, want 6", got)
	}
	checkTree(t, c.tree)
}

// TestCacheAwareSharedPrefixLoad simulates, tick by tick, four workers serving 16 system
// prompts of skewed popularity, each request staying in flight 10 to 40 ticks: with the defaults,
// the prompts stay on few workers and the load stays close to the mean.
func TestCacheAwareSharedPrefixLoad(t *testing.T) {
	const groups, ticks, perTick = 16, 2000, 4
	c, _ := newTestCacheAware(t, CacheAwareConfig{})
	ws := cacheWorkers(t, 4)
	rnd := rand.New(rand.NewPCG(1, 2))
	systems := make([]string, groups)
	for g := range systems {
		systems[g] = strings.Repeat(fmt.Sprintf("system prompt %d. ", g), 60)
	}
	type job struct {
		w   *Worker
		end int
	}
	var jobs []job
	servedBy := make([]map[*Worker]bool, groups) // the workers each group has been sent to
	repeats, picks := 0, 0
	var sumMax, sumMean float64
	for tick := range ticks {
		kept := jobs[:0]
		for _, j := range jobs {
			if j.end > tick {
				kept = append(kept, j)
			} else {
				j.w.inFlight.Add(-1)
			}
		}
		jobs = kept
		for range perTick {
			g := min(groups-1, int(rnd.ExpFloat64()*3))
			w, _ := c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: fmt.Sprintf("%squestion %d", systems[g], rnd.IntN(1e6))}}, ws)
			if servedBy[g] == nil {
				servedBy[g] = map[*Worker]bool{}
			}
			if servedBy[g][w] {
				repeats++
			}
			servedBy[g][w] = true
			picks++
			w.inFlight.Add(1)
			jobs = append(jobs, job{w, tick + 10 + rnd.IntN(31)})
		}
		var top, sum int64
		for _, w := range ws {
			top, sum = max(top, w.InFlight()), sum+w.InFlight()
		}
		sumMax, sumMean = sumMax+float64(top), sumMean+float64(sum)/float64(len(ws))
	}
	pairs, seen := 0, 0
	for _, m := range servedBy {
		if m != nil {
			pairs, seen = pairs+len(m), seen+1
		}
	}
	warm, ratio, spread := float64(repeats)/float64(picks), sumMax/sumMean, float64(pairs)/float64(seen)
	t.Logf("requests to a worker already warm for their prompt %.3f, mean max/mean load %.2f, workers per prompt %.2f", warm, ratio, spread)
	if warm < 0.99 || ratio > 1.25 || spread > 3 {
		t.Errorf("got warm %.3f, load max/mean %.2f, workers per prompt %.2f; want >= 0.99, <= 1.25, <= 3", warm, ratio, spread)
	}
}

// TestCacheAwareConcurrent runs Picks, evictions and removals together; run with -race.
func TestCacheAwareConcurrent(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 2000, EvictNowFactor: 2})
	ws := cacheWorkers(t, 6)
	systems := []string{strings.Repeat("alpha ", 30), strings.Repeat("beta ", 30), strings.Repeat("gamma ", 30), ""}
	var picked atomic.Int64
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(g), 9))
			for i := range 400 {
				clock.advance(time.Millisecond)
				r := &Request{Model: "m", Prompt: fmt.Sprintf("%sq%d", systems[rnd.IntN(len(systems))], rnd.IntN(50))}
				w, _ := c.Pick(context.Background(), choice{Request: r}, ws)
				if w == nil || !r.Eligible(w) {
					t.Errorf("goroutine %d, pick %d: got %v, want an eligible worker", g, i, w)
					return
				}
				w.inFlight.Store(int64(rnd.IntN(60)))
				picked.Add(1)
			}
		})
	}
	wg.Go(func() {
		for i := range 100 {
			c.Evict()
			if i%25 == 0 {
				c.WorkersChanged(ws[i/25+1:])
			}
			c.CachedBytes("w5")
		}
	})
	wg.Wait()
	if got := picked.Load(); got != 6*400 {
		t.Errorf("got %d picks, want %d", got, 6*400)
	}
	checkTree(t, c.tree)
	for _, w := range c.tree.workers {
		if w != nil && w.bytes > 4000 {
			t.Errorf("worker %s mirrors %d bytes, over the hard cap 4000", w.id, w.bytes)
		}
	}
}
