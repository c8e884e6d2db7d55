package routing

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerPolicy("cache_aware", func(env policyEnv) (Policy, error) {
		c, err := NewCacheAware(env.cfg.CacheAware, env.now)
		if err != nil {
			return nil, err
		}
		c.predictionError = env.metrics.cachePredictionError.WithLabelValues(env.model)
		c.scope = env.scope
		if env.prefixes != nil && !c.cfg.Local {
			c.share = newShare(env.prefixes, env)
		}
		return c, nil
	})
}

// Routes of the cache_aware policy.
const (
	// RouteCacheHit: load is balanced (or the worker is not overloaded) and the worker holds the
	// longest prefix of the prompt, at least CacheAwareConfig.Threshold of it.
	RouteCacheHit Route = "cache_hit"
	// RouteCacheMiss: no eligible worker holds Threshold of the prompt; the least loaded worker
	// took it (ties: the one mirroring the smallest cache).
	RouteCacheMiss Route = "cache_miss"
	// RouteCacheRebalance: load is imbalanced and the worker holding the longest prefix is
	// overloaded; a worker that is not overloaded but also holds Threshold of the prompt took it.
	RouteCacheRebalance Route = "cache_rebalance"
	// RouteCacheLoadFallback: load is imbalanced and no worker that is not overloaded holds Threshold
	// of the prompt; the least loaded worker took it.
	RouteCacheLoadFallback Route = "load_fallback"
	// RouteCacheAffinity: no eligible worker still holds Threshold of the prompt, but one held it
	// until its engine, smaller than MaxBytesPerWorker, dropped it; that worker took it (among
	// those that are not overloaded, when imbalanced), so the prompts sharing the prefix keep
	// meeting on one worker.
	RouteCacheAffinity Route = "cache_affinity"
	// RoutePredictedTTFT: every eligible worker's cost model predicts, and the worker with the
	// least predicted time to first token took it, its cached share of the prompt as the tree
	// mirrors it (see CacheAware).
	RoutePredictedTTFT Route = "predicted_ttft"
)

// Defaults of CacheAwareConfig, applied by SetDefaults to zero fields.
const (
	DefaultCacheThreshold      = 0.5     // SGLang's cache_threshold
	DefaultBalanceAbsThreshold = 8       // requests; see CacheAwareConfig
	DefaultBalanceRelThreshold = 1.5     // SGLang's balance_rel_threshold
	DefaultMaxBytesPerWorker   = 1 << 20 // prompt bytes; see CacheAwareConfig
	DefaultEvictionInterval    = 10 * time.Second
	DefaultEvictNowFactor      = 2
	DefaultShareInterval       = 50 * time.Millisecond
)

