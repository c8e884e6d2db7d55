package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"
)

func init() {
	registerPolicy("sticky_session", newStickySession)
	registerPolicy("manual", newManual)
}

// Routes of the pinning policies.
const (
	RouteSticky   Route = "sticky"   // sticky_session: the worker the session is pinned to
	RoutePinned   Route = "pinned"   // manual: the worker the routing key is pinned to
	RouteAssigned Route = "assigned" // a new pin: the key had none
	RouteRepinned Route = "repinned" // the pinned worker was unhealthy, draining or gone; the pin moved
)

// PinConfig sets the pins of sticky_session and manual.
type PinConfig struct {
	// TTL is how long an unused pin lives; every request of the key restarts it. Default 1h.
	TTL time.Duration `yaml:"ttl"`
	// Timeout bounds one pin-store call on the pick path; past it the request routes by
	// consistent hashing on its key, as when the store is down. Default 50ms.
	Timeout time.Duration `yaml:"timeout"`
}

func (c *PinConfig) setDefaults() {
	if c.TTL == 0 {
		c.TTL = time.Hour
	}
	if c.Timeout == 0 {
		c.Timeout = 50 * time.Millisecond
	}
}

func (c PinConfig) validate(prefix string) []error {
	var errs []error
	if c.TTL < time.Second {
		errs = append(errs, fieldError(prefix, "ttl", "must be at least 1s, got %s", c.TTL))
	}
	if c.Timeout <= 0 {
		errs = append(errs, fieldError(prefix, "timeout", "must be positive, got %s", c.Timeout))
	}
	return errs
}

// StickySessionConfig sets the sticky_session policy.
type StickySessionConfig struct {
	// Fallback names the policy that routes requests without a session and assigns new
	// sessions; any policy but sticky_session and manual. Default round_robin.
	Fallback string `yaml:"fallback"`
}

func (c *StickySessionConfig) setDefaults() {
	if c.Fallback == "" {
		c.Fallback = "round_robin"
	}
}

func (c StickySessionConfig) validate(prefix string) []error {
	if c.Fallback == "sticky_session" || c.Fallback == "manual" || !knownPolicy(c.Fallback) {
		return []error{fieldError(prefix, "fallback", "must name a policy other than sticky_session and manual, got %q", c.Fallback)}
	}
	return nil
}

// Assignment strategies of ManualConfig.Assign.
const (
	AssignRandom   = "random"    // a uniformly random worker
	AssignMinLoad  = "min_load"  // the worker with the fewest requests in flight
	AssignMinGroup = "min_group" // the worker with the fewest pinned keys
)

// ManualConfig sets the manual policy.
type ManualConfig struct {
	// Assign is how a key without a pin gets its worker: "random", "min_load" or "min_group".
	// Default min_load.
	Assign string `yaml:"assign"`
	// Recount is how often min_group recounts the pins per worker from the pin store; between
	// recounts it adds the pins it makes itself. Default 1m.
	Recount time.Duration `yaml:"recount"`
}

func (c *ManualConfig) setDefaults() {
	if c.Assign == "" {
		c.Assign = AssignMinLoad
	}
	if c.Recount == 0 {
		c.Recount = time.Minute
	}
}

func (c ManualConfig) validate(prefix string) []error {
	var errs []error
	switch c.Assign {
	case AssignRandom, AssignMinLoad, AssignMinGroup:
	default:
		errs = append(errs, fieldError(prefix, "assign", "must be random, min_load or min_group, got %q", c.Assign))
	}
	if c.Recount <= 0 {
		errs = append(errs, fieldError(prefix, "recount", "must be positive, got %s", c.Recount))
	}
	return errs
}

