package routing

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/usherllm/usher/test/redistest"
)

// pick prepares r and picks its worker, as the gateway does; it returns the worker and route.
func pick(t *testing.T, p *Pool, r Request) (string, Route) {
	t.Helper()
	p.Prepare(context.Background(), &r)
	l, err := p.Pick(context.Background(), &r)
	if err != nil {
		t.Fatalf("Pick(%+v): %v", r, err)
	}
	l.Release(Outcome{})
	return l.Worker.ID(), l.Route
}

func TestStickySession(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "sticky_session", Workers: testWorkers(3, "m")})
	ws := map[string]*Worker{}
	for _, w := range modelWorkers(t, p, "m") {
		ws[w.ID()] = w
	}
	s := Request{Model: "m", Tenant: "t", SessionID: "s1"}
	first, route := pick(t, p, s)
	if route != RouteAssigned {
		t.Errorf("new session: got route %q, want %q", route, RouteAssigned)
	}
	for range 5 {
		if id, route := pick(t, p, s); id != first || route != RouteSticky {
			t.Fatalf("pinned session: got %s by %q, want %s by %q", id, route, first, RouteSticky)
		}
	}
	if _, route := pick(t, p, Request{Model: "m", Tenant: "t"}); route != RouteRoundRobin {
		t.Errorf("no session: got route %q, want the fallback's %q", route, RouteRoundRobin)
	}

	// Full, not broken: this request goes elsewhere, the pin stays.
	ws[first].inFlight.Store(ws[first].MaxConcurrency())
	if id, route := pick(t, p, s); id == first || route != RouteSpill {
		t.Errorf("pinned worker full: got %s by %q, want another worker by %q", id, route, RouteSpill)
	}
	ws[first].inFlight.Store(0)
	if id, _ := pick(t, p, s); id != first {
		t.Errorf("pinned worker free again: got %s, want %s", id, first)
	}

	// Broken: the pin moves, and stays moved.
	markDown(ws[first])
	moved, route := pick(t, p, s)
	if moved == first || route != RouteRepinned {
		t.Fatalf("pinned worker down: got %s by %q, want another worker by %q", moved, route, RouteRepinned)
	}
	ws[first].health.Store(int32(healthUp))
	if id, route := pick(t, p, s); id != moved || route != RouteSticky {
		t.Errorf("after failover: got %s by %q, want %s by %q", id, route, moved, RouteSticky)
	}

	// Draining unpins at once: the session is pinned anew, elsewhere.
	if err := p.Drain(context.Background(), moved); err != nil {
		t.Fatal(err)
	}
	pins, err := p.Pins(context.Background(), PinFilter{Worker: moved})
	if err != nil || len(pins) != 0 {
		t.Errorf("pins on the drained worker: got %v (%v), want none", pins, err)
	}
	if id, route := pick(t, p, s); id == moved || route != RouteAssigned {
		t.Errorf("pinned worker drained: got %s by %q, want another worker by %q", id, route, RouteAssigned)
	}
}

func TestStickyAcrossGatewaysAndRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	newGateway := func(seed uint64) (*Pool, *prometheus.Registry) {
		reg := prometheus.NewRegistry()
		cfg := Config{Policy: "sticky_session", Workers: testWorkers(4, "m"),
			Models: map[string]ModelConfig{"m": {StickySession: StickySessionConfig{Fallback: "random"}}}}
		p, err := NewPool(cfg, Options{Registerer: reg, Rand: rand.NewPCG(seed, seed), Pins: NewRedisStore(newRedisClient(t, srv), 0)})
		if err != nil {
			t.Fatal(err)
		}
		return p, reg
	}
	a, regA := newGateway(1)
	b, _ := newGateway(2)
	sessions := make([]Request, 12)
	for i := range sessions {
		sessions[i] = Request{Model: "m", Tenant: "t", SessionID: fmt.Sprint("s", i)}
	}
	owner := map[string]string{}
	for _, s := range sessions {
		idA, _ := pick(t, a, s)
		idB, routeB := pick(t, b, s)
		if idB != idA || routeB != RouteSticky {
			t.Fatalf("session %s: gateway b got %s by %q, want a's %s by %q", s.SessionID, idB, routeB, idA, RouteSticky)
		}
		owner[s.SessionID] = idA
	}

	// The pinned worker of s0 dies; both gateways' health checks see it.
	dead := owner["s0"]
	for _, p := range []*Pool{a, b} {
		for _, w := range modelWorkers(t, p, "m") {
			if w.ID() == dead {
				markDown(w)
			}
		}
	}
	moved, route := pick(t, a, sessions[0])
	if moved == dead || route != RouteRepinned {
		t.Fatalf("failover on a: got %s by %q, want a live worker by %q", moved, route, RouteRepinned)
	}
	if id, route := pick(t, b, sessions[0]); id != moved || route != RouteSticky {
		t.Errorf("b after a moved the pin: got %s by %q, want %s by %q", id, route, moved, RouteSticky)
	}

	// Redis dies: requests still flow, both gateways agree by consistent hashing, errors counted.
	srv.Stop()
	for _, s := range sessions {
		idA, routeA := pick(t, a, s)
		idB, _ := pick(t, b, s)
		if idA != idB || idA == dead || (routeA != RouteHash && routeA != RouteSpill) {
			t.Errorf("session %s without Redis: got a=%s by %q, b=%s; want the same live worker by %q", s.SessionID, idA, routeA, idB, RouteHash)
		}
	}
	if got := testutil.ToFloat64(a.metrics.pinErrors.WithLabelValues("m", "get")); got != float64(len(sessions)) {
		t.Errorf("usher_routing_pin_errors_total{op=get} on a: got %v, want %d", got, len(sessions))
	}
	if n, err := testutil.GatherAndCount(regA, "usher_routing_pin_errors_total"); err != nil || n == 0 {
		t.Errorf("pin error series: got %d (%v), want some", n, err)
	}

	// Redis is back (empty): sessions get pinned again.
	srv.Restart()
	id, route := pick(t, a, sessions[1])
	if route != RouteAssigned {
		t.Errorf("after Redis restarted: got route %q, want %q", route, RouteAssigned)
	}
	if idB, routeB := pick(t, b, sessions[1]); idB != id || routeB != RouteSticky {
		t.Errorf("b after the restart: got %s by %q, want %s by %q", idB, routeB, id, RouteSticky)
	}
}