// CacheAwareConfig holds the parameters of the cache_aware policy. Zero fields take the defaults
// above (so a threshold of exactly 0 cannot be set; use a small value such as 0.01).
type CacheAwareConfig struct {
	// Threshold is the share of the prompt (matched bytes / prompt bytes) a worker must already
	// hold for the prompt to follow its cache; below it the request goes to the least loaded
	// worker. In (0, 1]; default 0.5.
	Threshold float64 `yaml:"threshold"`
	// BalanceAbsThreshold and BalanceRelThreshold define imbalance over the eligible workers'
	// in-flight requests: imbalanced when max-min > BalanceAbsThreshold AND max >
	// min*BalanceRelThreshold. A worker is overloaded when the same test holds for its own load
	// in place of max. Defaults 8 and 1.5; Abs >= 0 (0 is taken as the default), Rel >= 1.
	//
	// The relative test decides at high load, the absolute one at low load. SGLang's router
	// defaults to 64 (older versions 32) for large fleets; with a few workers carrying tens of
	// requests each, 32 lets one worker run 1.4 to 2 times the mean load in a simulated
	// shared-prefix workload, while 8 keeps it near 1.15 at the price of copying hot prefixes
	// to more workers (TestCacheAwareSharedPrefixLoad).
	BalanceAbsThreshold int64   `yaml:"balance_abs_threshold"`
	BalanceRelThreshold float64 `yaml:"balance_rel_threshold"`
	// MaxBytesPerWorker bounds the prompt bytes the tree mirrors for each worker; the least
	// recently used prefixes go first. It is a ceiling: when a worker's engine reports
	// (usage.prompt_tokens_details.cached_tokens) holding less of a prompt than the tree
	// predicted, the policy learns the bytes that engine really keeps, and only that worker's
	// most recent entries within them count as held (see CacheAware.learn); the older ones, up
	// to the ceiling, only remember where a prefix used to live. About 4 bytes per KV-cache
	// token; a ceiling far above the engines' caches costs a few wrong predictions per worker
	// and the memory of the remembered entries. Default 1 MiB, about the 262,144 tokens the pool
	// assumes of a worker by default (a 7B model on one 80 GB GPU).
	MaxBytesPerWorker int64 `yaml:"max_bytes_per_worker"`
	// EvictionInterval is how often Run trims every worker back to MaxBytesPerWorker. Default 10s.
	EvictionInterval time.Duration `yaml:"eviction_interval"`
	// EvictNowFactor: a worker above EvictNowFactor × MaxBytesPerWorker is trimmed at once,
	// inside the Pick that grew it, back under that hard cap, and Run is woken to trim it down to
	// MaxBytesPerWorker. >= 1; default 2.
	EvictNowFactor float64 `yaml:"evict_now_factor"`
	// ShareInterval: with Redis, each replica publishes the prompts it routed (worker, cache
	// scope and prompt bytes, up to MaxBytesPerWorker each) every ShareInterval, and applies the
	// other replicas' to its own tree, so every replica's tree mirrors the whole fleet's traffic. Another
	// replica's routing is seen within ShareInterval plus a Redis round trip. Default 50ms.
	ShareInterval time.Duration `yaml:"share_interval"`
	// Local keeps the tree to this replica even with Redis: nothing is published (prompt text
	// and the tenants' and tiers' names of the cache scopes then never cross Redis) and each
	// replica sees only its own traffic.
	Local bool `yaml:"local"`
	// Placement is how a worker is chosen once the workers' cost models predict:
	// PlacementThresholds (the default) keeps the thresholds above at all times;
	// PlacementPredictedTTFT weighs cache hits and load in one currency, the delay a placement
	// costs the request, the requests running on the worker and those waiting in the queue (see
	// CacheAware). On the Mooncake trace (four kv sims, 2026-12-06) the latter's goodput was on a
	// par with the thresholds' at 0.5x, 1x and 3x capacity and 11% higher at 2x, above
	// least_request's at every load; on the shared-prefix workload 1.7% lower (hit rate 81-83%
	// against 84-87%), so it is not the default.
	Placement string `yaml:"placement"`
}

// Placements of CacheAwareConfig.
const (
	PlacementThresholds    = "thresholds"
	PlacementPredictedTTFT = "predicted_ttft"
)

// SetDefaults fills the zero fields of c.
func (c *CacheAwareConfig) SetDefaults() {
	if c.Threshold == 0 {
		c.Threshold = DefaultCacheThreshold
	}
	if c.BalanceAbsThreshold == 0 {
		c.BalanceAbsThreshold = DefaultBalanceAbsThreshold
	}
	if c.BalanceRelThreshold == 0 {
		c.BalanceRelThreshold = DefaultBalanceRelThreshold
	}
	if c.MaxBytesPerWorker == 0 {
		c.MaxBytesPerWorker = DefaultMaxBytesPerWorker
	}
	if c.EvictionInterval == 0 {
		c.EvictionInterval = DefaultEvictionInterval
	}
	if c.EvictNowFactor == 0 {
		c.EvictNowFactor = DefaultEvictNowFactor
	}
	if c.ShareInterval == 0 {
		c.ShareInterval = DefaultShareInterval
	}
	if c.Placement == "" {
		c.Placement = PlacementThresholds
	}
}

// Validate reports every invalid field of c (after SetDefaults), each error naming its field.
func (c CacheAwareConfig) Validate() error {
	return errors.Join(c.validate("cache_aware")...)
}

