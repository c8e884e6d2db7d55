package routing

import (
	"context"

	"github.com/cespare/xxhash/v2"
)

func init() {
	registerPolicy("consistent_hash", func(env policyEnv) (Policy, error) {
		return newConsistentHash(env.cfg.ConsistentHash, env.rand), nil
	})
}

// Routes of the hashing policies.
const (
	RouteHash  Route = "hash"  // the owner of the key on the ring
	RouteSpill Route = "spill" // the owner was overloaded or ineligible; the next worker clockwise
)

// RingConfig sets a hash ring with bounded load, for consistent_hash and prefix_hash.
type RingConfig struct {
	// VirtualNodes is the number of ring points per worker; more points spread keys more evenly.
	// Default 100.
	VirtualNodes int `yaml:"virtual_nodes"`
	// LoadFactor bounds a worker's load: one with more than ceil(LoadFactor x mean in-flight
	// requests) is passed over, clockwise. Above 1; default 1.25.
	LoadFactor float64 `yaml:"load_factor"`
}

func (c *RingConfig) setDefaults() {
	if c.VirtualNodes == 0 {
		c.VirtualNodes = 100
	}
	if c.LoadFactor == 0 {
		c.LoadFactor = 1.25
	}
}

func (c RingConfig) validate(prefix string) []error {
	var errs []error
	if c.VirtualNodes < 1 || c.VirtualNodes > 10000 {
		errs = append(errs, fieldError(prefix, "virtual_nodes", "must be between 1 and 10000, got %d", c.VirtualNodes))
	}
	if !(c.LoadFactor > 1) {
		errs = append(errs, fieldError(prefix, "load_factor", "must be above 1, got %v", c.LoadFactor))
	}
	return errs
}

// ConsistentHashConfig sets the consistent_hash policy: its ring.
type ConsistentHashConfig struct {
	RingConfig `yaml:",inline"`
}

// ConsistentHash sends each key to the same worker while the fleet stays the same: the key is
// Request.RoutingKey, else SessionID, else Tenant, hashed onto a ring with virtual nodes. A worker
// joining or leaving moves about 1/N of the keys. Bounded load spills a key clockwise past
// overloaded workers (route "spill"). A request without any key goes to the least loaded worker.
// Safe for concurrent use; a pick costs a binary search over the ring.
type ConsistentHash struct {
	loadFactor float64
	ring       ringCache
	keyless    *LeastRequest
}

var (
	_ Policy          = (*ConsistentHash)(nil)
	_ workersObserver = (*ConsistentHash)(nil)
)

func newConsistentHash(cfg ConsistentHashConfig, rnd randSource) *ConsistentHash {
	return &ConsistentHash{loadFactor: cfg.LoadFactor, ring: ringCache{vnodes: cfg.VirtualNodes}, keyless: &LeastRequest{rand: rnd}}
}

// WorkersChanged implements workersObserver.
func (p *ConsistentHash) WorkersChanged(workers []*Worker) { p.ring.WorkersChanged(workers) }

// Pick implements Policy.
func (p *ConsistentHash) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	key, ok := requestKeyHash(r.Request)
	if !ok {
		return p.keyless.Pick(ctx, r, workers)
	}
	return pickOnRing(p.ring.get(workers), r, key, p.loadFactor)
}

func pickOnRing(h *hashRing, r choice, key uint64, loadFactor float64) (*Worker, Route) {
	w, spilled := h.pick(r, key, loadFactor)
	if spilled {
		return w, RouteSpill
	}
	return w, RouteHash
}

// requestKeyHash hashes the key consistent hashing uses: the routing key, else the session, else
// the tenant, each scoped by tenant so equal keys of two tenants differ. ok is false when the
// request has none of them. It does not allocate.
func requestKeyHash(r *Request) (key uint64, ok bool) {
	var kind, value string
	switch {
	case r.RoutingKey != "":
		kind, value = "k", r.RoutingKey
	case r.SessionID != "":
		kind, value = "s", r.SessionID
	case r.Tenant != "":
		kind = "t"
	default:
		return 0, false
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(kind)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(r.Tenant)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(value)
	return d.Sum64(), true
}