// pinRouter is what sticky_session and manual share: look the key's pin up (one round trip),
// keep it while its worker is fit, move it when not, and fall back to consistent hashing on the
// same key when the pin store fails.
type pinRouter struct {
	model   string
	cfg     PinConfig
	pins    PinStore
	metrics *poolMetrics
	logger  *slog.Logger
	hit     Route // the route of a kept pin
	ring    ringCache
	// assign picks a worker for a key without a fit pin.
	assign func(ctx context.Context, r choice, workers []*Worker) (*Worker, Route)
	// assigned, if set, learns of every pin this gateway moves (from "" for a new one).
	assigned func(from, to string)
}

// degradedLoadFactor bounds load while routing by consistent hashing without the pin store.
const degradedLoadFactor = 1.25

// pinLookup is what pinRouter.lookup found of a request's pin: the worker it is pinned to ("":
// none could be assigned) and the route a pick there takes (the hit route, or assigned or
// repinned when the lookup made or moved the pin), or the pin store's failure.
type pinLookup struct {
	id    string
	route Route
	err   error
}

// lookup looks the key's pin up and, when it has no worker that is fit (healthy, serving, not
// draining; full is fit), assigns one and claims the pin for it: every pin store round trip a
// request makes, at most two, bounded by PinConfig.Timeout.
func (p *pinRouter) lookup(ctx context.Context, r choice, workers []*Worker, key string) *pinLookup {
	ring := p.ring.get(workers)
	k := PinKey{Model: p.model, Tenant: r.Tenant, Key: key}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	id, err := p.pins.Get(ctx, k, p.cfg.TTL)
	if err != nil {
		return &pinLookup{err: err}
	}
	if w := ring.byID[id]; id != "" && w != nil && (r.Eligible(w) || r.mayWaitFor(w)) {
		return &pinLookup{id: id, route: p.hit}
	}
	route := RouteAssigned
	if id != "" {
		route = RouteRepinned
	}
	w, _ := p.assign(ctx, r, workers)
	if w == nil {
		return &pinLookup{route: route}
	}
	got, err := p.pins.Claim(ctx, k, id, w.spec.ID, p.cfg.TTL)
	switch {
	case err != nil:
		p.metrics.pinErrors.WithLabelValues(p.model, "claim").Inc()
		return &pinLookup{id: w.spec.ID, route: route}
	case got != w.spec.ID:
		// Another replica pinned the key first: follow it.
		return &pinLookup{id: got, route: p.hit}
	}
	if p.assigned != nil {
		p.assigned(id, got)
	}
	return &pinLookup{id: got, route: route}
}

// prepare does r's lookup before it waits in its queue, and returns r.Prepared with it, for
// pick.
func (p *pinRouter) prepare(ctx context.Context, r choice, workers []*Worker, key string) Prepared {
	found := r.Prepared
	found.pin = p.lookup(ctx, r, workers, key)
	return found
}

// pick routes r by its key's pin, as its Prepare found it: to its pinned worker when that has
// room, else elsewhere with the pin kept (spill); the next lookup moves a pin whose worker became
// unfit. It asks the pin store nothing: a request not prepared routes as when the store fails,
// by consistent hashing on the key, uncounted (see Pool.Pick).
func (p *pinRouter) pick(ctx context.Context, r choice, workers []*Worker, key string) (*Worker, Route) {
	if len(workers) == 0 {
		return nil, p.hit
	}
	pin := r.Prepared.pin
	switch {
	case pin == nil:
		return p.hashed(p.ring.get(workers), r)
	case pin.err != nil:
		return p.degraded(p.ring.get(workers), r, "get", pin.err)
	}
	if w := p.ring.get(workers).byID[pin.id]; w != nil && r.Eligible(w) {
		return w, pin.route
	}
	w, _ := p.assign(ctx, r, workers)
	if pin.id == "" {
		return w, pin.route
	}
	return w, RouteSpill
}

// degraded counts the pin store's failure at op and routes r as hashed does.
func (p *pinRouter) degraded(ring *hashRing, r choice, op string, err error) (*Worker, Route) {
	p.metrics.pinErrors.WithLabelValues(p.model, op).Inc()
	if !errors.Is(err, context.Canceled) {
		p.logger.Debug("pin store failed; routing by consistent hashing", "model", p.model, "op", op, "err", err)
	}
	return p.hashed(ring, r)
}