// validate reports the problems of c, each naming its field below prefix (e.g.
// `routing.models["m"].cache_aware`).
func (c CacheAwareConfig) validate(prefix string) []error {
	var errs []error
	bad := func(field, msg string) { errs = append(errs, fmt.Errorf("%s.%s: %s", prefix, field, msg)) }
	if math.IsNaN(c.Threshold) || c.Threshold <= 0 || c.Threshold > 1 {
		bad("threshold", "must be in (0, 1]")
	}
	if c.BalanceAbsThreshold < 0 {
		bad("balance_abs_threshold", "must not be negative")
	}
	if math.IsNaN(c.BalanceRelThreshold) || c.BalanceRelThreshold < 1 {
		bad("balance_rel_threshold", "must be at least 1")
	}
	if c.MaxBytesPerWorker <= 0 {
		bad("max_bytes_per_worker", "must be positive")
	}
	if c.EvictionInterval <= 0 {
		bad("eviction_interval", "must be positive")
	}
	if math.IsNaN(c.EvictNowFactor) || c.EvictNowFactor < 1 {
		bad("evict_now_factor", "must be at least 1")
	}
	if c.Placement != PlacementThresholds && c.Placement != PlacementPredictedTTFT {
		bad("placement", fmt.Sprintf("must be %s or %s", PlacementThresholds, PlacementPredictedTTFT))
	}
	if c.ShareInterval <= 0 {
		bad("share_interval", "must be positive")
	}
	return errs
}

// evictBatch bounds the entries one eviction step releases under the lock, so a large trim by Run
// lets Picks in between.
const evictBatch = 1024

// CacheAware is the cache_aware policy: it routes a prompt to the worker that most likely holds
// its prefix in its KV cache, as long as the load stays balanced. One CacheAware serves one model.
//
// Pick, with the eligible workers' in-flight requests (ties: in-flight tokens) as load:
//
//  1. Imbalanced (see CacheAwareConfig.BalanceAbsThreshold)? A worker is overloaded when its
//     load passes the same test against the minimum.
//  2. Balanced: the worker holding the longest prefix of the prompt takes it if that prefix is at
//     least Threshold of the prompt (RouteCacheHit); ties go to the least loaded, then to the
//     most recent access. Otherwise the least loaded worker takes it, ties going to the one with
//     the smallest mirrored cache so new prefixes spread (RouteCacheMiss).
//  3. Imbalanced: the same choice among workers that are not overloaded: a lighter worker that
//     also holds Threshold of the prompt is preferred to a cold one (RouteCacheHit when it is
//     the overall best match, else RouteCacheRebalance); if none holds it, the least loaded
//     worker takes it (RouteCacheLoadFallback).
//
// With Placement predicted_ttft (not the default), once the cost model of every eligible worker
// predicts (Worker.Predict: after 32 streamed answers each), cache hits and load are weighed in
// one currency instead, time, and the request goes to the worker where its placement costs the
// least (RoutePredictedTTFT). That cost is the sum of three delays:
//   - the request's own: its predicted TTFT placed there now, the worker's cached tokens being the
//     prefix the tree says it holds (entries its engine still holds only, see learn), scaled from
//     bytes to the request's estimated prompt tokens. A longer cached prefix saves prefill; the
//     running and queued requests, and the prompts in prefill, cost what the worker's model learnt
//     they cost there;
//   - this gateway's requests in flight there: each waits through the steps that prefill the
//     request's uncached tokens (at the worker's learnt prefill time per token) and shares its
//     decode steps with one more sequence (the TPOT law's cost of a running sequence) for about
//     half of the worker's mean answer length in output tokens, learnt from its answers. So the
//     TPOT a placement costs the others is weighed in the same currency, with no remaining token
//     counts to know;
//   - the requests waiting in the gateway's queue (Request.Waiting): the prompt tokens the worker
//     holds fewer of than the eligible worker holding the most are a prefill the fleet runs again,
//     which delays each of them by its share over the eligible workers. With nobody waiting this
//     term is 0; past capacity a prefix one worker holds is worth what computing it again costs
//     the queue (on the Mooncake trace at 3x capacity the placement by TTFT alone spread
//     conversations off their workers and lost to the thresholds, 2026-12-06).
//
// Ties go to the lighter worker, then to the longer cached prefix, then as above (a warm worker's
// more recent access, a cold one's smaller mirrored cache). Threshold and the balance thresholds
// then play no part; they decide while any eligible worker cannot predict yet (a cold start, a
// new worker), as steps 1-3 say.
//
// Prefixes are matched within the request's cache scope only (see CacheScope): a prompt of one
// tenant never follows, nor is told of, another tenant's prefix, unless the scope is shared.
//
// The chosen worker is then recorded as holding the prompt (its first MaxBytesPerWorker bytes), in
// the same critical section and from the same descent. The tree stays within MaxBytesPerWorker per
// worker through Run (background, least recently used first) and within EvictNowFactor times that
// at all times. What counts as held follows the engine: through the Pool, each Pick's prediction of
// the prefix the chosen worker held is compared with the cached tokens its engine reported when the
// request ends (learn); a worker whose engine held less gets a smaller limit, and only its most
// recent entries within it count as held (RouteCacheAffinity for the older ones).
//
// Locking: one mutex guards the tree and the cached slot map; every Pick writes (access times,
// inserts), so a read lock would buy nothing. A Pick holds it for one scan of the workers, one
// descent of the prompt (vectorised compares) and a walk up the matched path; Run holds it for at
// most evictBatch releases at a time. Worker loads are read atomically.
//
// Lifecycle: the owner of a CacheAware (the Pool) runs Run for as long as the policy is in use and
// calls WorkersChanged when the model's workers change. Without Run, memory still stays under the
// hard cap; without WorkersChanged, Run still forgets a worker one EvictionInterval after it left
// the snapshots.
type CacheAware struct {
	cfg  CacheAwareConfig
	now  func() time.Time
	wake chan struct{} // capacity 1: a Pick asks Run for an eviction pass now
	hard int64         // EvictNowFactor × MaxBytesPerWorker
	// predictionError observes learn's error per request; nil records nothing.
	predictionError prometheus.Observer
	// share publishes the inserts to the other gateway replicas and applies theirs; nil when
	// the tree is this replica's alone.
	share *share
	// scope keys the tree's prefixes (Config.CacheScope; the zero value isolates tenants).
	scope CacheScope

	mu   sync.Mutex // guards tree, view, members and share's pending inserts
	tree *radixTree
	view slotView
	// members are the IDs of the model's workers in the last snapshot WorkersChanged gave: the
	// only workers another replica's inserts may name.
	members map[string]bool
}

