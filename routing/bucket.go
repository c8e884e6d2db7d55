package routing

import (
	"context"
	"math/bits"
	"sync/atomic"
	"time"
)

func init() {
	registerPolicy("bucket", func(env policyEnv) (Policy, error) {
		return newBucket(env.cfg.Bucket, env.rand), nil
	})
}

// Routes of the bucket policy.
const (
	RouteBucket       Route = "bucket"        // the owner of the prompt's length range
	RouteLoadFallback Route = "load_fallback" // the owner was too loaded; the least loaded worker
)

// BucketConfig sets the bucket policy.
type BucketConfig struct {
	// Recut is how often the length ranges are re-cut from the recent load. Default 30s.
	Recut time.Duration `yaml:"recut"`
	// Decay weighs the load seen before each re-cut, so recent traffic counts most. Between 0
	// and 1; default 0.5.
	Decay float64 `yaml:"decay"`
	// The owner of a length range keeps a request unless it has more than BalanceAbs requests in
	// flight and more than BalanceRel times those of the least loaded eligible worker; then that
	// worker takes it (route "load_fallback"). Defaults 4 and 1.5.
	BalanceAbs int     `yaml:"balance_abs"`
	BalanceRel float64 `yaml:"balance_rel"`
}

func (c *BucketConfig) setDefaults() {
	if c.Recut == 0 {
		c.Recut = 30 * time.Second
	}
	if c.Decay == 0 {
		c.Decay = 0.5
	}
	if c.BalanceAbs == 0 {
		c.BalanceAbs = 4
	}
	if c.BalanceRel == 0 {
		c.BalanceRel = 1.5
	}
}

func (c BucketConfig) validate(prefix string) []error {
	var errs []error
	if c.Recut <= 0 {
		errs = append(errs, fieldError(prefix, "recut", "must be positive, got %s", c.Recut))
	}
	if !(c.Decay > 0 && c.Decay < 1) {
		errs = append(errs, fieldError(prefix, "decay", "must be between 0 and 1 (exclusive), got %v", c.Decay))
	}
	if c.BalanceAbs < 0 {
		errs = append(errs, fieldError(prefix, "balance_abs", "must not be negative, got %d", c.BalanceAbs))
	}
	if !(c.BalanceRel >= 1) {
		errs = append(errs, fieldError(prefix, "balance_rel", "must be at least 1, got %v", c.BalanceRel))
	}
	return errs
}

// numLengthBins covers prompt lengths up to 2^33 tokens, four bins per power of two.
const numLengthBins = 128

// lengthBin maps a prompt length to a histogram bin: exact below 4, then four bins per power of
// two, so ranges stay fine where short prompts crowd.
func lengthBin(n int) int {
	if n < 4 {
		return max(n, 0)
	}
	b := bits.Len(uint(n)) - 1
	return min(4*(b-1)+(n>>(b-2))&3, numLengthBins-1)
}

// coldBins is the histogram a bucket policy assumes before any traffic: uniform over prompts of
// up to 32k tokens.
var coldBins = lengthBin(32768) + 1

// Bucket gives each worker a range of prompt lengths, so long and short prompts do not share a
// batch. Ranges are re-cut every Recut so each worker carries an equal share of the recent load
// (by tokens); a length bin heavier than one share is shared by several workers, picked at random.
// An overloaded or ineligible owner hands the request to the least loaded worker. Safe for
// concurrent use; a pick is one atomic add and a table lookup, plus a scan of the workers when
// the owner is loaded.
type Bucket struct {
	cfg      BucketConfig
	rand     randSource
	fallback *LeastRequest
	load     [numLengthBins]atomic.Int64 // tokens routed per length bin since the last decay
	table    atomic.Pointer[bucketTable]
}

// bucketTable says which workers own each length bin; immutable.
type bucketTable struct {
	workers []*Worker // the snapshot it was cut for
	first   [numLengthBins]int32
	count   [numLengthBins]int32
}

var (
	_ Policy          = (*Bucket)(nil)
	_ workersObserver = (*Bucket)(nil)
	_ policyRunner    = (*Bucket)(nil)
)

func newBucket(cfg BucketConfig, rnd randSource) *Bucket {
	return &Bucket{cfg: cfg, rand: rnd, fallback: &LeastRequest{rand: rnd}}
}

// WorkersChanged implements workersObserver: it re-cuts the ranges for the new workers.
func (p *Bucket) WorkersChanged(workers []*Worker) { p.table.Store(p.cut(workers)) }

// Run re-cuts the ranges every Recut until ctx ends.
func (p *Bucket) Run(ctx context.Context) {
	every(ctx, p.cfg.Recut, func(context.Context) { p.recut() })
}

// recut cuts new ranges from the load seen so far, then decays that load.
func (p *Bucket) recut() {
	if t := p.table.Load(); t != nil {
		p.table.Store(p.cut(t.workers))
	}
	for i := range p.load {
		v := p.load[i].Load()
		p.load[i].Add(-(v - int64(float64(v)*p.cfg.Decay)))
	}
}

// cut splits the bins so each worker owns an equal share of the recorded load.
func (p *Bucket) cut(workers []*Worker) *bucketTable {
	t := &bucketTable{workers: workers}
	n := len(workers)
	if n == 0 {
		return t
	}
	var weights [numLengthBins]float64
	var total float64
	for i := range weights {
		weights[i] = float64(p.load[i].Load())
		total += weights[i]
	}
	if total == 0 {
		for i := range coldBins {
			weights[i] = 1
		}
		total = float64(coldBins)
	}
	share := total / float64(n)
	var before float64
	for i, w := range weights {
		after := before + w
		lo := min(int(before/share), n-1)
		hi := lo
		if w > 0 {
			// The workers whose share [k*share, (k+1)*share) overlaps [before, after).
			hi = min(int((after-share*1e-9)/share), n-1)
		}
		t.first[i], t.count[i] = int32(lo), int32(hi-lo+1)
		before = after
	}
	return t
}

// Pick implements Policy.
func (p *Bucket) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	if len(workers) == 0 {
		return nil, RouteBucket
	}
	t := p.table.Load()
	if t == nil || !sameSnapshot(t.workers, workers) {
		t = p.cut(workers)
		p.table.Store(t)
	}
	bin := lengthBin(r.PromptTokens)
	p.load[bin].Add(int64(max(r.Tokens, r.PromptTokens, 1)))
	owner := workers[int(t.first[bin])+intN(p.rand, int(t.count[bin]))]
	eligible := r.Eligible(owner)
	load := owner.InFlight()
	if eligible && load <= int64(p.cfg.BalanceAbs) {
		return owner, RouteBucket
	}
	least, _ := p.fallback.Pick(ctx, r, workers)
	if least == nil {
		return nil, RouteLoadFallback
	}
	if eligible && float64(load) <= p.cfg.BalanceRel*float64(least.InFlight()) {
		return owner, RouteBucket
	}
	return least, RouteLoadFallback
}
