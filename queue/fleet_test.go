package queue_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/queue"
)

// memFleet is an in-memory fleet store with the contract the Redis one keeps: lift, then
// charge; the fleet's floor is the least of the replicas' (no ageing). fail makes every exchange
// fail before applying anything. Each replica exchanges through its own memReplica.
type memFleet struct {
	mu       sync.Mutex // guards every field
	counters map[memKey]float64
	floors   map[string][3]float64 // by replica
	queued   map[memKey]map[string]int
	fail     bool
}

// memReplica is one replica's FairShareStore over a memFleet.
type memReplica struct {
	*memFleet
	id string
}

func (m *memFleet) replica(id string) memReplica { return memReplica{m, id} }

type memKey struct {
	tenant string
	class  queue.Class
}

func newMemFleet() *memFleet {
	return &memFleet{counters: map[memKey]float64{}, floors: map[string][3]float64{}, queued: map[memKey]map[string]int{}}
}

func (r memReplica) Exchange(_ context.Context, ex queue.FairShareExchange) (queue.FairShareCounts, error) {
	m := r.memFleet
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail {
		return queue.FairShareCounts{}, errors.New("fleet unreachable")
	}
	var got queue.FairShareCounts
	m.floors[r.id] = ex.Floors
	got.Floors = [3]float64{math.Inf(1), math.Inf(1), math.Inf(1)}
	for _, fl := range m.floors {
		for c := range fl {
			got.Floors[c] = min(got.Floors[c], fl[c])
		}
	}
	for _, f := range ex.Flows {
		k := memKey{f.Tenant, f.Class}
		v := m.counters[k]
		if f.Lifted {
			v = max(v, f.Lift)
		}
		v += f.Charge
		m.counters[k] = v
		got.Counters = append(got.Counters, v)
		if m.queued[k] == nil {
			m.queued[k] = map[string]int{}
		}
		m.queued[k][r.id] = f.Queued
		n := 0
		for _, q := range m.queued[k] {
			n += q
		}
		got.Queued = append(got.Queued, n)
	}
	return got, nil
}

func (m *memFleet) counter(tenant string, c queue.Class) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counters[memKey{tenant, c}]
}

func (m *memFleet) setFail(fail bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = fail
}

// newFleetQueue is newQueue with a fleet store: one replica of a fleet.
func newFleetQueue(t *testing.T, store queue.FairShareStore, c queue.Capacity) *queue.Queue {
	t.Helper()
	q, _ := newFleetQueueReg(t, store, c)
	return q
}

func newFleetQueueReg(t *testing.T, store queue.FairShareStore, c queue.Capacity) (*queue.Queue, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	q, err := queue.New(queue.Config{}, queue.Options{Model: "m", Clock: newFakeClock(),
		Registerer: reg, FairShare: store})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	q.SetCapacity(c)
	return q, reg
}

func sync1(t *testing.T, q *queue.Queue) {
	t.Helper()
	if err := q.SyncFairShare(context.Background()); err != nil {
		t.Fatalf("SyncFairShare: %v", err)
	}
}

// std is a Standard request of 100 prompt tokens and no output: a charge of 100.
func std(tenant string) queue.Request {
	return queue.Request{Tenant: tenant, Class: queue.Standard, PromptTokens: 100}
}

// serveAll dispatches every queued request of q, one at a time (q holds one in flight), each
// ending with the usage it was charged, and returns the tenants in the order served.
func serveAll(t *testing.T, first *queue.Grant, named map[*queue.Ticket]string) []string {
	t.Helper()
	var order []string
	g := first
	for len(named) > 0 {
		g.Done(queue.Usage{PromptTokens: 100})
		g = nil
		for tk, name := range named {
			if ready(tk) {
				if g != nil {
					t.Fatalf("two requests dispatched at once with one slot")
				}
				g = granted(t, tk)
				order = append(order, name)
				delete(named, tk)
			}
		}
		if g == nil {
			t.Fatalf("nothing dispatched after a Done; served so far %v", order)
		}
	}
	g.Done(queue.Usage{PromptTokens: 100})
	return order
}