// slotView maps the workers of one snapshot to tree slots and back, so a Pick never looks a
// worker up by ID. It is rebuilt when Pick sees another snapshot or a slot was released.
type slotView struct {
	workers []*Worker // the snapshot; kept so its address cannot be reused by another one
	gen     uint64    // tree.gen when built
	slotOf  []int32   // index in workers -> slot, -1 when the worker has none yet
	indexOf []int32   // slot -> index in workers, -1 when not in workers
	// held and last are fastest's scratch, by index in workers: the prompt bytes the worker
	// holds and its last access of them (0: none). Valid only within one Pick.
	held []int
	last []int64
}

var (
	_ Policy          = (*CacheAware)(nil)
	_ workersObserver = (*CacheAware)(nil)
	_ policyRunner    = (*CacheAware)(nil)
)

// NewCacheAware returns a cache_aware policy with cfg (defaults applied to zero fields) reading
// the time from now (nil: time.Now). Start its evictions with Run.
func NewCacheAware(cfg CacheAwareConfig, now func() time.Time) (*CacheAware, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	return &CacheAware{
		cfg:  cfg,
		now:  now,
		wake: make(chan struct{}, 1),
		hard: int64(math.Min(float64(cfg.MaxBytesPerWorker)*cfg.EvictNowFactor, math.MaxInt64/2)),
		tree: newRadixTree(),
	}, nil
}

// candidate is a worker considered by Pick.
type candidate struct {
	i      int // index in the snapshot; -1 for none
	load   int64
	tokens int64
	rank   int64 // last access (warm candidates: higher wins) or mirrored bytes (cold ones: lower wins)
}

// lighter reports whether a carries less load than b.
func (a candidate) lighter(b candidate) bool {
	if a.load != b.load {
		return a.load < b.load
	}
	return a.tokens < b.tokens
}