// hashed routes r without its pin, by consistent hashing on the same key, with bounded load.
func (p *pinRouter) hashed(ring *hashRing, r choice) (*Worker, Route) {
	key, _ := requestKeyHash(r.Request)
	return pickOnRing(ring, r, key, degradedLoadFactor)
}

// StickySession keeps each session (Request.SessionID) on one worker: the pin lives in the
// PinStore under the model and tenant, with a sliding TTL, so every gateway replica sends the
// session to the same worker. A new session is assigned by the fallback policy; a pinned worker
// that is unhealthy, draining, circuit-open or gone loses the pin and the pin moves (route
// "repinned"); one that is merely full serves this request elsewhere and keeps the pin (route
// "spill"). When the store fails, requests still flow, by consistent hashing on the same key, and
// the errors are counted. Requests without a session go to the fallback policy.
//
// Safe for concurrent use. Its Prepare makes one store round trip (two for a new or moved
// session), bounded by PinConfig.Timeout, and its picks none (see Pool.Pick for a request not
// prepared).
type StickySession struct {
	fallback Policy
	router   pinRouter
}

var (
	_ Policy          = (*StickySession)(nil)
	_ workersObserver = (*StickySession)(nil)
	_ policyRunner    = (*StickySession)(nil)
	_ preparer        = (*StickySession)(nil)
	_ preparer        = (*Manual)(nil)
)

func newStickySession(env policyEnv) (Policy, error) {
	fallback, err := newPolicy(env.cfg.StickySession.Fallback, env)
	if err != nil {
		return nil, fmt.Errorf("sticky_session fallback: %w", err)
	}
	p := &StickySession{fallback: fallback}
	p.router = pinRouter{model: env.model, cfg: env.cfg.Pins, pins: env.pins, metrics: env.metrics, logger: env.logger, hit: RouteSticky,
		ring: ringCache{vnodes: env.cfg.ConsistentHash.VirtualNodes}, assign: fallback.Pick}
	return p, nil
}

// WorkersChanged implements workersObserver.
func (p *StickySession) WorkersChanged(workers []*Worker) {
	p.router.ring.WorkersChanged(workers)
	if o, ok := p.fallback.(workersObserver); ok {
		o.WorkersChanged(workers)
	}
}

// Run runs the fallback policy's background work, if it has any.
func (p *StickySession) Run(ctx context.Context) {
	if r, ok := p.fallback.(policyRunner); ok {
		r.Run(ctx)
	}
}

// Pick implements Policy.
func (p *StickySession) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	if r.SessionID == "" {
		return p.fallback.Pick(ctx, r, workers)
	}
	return p.router.pick(ctx, r, workers, r.SessionID)
}

// prepare implements preparer: the fallback's own I/O, then the session's pin (see
// pinRouter.prepare).
func (p *StickySession) prepare(ctx context.Context, r choice, workers []*Worker) Prepared {
	if pr, ok := p.fallback.(preparer); ok {
		r.Prepared = pr.prepare(ctx, r, workers)
	}
	if r.SessionID != "" && len(workers) > 0 {
		r.Prepared = p.router.prepare(ctx, r, workers, r.SessionID)
	}
	return r.Prepared
}

// Manual routes by pins an operator sets (Pool.Pin) or the policy makes: the key is
// Request.RoutingKey, else SessionID. A key without a pin gets a worker by ManualConfig.Assign
// and is pinned to it; failover, degradation and costs are those of StickySession. Requests
// without a key go to the Assign strategy unpinned.
type Manual struct {
	assign   func(ctx context.Context, r choice, workers []*Worker) (*Worker, Route)
	router   pinRouter
	pins     PinStore
	model    string
	recount  time.Duration
	minGroup bool
	groups   atomic.Pointer[map[string]*atomic.Int64] // pins per worker ID, for min_group
}