func TestManual(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Policy: "manual", Workers: testWorkers(3, "m"), Models: map[string]ModelConfig{"m": {Manual: ManualConfig{Assign: AssignMinGroup}}}}
	p, _ := newTestPool(t, cfg)
	if err := p.Pin(ctx, "m", "t", "vip", "w2", 0); err != nil {
		t.Fatal(err)
	}
	if id, route := pick(t, p, Request{Model: "m", Tenant: "t", RoutingKey: "vip"}); id != "w2" || route != RoutePinned {
		t.Errorf("operator pin: got %s by %q, want w2 by %q", id, route, RoutePinned)
	}
	if id, _ := pick(t, p, Request{Model: "m", Tenant: "other", RoutingKey: "vip"}); id == "" {
		t.Errorf("another tenant's key of the same name: got no worker")
	}
	// min_group: after a recount, new keys fill the workers with the fewest pins.
	pol := p.snap.Load().models["m"].policy.(*Manual)
	pol.countGroups(ctx)
	counts := map[string]int{}
	for i := range 5 {
		id, route := pick(t, p, Request{Model: "m", Tenant: "t", RoutingKey: fmt.Sprint("k", i)})
		if route != RouteAssigned {
			t.Errorf("key k%d: got route %q, want %q", i, route, RouteAssigned)
		}
		counts[id]++
	}
	pins, err := p.Pins(ctx, PinFilter{Model: "m", Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	perWorker := map[string]int{}
	for _, pin := range pins {
		perWorker[pin.Worker]++
	}
	if perWorker["w0"] != 2 || perWorker["w1"] != 2 || perWorker["w2"] != 2 {
		t.Errorf("pins per worker after min_group assignment: got %v, want 2 each", perWorker)
	}
	if err := p.Unpin(ctx, "m", "t", "vip"); err != nil {
		t.Fatal(err)
	}
	if pins, _ := p.Pins(ctx, PinFilter{Tenant: "t", Worker: "w2"}); len(pins) != 1 {
		t.Errorf("pins of t on w2 after Unpin: got %d, want 1", len(pins))
	}
	for _, tt := range []struct {
		model, worker string
		want          error
	}{{"nope", "w1", ErrUnknownModel}, {"m", "nope", ErrUnknownWorker}} {
		if err := p.Pin(ctx, tt.model, "t", "k", tt.worker, 0); !errors.Is(err, tt.want) {
			t.Errorf("Pin(%s, %s): got %v, want %v", tt.model, tt.worker, err, tt.want)
		}
	}
	if err := p.Drain(ctx, "w0"); err != nil {
		t.Fatal(err)
	}
	if err := p.Pin(ctx, "m", "t", "k", "w0", 0); !errors.Is(err, ErrWorkerDraining) {
		t.Errorf("Pin to a drained worker: got %v, want %v", err, ErrWorkerDraining)
	}
	if pins, _ := p.Pins(ctx, PinFilter{Worker: "w0"}); len(pins) != 0 {
		t.Errorf("pins of the drained w0: got %v, want none", pins)
	}
}

// TestPinRefusedWhenThePolicyIgnoresPins: a pin on a model routed without pins would be listed
// and never followed, so it is refused; the models that follow pins take it.
func TestPinRefusedWhenThePolicyIgnoresPins(t *testing.T) {
	ctx := context.Background()
	for _, policy := range []string{"round_robin", "least_request", "cache_aware", "consistent_hash", "sticky_session", "manual"} {
		p, _ := newTestPool(t, Config{Policy: policy, Workers: testWorkers(2, "m")})
		err := p.Pin(ctx, "m", "t", "k", "w1", 0)
		follows := policy == "sticky_session" || policy == "manual"
		if follows && err != nil || !follows && !errors.Is(err, ErrPinsIgnored) {
			t.Errorf("Pin on a model routed by %s: got %v, want %v", policy, err, map[bool]error{true: nil, false: ErrPinsIgnored}[follows])
		}
		if pins, _ := p.Pins(ctx, PinFilter{}); follows != (len(pins) == 1) {
			t.Errorf("pins after Pin on a model routed by %s: got %v", policy, pins)
		}
	}
}

// countingPins is a PinStore that counts the round trips made to it, by kind.
type countingPins struct {
	PinStore
	gets, claims, others atomic.Int32
}

// calls is every round trip made so far.
func (c *countingPins) calls() int32 { return c.gets.Load() + c.claims.Load() + c.others.Load() }

func (c *countingPins) Get(ctx context.Context, k PinKey, ttl time.Duration) (string, error) {
	c.gets.Add(1)
	return c.PinStore.Get(ctx, k, ttl)
}

func (c *countingPins) Claim(ctx context.Context, k PinKey, expect, worker string, ttl time.Duration) (string, error) {
	c.claims.Add(1)
	return c.PinStore.Claim(ctx, k, expect, worker, ttl)
}

func (c *countingPins) Set(ctx context.Context, k PinKey, worker string, ttl time.Duration) error {
	c.others.Add(1)
	return c.PinStore.Set(ctx, k, worker, ttl)
}

func (c *countingPins) Delete(ctx context.Context, k PinKey) error {
	c.others.Add(1)
	return c.PinStore.Delete(ctx, k)
}

func (c *countingPins) List(ctx context.Context, f PinFilter) ([]Pin, error) {
	c.others.Add(1)
	return c.PinStore.List(ctx, f)
}

// TestPinsAreLookedUpInPrepareNotInPick: sticky_session's and manual's picks are made under the
// model queue's lock, so a prepared request's pin store round trips (the look-up, and the claim
// of a new pin) all happen in Prepare, and its picks ask the store nothing, retries included.
func TestPinsAreLookedUpInPrepareNotInPick(t *testing.T) {
	for _, policy := range []string{"sticky_session", "manual"} {
		t.Run(policy, func(t *testing.T) {
			pins := &countingPins{PinStore: NewMemoryPinStore(time.Now, DefaultMaxPinsPerTenant)}
			cfg := Config{Workers: testWorkers(3, "m"), Models: map[string]ModelConfig{"m": {Policy: policy}}}
			cfg.SetDefaults()
			p, err := NewPool(cfg, Options{Pins: pins})
			if err != nil {
				t.Fatal(err)
			}
			var first string
			for i := range 3 {
				r := &Request{Model: "m", Tenant: "acme", SessionID: "s1", Tokens: 1}
				p.Prepare(context.Background(), r)
				before := pins.calls()
				for range 2 {
					l, err := p.Pick(context.Background(), r)
					if err != nil {
						t.Fatal(err)
					}
					if first == "" {
						first = l.Worker.ID()
					}
					if l.Worker.ID() != first {
						t.Errorf("request %d went to %s, want its session's worker %s", i, l.Worker.ID(), first)
					}
					l.Release(Outcome{})
				}
				if n := pins.calls() - before; n != 0 {
					t.Errorf("request %d: its picks made %d pin store round trips, want 0", i, n)
				}
			}
		})
	}
}