// Pick implements Policy. It takes the policy's mutex; its cost is one pass over workers (one
// atomic load for most of them), a descent of r.Prompt and a walk back up the matched path. A
// prompt the chosen worker already holds allocates nothing; one that extends the tree costs a node
// and a copy of the new bytes, plus a node and a copy of the smaller half of a split edge.
func (c *CacheAware) Pick(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	w, route, _ := c.pick(r, workers)
	return w, route
}

// pickLearning implements outcomeLearner: Pick, and what the tree expected the chosen worker to hold.
func (c *CacheAware) pickLearning(_ context.Context, r choice, workers []*Worker) (*Worker, Route, prediction) {
	return c.pick(r, workers)
}

func (c *CacheAware) pick(r choice, workers []*Worker) (*Worker, Route, prediction) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := c.viewOf(workers)
	namespace := c.scope.namespace(r.Request)
	// A new scope gets its root only once a worker takes the prompt: none may take it.
	root := c.tree.scopeRoot(namespace, false)
	d := c.tree.descend(root, r.Prompt)

	chosen, route := candidate{i: -1}, RoutePredictedTTFT
	if c.cfg.Placement == PlacementPredictedTTFT {
		chosen = c.fastest(r, workers, v, d)
	}
	if chosen.i < 0 {
		var ok bool
		if chosen, route, ok = c.heuristic(r, workers, v, d); !ok {
			return nil, RouteCacheMiss, prediction{}
		}
	}

	slot := v.slotOf[chosen.i]
	if slot < 0 {
		slot = c.register(v, chosen.i, workers[chosen.i].ID())
	}
	pred := prediction{worker: workers[chosen.i].ID(), prompt: len(r.Prompt)}
	pred.held, pred.last = c.tree.heldBy(d, slot, c.tree.workers[slot].horizon)
	if p := r.Prompt; len(p) > 0 {
		if root == &c.tree.none {
			root = c.tree.scopeRoot(namespace, true)
			d = c.tree.descend(root, p)
		}
		if int64(len(p)) > c.cfg.MaxBytesPerWorker {
			// Mirror only the head of a prompt longer than the bound, rather than the tail of it
			// at the cost of everything else the worker holds. A rare second descent.
			p = p[:c.cfg.MaxBytesPerWorker]
			d = c.tree.descend(root, p)
		}
		c.tree.insert(p, d, slot, c.now().UnixNano())
		c.capNow(slot)
		if c.share != nil {
			c.share.add(pred.worker, namespace, p)
		}
	}
	return workers[chosen.i], route, pred
}

// fastest returns the eligible worker whose placement of r costs the least (see CacheAware),
// candidate{i: -1} when no worker is eligible or any eligible one cannot predict yet. c.mu must be
// held. Cost: one walk up the matched path, and per worker two eligibility tests, one Predict and
// a few atomic loads; no allocation.
func (c *CacheAware) fastest(r choice, workers []*Worker, v *slotView, d descent) candidate {
	c.heldByIndex(v, d)
	prompt := min(max(r.PromptTokens, 0), maxCostTokens)
	cachedOf := func(held int) int {
		if len(r.Prompt) == 0 {
			return 0
		}
		return int(int64(held) * int64(prompt) / int64(len(r.Prompt)))
	}
	mostHeld, eligible := 0, 0
	for i, w := range workers {
		if r.Eligible(w) {
			mostHeld = max(mostHeld, v.held[i])
			eligible++
		}
	}
	mostCached := cachedOf(mostHeld)
	// Each request waiting is delayed by a 1/eligible share of the work added.
	perWaiting := 0.0
	if eligible > 0 {
		perWaiting = float64(min(max(r.Waiting, 0), maxQueueWeight)) / float64(eligible)
	}
	best := candidate{i: -1}
	var bestCost time.Duration
	bestHeld := 0
	for i, w := range workers {
		if !r.Eligible(w) {
			continue
		}
		held := v.held[i]
		cached := cachedOf(held)
		p, ok := w.Predict(prompt, cached)
		if !ok {
			return candidate{i: -1}
		}
		load := w.InFlight()
		perK, _ := w.cost.prefillCost() // ms per thousand prompt tokens
		perSeq, meanOut := w.cost.decodeCost()
		// Each request running there waits through r's prefill and shares its decode steps.
		delay := perK*uncached(prompt, cached)/1000 + perSeq*meanOut/2
		cost := p.TTFT + msDuration(float64(min(max(load, 0), maxSlots))*delay)
		if extra := mostCached - cached; extra > 0 && perWaiting > 0 {
			cost += msDuration(perK * float64(extra) / 1000 * perWaiting)
		}
		cd := candidate{i: i, load: load, tokens: w.InFlightTokens(), rank: v.last[i]}
		if held == 0 {
			cd.rank = c.bytesOf(v.slotOf[i])
		}
		if best.i < 0 || cost < bestCost || cost == bestCost && cd.beats(held, best, bestHeld) {
			best, bestCost, bestHeld = cd, cost, held
		}
	}
	return best
}