// runHeavy serves n requests of tenant one after another on q.
func runHeavy(t *testing.T, q *queue.Queue, tenant string, n int) {
	t.Helper()
	for range n {
		granted(t, enqueue(t, q, std(tenant))).Done(queue.Usage{PromptTokens: 100})
	}
}

// TestFleetOrderFollowsFleetCounters: replica B serves a light tenant before a heavy one that
// arrived first, because replica A served the heavy tenant, and B orders by the fleet's
// counters; a replica without a fleet serves them round robin from the first arrival.
func TestFleetOrderFollowsFleetCounters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fleet bool
		want  []string
	}{
		{"fleet", true, []string{"light", "light", "light", "heavy", "heavy", "heavy"}},
		{"alone", false, []string{"heavy", "light", "heavy", "light", "heavy", "light"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newMemFleet()
			var sa, sb queue.FairShareStore = store.replica("a"), store.replica("b")
			if !tc.fleet {
				sa, sb = nil, nil
			}
			a := newFleetQueue(t, sa, queue.Capacity{Requests: 1})
			b := newFleetQueue(t, sb, queue.Capacity{Requests: 1})
			runHeavy(t, a, "heavy", 5) // 500 on A
			sync1(t, a)

			busy := granted(t, enqueue(t, b, std("other")))
			named := map[*queue.Ticket]string{}
			for range 3 {
				named[enqueue(t, b, std("heavy"))] = "heavy"
				named[enqueue(t, b, std("light"))] = "light"
			}
			sync1(t, b)
			got := serveAll(t, busy, named)
			if !slices.Equal(got, tc.want) {
				t.Errorf("B served %v, want %v", got, tc.want)
			}
			if tc.fleet {
				sync1(t, b)
				if c := store.counter("heavy", queue.Standard); c != 800 {
					t.Errorf("fleet counter of heavy: %v, want 5 served on A + 3 on B = 800", c)
				}
			}
		})
	}
}

// TestFleetReturningTenantStartsAtFleetFloor: a tenant new to a replica where nothing else
// waits starts at the least counter backlogged anywhere in the fleet, not at 0 (a start-up
// surplus over the tenants the others serve) nor at the counter of a heavy tenant another
// replica serves alone.
func TestFleetReturningTenantStartsAtFleetFloor(t *testing.T) {
	store := newMemFleet()
	a := newFleetQueue(t, store.replica("a"), queue.Capacity{Requests: 1})
	b := newFleetQueue(t, store.replica("b"), queue.Capacity{Requests: 1})
	c := newFleetQueue(t, store.replica("c"), queue.Capacity{Requests: 1})
	runHeavy(t, a, "x", 5)
	granted(t, enqueue(t, a, std("x")))
	enqueue(t, a, std("x")) // x backlogged on A at 600
	runHeavy(t, c, "h", 20)
	granted(t, enqueue(t, c, std("h")))
	enqueue(t, c, std("h")) // h backlogged on C alone, at 2100
	sync1(t, a)
	sync1(t, c)
	sync1(t, b) // B, with nothing queued, learns the fleet's floor: 600
	granted(t, enqueue(t, b, std("z"))).Done(queue.Usage{PromptTokens: 100})
	sync1(t, b)
	if got, want := store.counter("z", queue.Standard), 700.0; got != want {
		t.Errorf("fleet counter of z after one request on B: %v, want the fleet's least backlogged 600 + 100 = %v", got, want)
	}
}