var (
	_ Policy          = (*Manual)(nil)
	_ workersObserver = (*Manual)(nil)
	_ policyRunner    = (*Manual)(nil)
)

func newManual(env policyEnv) (Policy, error) {
	p := &Manual{pins: env.pins, model: env.model, recount: env.cfg.Manual.Recount}
	switch env.cfg.Manual.Assign {
	case AssignRandom:
		p.assign = (&Random{rand: env.rand}).Pick
	case AssignMinLoad:
		p.assign = (&LeastRequest{rand: env.rand}).Pick
	case AssignMinGroup:
		p.minGroup = true
		p.assign = p.pickMinGroup
		empty := map[string]*atomic.Int64{}
		p.groups.Store(&empty)
	default:
		return nil, fmt.Errorf("unknown assignment %q", env.cfg.Manual.Assign)
	}
	p.router = pinRouter{model: env.model, cfg: env.cfg.Pins, pins: env.pins, metrics: env.metrics, logger: env.logger, hit: RoutePinned,
		ring: ringCache{vnodes: env.cfg.ConsistentHash.VirtualNodes}, assign: p.assign}
	if p.minGroup {
		p.router.assigned = p.moved
	}
	return p, nil
}

// WorkersChanged implements workersObserver.
func (p *Manual) WorkersChanged(workers []*Worker) { p.router.ring.WorkersChanged(workers) }

// Pick implements Policy.
func (p *Manual) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	key := r.RoutingKey
	if key == "" {
		key = r.SessionID
	}
	if key == "" {
		return p.assign(ctx, r, workers)
	}
	return p.router.pick(ctx, r, workers, key)
}

// prepare implements preparer: the key's pin (see pinRouter.prepare).
func (p *Manual) prepare(ctx context.Context, r choice, workers []*Worker) Prepared {
	key := r.RoutingKey
	if key == "" {
		key = r.SessionID
	}
	if key == "" || len(workers) == 0 {
		return r.Prepared
	}
	return p.router.prepare(ctx, r, workers, key)
}

// Run recounts the pins per worker every Recount for min_group; for the other strategies it
// returns at once.
func (p *Manual) Run(ctx context.Context) {
	if !p.minGroup {
		return
	}
	every(ctx, p.recount, p.countGroups)
}

// countGroups replaces the pins-per-worker counts with a fresh count from the store.
func (p *Manual) countGroups(ctx context.Context) {
	pins, err := p.pins.List(ctx, PinFilter{Model: p.model})
	if err != nil {
		p.router.metrics.pinErrors.WithLabelValues(p.model, "list").Inc()
		return
	}
	counts := make(map[string]*atomic.Int64)
	for _, pin := range pins {
		c := counts[pin.Worker]
		if c == nil {
			c = new(atomic.Int64)
			counts[pin.Worker] = c
		}
		c.Add(1)
	}
	p.groups.Store(&counts)
}

// moved keeps the counts current between recounts as this gateway moves pins.
func (p *Manual) moved(from, to string) {
	counts := *p.groups.Load()
	if c := counts[from]; c != nil && from != "" {
		c.Add(-1)
	}
	if c := counts[to]; c != nil {
		c.Add(1)
		return
	}
	// A worker first seen: publish a copy with its counter.
	next := make(map[string]*atomic.Int64, len(counts)+1)
	for id, c := range counts {
		next[id] = c
	}
	c := new(atomic.Int64)
	c.Store(1)
	next[to] = c
	p.groups.Store(&next)
}

// pickMinGroup returns the eligible worker with the fewest pinned keys, ties to the first.
func (p *Manual) pickMinGroup(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	counts := *p.groups.Load()
	var best *Worker
	var bestN int64
	for _, w := range workers {
		var n int64
		if c := counts[w.spec.ID]; c != nil {
			n = c.Load()
		}
		if (best == nil || n < bestN) && r.Eligible(w) {
			best, bestN = w, n
		}
	}
	return best, RouteAssigned
}