// maxQueueWeight bounds the requests waiting that a placement's added work is weighed against.
const maxQueueWeight = 1 << 16

// beats orders candidates of the same cost (as fastest weighs them): the lighter, then the one
// holding more of the prompt (held bytes; b holds bHeld), then a warm one's more recent access, a
// cold one's smaller mirrored cache.
func (a candidate) beats(held int, b candidate, bHeld int) bool {
	switch {
	case a.lighter(b) || b.lighter(a):
		return a.lighter(b)
	case held != bHeld:
		return held > bHeld
	case held > 0:
		return a.rank > b.rank
	default:
		return a.rank < b.rank
	}
}

// heldByIndex sets v.held and v.last: for each worker of the snapshot, the longest prefix of the
// prompt of d it holds in entries its engine still holds (see treeWorker.horizon), and its last
// access of it. c.mu must be held. Cost: clearing two slices the size of the snapshot and a walk up
// the matched path, scanning each node's holders.
func (c *CacheAware) heldByIndex(v *slotView, d descent) {
	clear(v.held)
	clear(v.last)
	mark := func(n *node, depth int) {
		for j, s := range n.slots {
			i := v.indexOf[s]
			if i < 0 || v.held[i] > 0 || n.holders[j].last < c.tree.workers[s].horizon {
				continue
			}
			v.held[i], v.last[i] = depth, n.holders[j].last
		}
	}
	if d.child != nil {
		mark(d.child, d.matched())
	}
	for n := d.n; n.parent != nil; n = n.parent {
		mark(n, n.end)
	}
}

// heuristic is the choice while some eligible worker cannot predict: steps 1-3 of CacheAware.
// ok is false when no worker is eligible. c.mu must be held.
func (c *CacheAware) heuristic(r choice, workers []*Worker, v *slotView, d descent) (chosen candidate, route Route, ok bool) {
	least := candidate{i: -1} // least.load is the minimum load
	var maxLoad int64
	for i, w := range workers {
		load := w.InFlight()
		if least.i >= 0 && load > least.load && load <= maxLoad {
			// Changes neither the least loaded worker nor the load range, eligible or not: in a
			// large fleet most workers cost this one atomic load.
			continue
		}
		if !r.Eligible(w) {
			continue
		}
		cd := candidate{i: i, load: load, tokens: w.InFlightTokens(), rank: c.bytesOf(v.slotOf[i])}
		switch {
		case least.i < 0:
			least, maxLoad = cd, load
		case load > maxLoad:
			maxLoad = load
		case cd.lighter(least) || !least.lighter(cd) && cd.rank < least.rank:
			least = cd
		}
	}
	if least.i < 0 {
		return least, RouteCacheMiss, false
	}
	minLoad := least.load
	imbalanced := c.overloaded(maxLoad, minLoad)

	need := int(math.Ceil(c.cfg.Threshold * float64(len(r.Prompt))))
	best, light := c.warm(r, workers, v, d, max(need, 1), imbalanced, minLoad, true)

	chosen, route = least, RouteCacheMiss
	switch {
	case !imbalanced && best.i >= 0:
		chosen, route = best, RouteCacheHit
	case imbalanced && light.i >= 0 && light.i == best.i:
		chosen, route = light, RouteCacheHit
	case imbalanced && light.i >= 0:
		chosen, route = light, RouteCacheRebalance
	case c.tree.limited > 0:
		// Nobody still holds it: its last holder, if the engines dropped it, is still where its
		// next requests find each other's prefixes (a group of prompts keeps one home).
		best, light = c.warm(r, workers, v, d, max(need, 1), imbalanced, minLoad, false)
		switch {
		case !imbalanced && best.i >= 0:
			chosen, route = best, RouteCacheAffinity
		case imbalanced && light.i >= 0:
			chosen, route = light, RouteCacheAffinity
		case imbalanced:
			route = RouteCacheLoadFallback
		}
	case imbalanced:
		route = RouteCacheLoadFallback
	}
	return chosen, route, true
}