// TestFleetCutFallsBackAndRejoins: while the fleet is unreachable a replica keeps serving by
// its own counters and loses no charge; the first exchange that succeeds sends them all, once.
func TestFleetCutFallsBackAndRejoins(t *testing.T) {
	store := newMemFleet()
	a, reg := newFleetQueueReg(t, store.replica("a"), queue.Capacity{Requests: 1})
	runHeavy(t, a, "h", 2)
	sync1(t, a)
	store.setFail(true)
	runHeavy(t, a, "h", 3)
	if err := a.SyncFairShare(context.Background()); err == nil {
		t.Fatal("SyncFairShare with the fleet cut: got nil, want an error")
	}
	// Served by local counters meanwhile, as without a fleet: l, new, is lifted to h's counter,
	// and equal counters go in turn, h first.
	busy := granted(t, enqueue(t, a, std("h")))
	named := map[*queue.Ticket]string{enqueue(t, a, std("h")): "h", enqueue(t, a, std("l")): "l"}
	if got := serveAll(t, busy, named); !slices.Equal(got, []string{"h", "l"}) {
		t.Errorf("served %v with the fleet cut, want [h l]", got)
	}
	if err := a.SyncFairShare(context.Background()); err == nil {
		t.Fatal("SyncFairShare with the fleet cut: got nil, want an error")
	}
	store.setFail(false)
	sync1(t, a)
	if got := store.counter("h", queue.Standard); got != 700 {
		t.Errorf("fleet counter of h after rejoining: %v, want 7 requests x 100 = 700", got)
	}
	sync1(t, a)
	if got := store.counter("h", queue.Standard); got != 700 {
		t.Errorf("fleet counter of h after a second exchange: %v, want 700 (nothing sent twice)", got)
	}
	for result, want := range map[string]float64{"ok": 3, "failed": 2} {
		if got := value(t, reg, "usher_queue_fair_share_exchanges_total", map[string]string{"result": result}); got != want {
			t.Errorf("usher_queue_fair_share_exchanges_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// TestSyncFairShareWithoutFleet: without a store, SyncFairShare does nothing.
func TestSyncFairShareWithoutFleet(t *testing.T) {
	q := newFleetQueue(t, nil, queue.Capacity{Requests: 1})
	runHeavy(t, q, "h", 2)
	if err := q.SyncFairShare(context.Background()); err != nil {
		t.Errorf("SyncFairShare without a store: %v", err)
	}
}

// hookFleet runs during inside the first Exchange, before the fleet answers (or fails).
type hookFleet struct {
	memReplica
	once   sync.Once
	during func()
}

func (h *hookFleet) Exchange(ctx context.Context, ex queue.FairShareExchange) (queue.FairShareCounts, error) {
	h.once.Do(h.during)
	return h.memReplica.Exchange(ctx, ex)
}

// TestFleetChargesDuringExchangeAreKept: requests served and tenants lifted while an exchange is
// on its way (the queue's lock is not held across it) are counted on top of the fleet's answer,
// and sent with the next exchange, whether the first one succeeds or fails.
func TestFleetChargesDuringExchangeAreKept(t *testing.T) {
	for _, fail := range []bool{false, true} {
		t.Run(map[bool]string{false: "answered", true: "failed"}[fail], func(t *testing.T) {
			store := &hookFleet{memReplica: newMemFleet().replica("a")}
			a := newFleetQueue(t, store, queue.Capacity{Requests: 1})
			runHeavy(t, a, "h", 3)
			store.during = func() {
				runHeavy(t, a, "h", 2) // h served last at 400
				runHeavy(t, a, "n", 1) // new: lifted to the floor, 400 (h's counter when served last), and charged 100
				store.setFail(fail)
			}
			err := a.SyncFairShare(context.Background())
			if fail != (err != nil) {
				t.Fatalf("first SyncFairShare: %v", err)
			}
			store.setFail(false)
			sync1(t, a)
			if got := store.counter("h", queue.Standard); got != 500 {
				t.Errorf("fleet counter of h: %v, want 5 x 100 = 500", got)
			}
			if got := store.counter("n", queue.Standard); got != 500 {
				t.Errorf("fleet counter of n: %v, want its lift 400 + 100 = 500", got)
			}
		})
	}
}

// TestFleetCounterExpiredWhileIdle: a tenant whose fleet counter expired while it was idle does
// not restart at 0 when it comes back: the replica's own counter of it holds the fleet's up.
func TestFleetCounterExpiredWhileIdle(t *testing.T) {
	store := newMemFleet()
	a := newFleetQueue(t, store.replica("a"), queue.Capacity{Requests: 1})
	runHeavy(t, a, "x", 5)
	sync1(t, a)
	store.mu.Lock()
	delete(store.counters, memKey{"x", queue.Standard}) // expired
	store.mu.Unlock()
	runHeavy(t, a, "x", 1)
	sync1(t, a)
	if got := store.counter("x", queue.Standard); got != 600 {
		t.Errorf("fleet counter of x back after its key expired: %v, want 500 known here + 100 = 600", got)
	}
}

// TestBacklogWeighsFlows: Backlog counts the requests queued and sums the weights of the flows
// with requests queued, once per flow whatever its queue's length: the heavy tenant's five
// requests weigh what the light one's one does; a flow with nothing queued (all dispatched)
// weighs nothing.
func TestBacklogWeighsFlows(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	granted(t, enqueue(t, q, queue.Request{Tenant: "served", Class: queue.Standard, Weight: 4, MaxTokens: 10}))
	for range 5 {
		enqueue(t, q, queue.Request{Tenant: "heavy", Class: queue.Standard, Weight: 1, MaxTokens: 10})
	}
	enqueue(t, q, queue.Request{Tenant: "light", Class: queue.Batch, Weight: 2, MaxTokens: 10})
	enqueue(t, q, queue.Request{Tenant: "chat", Class: queue.Interactive, Weight: 0.5, MaxTokens: 10})
	enqueue(t, q, queue.Request{Tenant: "chat", Class: queue.Interactive, Weight: 0.5, MaxTokens: 10})
	got := q.Backlog()
	want := queue.Backlog{Interactive: 2, All: 8, InteractiveWeight: 0.5, Weight: 3.5}
	if got != want {
		t.Fatalf("Backlog() = %+v, want %+v", got, want)
	}
}

// TestBacklogWeighsFlowsInPartAcrossTheFleet: a flow queued on two replicas weighs on each in
// proportion to its requests queued there (heavy: 3 on A, 1 on B), a flow queued on one alone
// weighs in full, so over the fleet each weighs its weight once; once the fleet cannot be
// reached, each replica weighs its flows in full again.
func TestBacklogWeighsFlowsInPartAcrossTheFleet(t *testing.T) {
	fleet := newMemFleet()
	a := newFleetQueue(t, fleet.replica("A"), queue.Capacity{})
	b := newFleetQueue(t, fleet.replica("B"), queue.Capacity{})
	for range 3 {
		enqueue(t, a, std("heavy"))
	}
	enqueue(t, a, std("light"))
	enqueue(t, b, std("heavy"))
	sync1(t, a)
	sync1(t, b)
	sync1(t, a)
	if got, want := a.Backlog(), (queue.Backlog{All: 4, Weight: 1.75}); got != want {
		t.Fatalf("A's Backlog() = %+v, want %+v", got, want)
	}
	if got, want := b.Backlog(), (queue.Backlog{All: 1, Weight: 0.25}); got != want {
		t.Fatalf("B's Backlog() = %+v, want %+v", got, want)
	}
	fleet.setFail(true)
	if err := a.SyncFairShare(context.Background()); err == nil {
		t.Fatal("SyncFairShare with the fleet unreachable: got no error")
	}
	if got, want := a.Backlog(), (queue.Backlog{All: 4, Weight: 2}); got != want {
		t.Fatalf("A's Backlog() with the fleet unreachable = %+v, want %+v", got, want)
	}
}