// overloaded applies the imbalance test of CacheAwareConfig to a load against the minimum.
func (c *CacheAware) overloaded(load, minLoad int64) bool {
	return load-minLoad > c.cfg.BalanceAbsThreshold && float64(load) > float64(minLoad)*c.cfg.BalanceRelThreshold
}

// warm walks up the matched path of d, deepest first, and returns the best eligible holder of at
// least need bytes (best) and, when imbalanced, the best one that is not overloaded (light). With
// held, only entries the worker's engine still holds count (see treeWorker.horizon); without, its
// dropped entries count too.
// At the deepest level where a kind of candidate appears, ties go to the lighter worker, then to
// the more recent access. The walk stops once both are found or the prefix gets shorter than need.
func (c *CacheAware) warm(r choice, workers []*Worker, v *slotView, d descent, need int, imbalanced bool, minLoad int64, held bool) (best, light candidate) {
	best, light = candidate{i: -1}, candidate{i: -1}
	level := func(n *node, depth int) bool {
		if depth < need {
			return false
		}
		foundBest, foundLight := best.i >= 0, light.i >= 0
		for j, s := range n.slots {
			i := v.indexOf[s]
			if i < 0 || !r.Eligible(workers[i]) || held && n.holders[j].last < c.tree.workers[s].horizon {
				continue
			}
			w := workers[i]
			cd := candidate{i: int(i), load: w.InFlight(), tokens: w.InFlightTokens(), rank: n.holders[j].last}
			if !foundBest && (best.i < 0 || cd.warmer(best)) {
				best = cd
			}
			if imbalanced && !foundLight && !c.overloaded(cd.load, minLoad) && (light.i < 0 || cd.warmer(light)) {
				light = cd
			}
		}
		return best.i < 0 || imbalanced && light.i < 0
	}
	if d.child != nil && !level(d.child, d.matched()) {
		return best, light
	}
	for n := d.n; n.parent != nil; n = n.parent {
		if !level(n, n.end) {
			break
		}
	}
	return best, light
}

// warmer orders holders of the same prefix: the lighter one, then the more recently used.
func (a candidate) warmer(b candidate) bool {
	if a.lighter(b) || b.lighter(a) {
		return a.lighter(b)
	}
	return a.rank > b.rank
}

// viewOf returns the slot map of workers, rebuilding it if it was built for another snapshot or
// before a slot was released. c.mu must be held.
func (c *CacheAware) viewOf(workers []*Worker) *slotView {
	v := &c.view
	same := len(workers) == len(v.workers) && (len(workers) == 0 || &workers[0] == &v.workers[0])
	if same && v.gen == c.tree.gen {
		return v
	}
	v.workers, v.gen = workers, c.tree.gen
	v.slotOf = make([]int32, len(workers))
	v.held, v.last = make([]int, len(workers)), make([]int64, len(workers))
	v.indexOf = make([]int32, len(c.tree.workers))
	for s := range v.indexOf {
		v.indexOf[s] = -1
	}
	for i, w := range workers {
		s, ok := c.tree.slots[w.ID()]
		if !ok {
			v.slotOf[i] = -1
			continue
		}
		v.slotOf[i] = s
		v.indexOf[s] = int32(i)
	}
	return v
}

// register gives worker i of the view a tree slot and records it in the view. c.mu must be held.
func (c *CacheAware) register(v *slotView, i int, id string) int32 {
	s := c.tree.slot(id)
	for int(s) >= len(v.indexOf) {
		v.indexOf = append(v.indexOf, -1)
	}
	v.indexOf[s] = int32(i)
	v.slotOf[i] = s
	return s
}

// bytesOf returns the mirrored bytes of slot, 0 for none. c.mu must be held.
func (c *CacheAware) bytesOf(slot int32) int64 {
	if slot < 0 {
		return 0
	}
	return c.tree.workers[slot].bytes
}

// capNow keeps slot under the hard cap after an insert and wakes Run to trim it further, and
// moves the horizon of a worker with a learned limit. The entries released are about as many bytes
// as the insert added, so the cost is amortised; the horizon costs a walk of the entries within
// the limit. c.mu must be held.
func (c *CacheAware) capNow(slot int32) {
	w := c.tree.workers[slot]
	if w.bytes > c.hard {
		c.tree.evict(slot, c.hard, math.MaxInt)
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	if w.limit > 0 {
		w.horizon = c.tree.horizon(slot, w.limit)
	}
}

// limitOf returns the bytes of w's most recent entries that count as held: what its engine was
// found to keep, at most MaxBytesPerWorker.
func (c *CacheAware) limitOf(w *treeWorker) int64 {
	if w.limit > 0 {
		return w.limit
	}
	return c.cfg.MaxBytesPerWorker
}

// Run trims every worker back to MaxBytesPerWorker every EvictionInterval, and at once when a
// Pick pushed one over the hard cap, until ctx ends; with a PrefixFeed it also publishes this
// replica's inserts and applies the others' (runShare), and returns once that has stopped too.
// The owner of the policy runs it once, for as long as the policy is used.
func (c *CacheAware) Run(ctx context.Context) {
	if c.share != nil {
		shared := make(chan struct{})
		go func() { defer close(shared); c.runShare(ctx) }()
		defer func() { <-shared }()
	}
	t := time.NewTicker(c.cfg.EvictionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
		c.Evict()
	}
}

// Evict trims every worker that mirrors more than MaxBytesPerWorker back to it, least recently
// used prefixes first, and returns the number of entries released. It takes the mutex for at
// most evictBatch releases at a time. Run calls it; so may tests and shutdown code.
//
// It also drops, as WorkersChanged would, the entries of a worker that has been missing from the
// snapshots Pick receives for at least EvictionInterval: a safety net for an owner that does not
// report removals, or a Pick on a stale snapshot that chose a worker already removed.
func (c *CacheAware) Evict() int {
	c.forgetAbsent()
	released := 0
	for {
		c.mu.Lock()
		n := 0
		for s, w := range c.tree.workers {
			if w != nil && w.bytes > c.cfg.MaxBytesPerWorker {
				n += c.tree.evict(int32(s), c.cfg.MaxBytesPerWorker, evictBatch-n)
				if n >= evictBatch {
					break
				}
			}
		}
		c.mu.Unlock()
		released += n
		if n < evictBatch {
			return released
		}
	}
}

// forgetAbsent removes the workers missing from the last snapshot for EvictionInterval or more.
func (c *CacheAware) forgetAbsent() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now().UnixNano()
	for s, w := range c.tree.workers {
		switch {
		case w == nil:
		case s < len(c.view.indexOf) && c.view.indexOf[s] >= 0:
			w.absentSince = 0
		case w.absentSince == 0:
			w.absentSince = now
		case now-w.absentSince >= int64(c.cfg.EvictionInterval):
			c.tree.remove(w.id)
		}
	}
}

// WorkersChanged forgets every worker missing from workers, the model's new snapshot (nil when
// the model lost its last worker): its entries leave the tree, and a worker that comes back under
// the same ID starts cold. A worker that is only unhealthy or draining stays in the snapshot and
// keeps its entries. The Pool calls it after every membership change of the model (the
// workersObserver hook). Safe for concurrent use; costs a set of the snapshot's IDs plus the
// removed workers' entries.
func (c *CacheAware) WorkersChanged(workers []*Worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	keep := make(map[string]bool, len(workers))
	for _, w := range workers {
		keep[w.ID()] = true
	}
	c.members = keep
	for id := range c.tree.slots {
		if !keep[id] {
			c.tree.remove(id)
		}
	}
}

// CachedBytes returns the prompt bytes the tree mirrors for worker id (0 if none) and the nodes
// and label bytes of the whole tree, for metrics and tests. Safe for concurrent use.
func (c *CacheAware) CachedBytes(id string) (worker int64, nodes int, total int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.tree.slots[id]; ok {
		worker = c.tree.workers[s].bytes
	}
	return worker, c.tree.nodes, c.tree.labels
}
