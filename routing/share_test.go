package routing

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestWaterFill(t *testing.T) {
	tests := []struct {
		name     string
		capacity int64
		demands  []int64
		want     []int64
	}{
		{"all fit", 10, []int64{2, 3, 1}, []int64{2, 3, 1}},
		{"equal parts", 12, []int64{20, 20, 20}, []int64{4, 4, 4}},
		{"the small demand whole, the rest even", 12, []int64{40, 2, 40}, []int64{5, 2, 5}},
		{"remainder to the lowest indices", 10, []int64{9, 9, 9}, []int64{4, 3, 3}},
		{"remainder skips the satisfied", 10, []int64{1, 9, 9}, []int64{1, 5, 4}},
		{"nothing", 0, []int64{3, 3}, []int64{0, 0}},
		{"no demand", 5, []int64{0, 0}, []int64{0, 0}},
		{"negative demand counts as none", 5, []int64{-3, 9}, []int64{0, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := waterFill(tt.capacity, make([]int64, len(tt.demands)), tt.demands, []int{0, 1, 2}[:len(tt.demands)]); !slices.Equal(got, tt.want) {
				t.Fatalf("waterFill(%d, %v) = %v, want %v", tt.capacity, tt.demands, got, tt.want)
			}
		})
	}
}

func TestSplitShares(t *testing.T) {
	tests := []struct {
		name               string
		limit              int64
		interactive, total []int64
		want               []int64
	}{
		{"by demand, max-min", 12, []int64{0, 0, 0}, []int64{40, 2, 40}, []int64{5, 2, 5}},
		{"interactive first", 12, []int64{8, 0}, []int64{8, 100}, []int64{8, 4}},
		{"interactive alone past the limit", 12, []int64{20, 0}, []int64{20, 100}, []int64{12, 0}},
		// The second replica holds two flows (interactive and standard), the third one: by
		// weight, 6.7 and 3.3 (one queue would serve the two standard flows 3.5 each on top of
		// the 3 interactive: 6.5 and 3.5); by the count of requests it was 5 and 5.
		{"interactive split, then the rest", 12, []int64{2, 3, 0}, []int64{2, 30, 30}, []int64{2, 7, 3}},
		{"room nobody asks for, max-min too", 12, []int64{0, 0, 0}, []int64{3, 0, 0}, []int64{4, 4, 4}},
		{"room nobody asks for, to the idle", 12, []int64{0, 0, 0}, []int64{7, 0, 0}, []int64{7, 3, 2}},
		{"an idle fleet", 4, []int64{0, 0, 0}, []int64{0, 0, 0}, []int64{2, 1, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Every replica's requests are one tenant's of weight 1 (one flow per class).
			d := fleetDemand{interactive: tt.interactive, demand: tt.total,
				interactiveWeight: make([]int64, len(tt.total)), weight: make([]int64, len(tt.total))}
			for i := range tt.total {
				if tt.interactive[i] > 0 {
					d.interactiveWeight[i] = shareWeightUnit
				}
				d.weight[i] = d.interactiveWeight[i]
				if tt.total[i] > tt.interactive[i] {
					d.weight[i] += shareWeightUnit
				}
			}
			got := splitShares(tt.limit, d, nil)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("splitShares(%d, %v, %v) = %v, want %v", tt.limit, tt.interactive, tt.total, got, tt.want)
			}
			if s := sum(got); s != tt.limit {
				t.Fatalf("shares sum to %d, want the limit %d", s, tt.limit)
			}
		})
	}
}

// TestSplitSharesByWeight: the split weighs each replica's demand by the weights of the flows
// it has backlogged (in thousandths), as one queue's fair share serves them, not by its count
// of requests.
func TestSplitSharesByWeight(t *testing.T) {
	const u = shareWeightUnit
	tests := []struct {
		name                string
		limit               int64
		interactive, demand []int64
		interWeight, weight []int64
		want                []int64
	}{
		// The pinned bench: f1 and f4 on the first replica, f2 and f3 alone on the others;
		// by the count of requests each replica would get a third (3, 3, 2).
		{"two tenants on one replica, one on each other", 8, []int64{0, 0, 0}, []int64{60, 60, 60},
			[]int64{0, 0, 0}, []int64{2 * u, u, u}, []int64{4, 2, 2}},
		{"a tenant of weight 2", 12, []int64{0, 0}, []int64{100, 100},
			[]int64{0, 0}, []int64{2 * u, u}, []int64{8, 4}},
		{"the heavier replica asks for less", 8, []int64{0, 0, 0}, []int64{2, 100, 100},
			[]int64{0, 0, 0}, []int64{2 * u, u, u}, []int64{2, 3, 3}},
		{"interactive by weight, first", 12, []int64{20, 20, 0}, []int64{20, 20, 100},
			[]int64{2 * u, u, 0}, []int64{2 * u, u, 5 * u}, []int64{8, 4, 0}},
		{"interactive, then the other classes by their own weights", 12, []int64{2, 0}, []int64{30, 30},
			[]int64{u, 0}, []int64{2 * u, 4 * u}, []int64{4, 8}},
		// The first replica has one interactive request queued and five in flight: its
		// interactive flow weighs in the rest too, so it keeps room for those in flight
		// instead of waiting for all five to end before its next one goes.
		{"interactive alone keeps room for those in flight", 12, []int64{1, 0}, []int64{6, 400},
			[]int64{u, 0}, []int64{u, u}, []int64{6, 6}},
		{"nothing queued keeps its requests in flight", 12, []int64{0, 0, 0}, []int64{3, 100, 100},
			[]int64{0, 0, 0}, []int64{0, u, u}, []int64{3, 5, 4}},
		{"leftover units in tie order", 7, []int64{0, 0, 0}, []int64{50, 50, 50},
			[]int64{0, 0, 0}, []int64{u, u, u}, []int64{3, 2, 2}},
		{"weights at their bound", maxSlots, []int64{0, 0, 0}, []int64{maxSlots, maxSlots, maxSlots},
			[]int64{0, 0, 0}, []int64{maxShareWeight, maxShareWeight, 1}, []int64{maxSlots / 2, maxSlots / 2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := splitShares(tt.limit, fleetDemand{tt.interactive, tt.demand, tt.interWeight, tt.weight}, nil)
			if !slices.Equal(got, tt.want) {
				t.Fatalf("splitShares(%d, %v, %v, weights %v, %v) = %v, want %v",
					tt.limit, tt.interactive, tt.demand, tt.interWeight, tt.weight, got, tt.want)
			}
			if s := sum(got); s != tt.limit {
				t.Fatalf("shares sum to %d, want the limit %d", s, tt.limit)
			}
		})
	}
}

// memFleet is an in-memory ShareStore shared by the replicas of a test, with the semantics of
// RedisStore's script: each replica's grant is max(hold, min(want, limit - the live others'
// grants)); a report lives ShareReportTTL by the fleet's clock. cut makes every exchange fail.
type memFleet struct {
	now func() time.Time

	mu      sync.Mutex
	cut     bool
	reports map[string]map[string]memReport // by worker, then replica
	// reserve is, by worker, then replica, the holds of the worker's interactive reserve, and
	// lent the loans to it (requests only).
	reserve, lent map[string]map[string]memHold
}

type memReport struct {
	d     ReplicaDemand
	grant int64
	at    time.Time
}

type memHold struct {
	requests, tokens int64
	at               time.Time
}

func newMemFleet(now func() time.Time) *memFleet {
	return &memFleet{now: now, reports: map[string]map[string]memReport{}, reserve: map[string]map[string]memHold{},
		lent: map[string]map[string]memHold{}}
}

// holdsOf is the worker's live reserve holds, the expired ones dropped. f.mu must be held.
func (f *memFleet) holdsOf(worker string) map[string]memHold { return f.liveOf(f.reserve, worker) }

// loansOf is the worker's live loans to its reserve, the expired ones dropped. f.mu must be held.
func (f *memFleet) loansOf(worker string) map[string]memHold { return f.liveOf(f.lent, worker) }

func (f *memFleet) liveOf(of map[string]map[string]memHold, worker string) map[string]memHold {
	h := of[worker]
	if h == nil {
		h = map[string]memHold{}
		of[worker] = h
	}
	maps.DeleteFunc(h, func(_ string, e memHold) bool { return f.now().Sub(e.at) > ShareReportTTL })
	return h
}

// sumOf is the requests of holds.
func sumOf(holds map[string]memHold) int64 {
	var n int64
	for _, e := range holds {
		n += e.requests
	}
	return n
}

// LendReserve has the semantics of RedisStore's script.
func (m memShares) LendReserve(_ context.Context, worker string, size, delta int64) (int64, int64, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return 0, 0, errCut
	}
	loans := f.loansOf(worker)
	held, lent, mine := sumOf(f.holdsOf(worker)), sumOf(loans), loans[m.name].requests
	change := int64(0)
	switch {
	case delta > 0 && size+lent-held <= 0:
		change = delta
	case delta < 0:
		change = -min(mine, -delta, max(size+lent-held, 0))
	}
	if change != 0 {
		mine, lent = mine+change, lent+change
		if mine > 0 {
			loans[m.name] = memHold{requests: mine, at: f.now()}
		} else {
			delete(loans, m.name)
		}
	}
	return mine, size + lent - held, nil
}

// TakeReserve has the semantics of RedisStore's script.
func (m memShares) TakeReserve(_ context.Context, claims []ReserveClaim) (int, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return -1, errCut
	}
	best, bestLeft := -1, int64(-1)
	for i, c := range claims {
		var n, t int64
		for _, e := range f.holdsOf(c.Worker) {
			n, t = n+e.requests, t+e.tokens
		}
		if n+c.WantRequests <= c.Requests+sumOf(f.loansOf(c.Worker)) && t+c.Want <= c.Tokens && c.Tokens-t > bestLeft {
			best, bestLeft = i, c.Tokens-t
		}
	}
	if best >= 0 {
		h := f.holdsOf(claims[best].Worker)
		e := h[m.name]
		h[m.name] = memHold{requests: e.requests + claims[best].WantRequests, tokens: e.tokens + claims[best].Want, at: f.now()}
	}
	return best, nil
}

// reserveHeld is the requests the live replicas hold of the worker's reserve.
func (f *memFleet) reserveHeld(worker string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sumOf(f.holdsOf(worker))
}

// reserveLent is the requests the live replicas lend the worker's reserve.
func (f *memFleet) reserveLent(worker string) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sumOf(f.loansOf(worker))
}

// replica is the ShareStore of one replica of the fleet.
func (f *memFleet) replica(name string) ShareStore { return memShares{f, name} }

func (f *memFleet) setCut(cut bool) {
	f.mu.Lock()
	f.cut = cut
	f.mu.Unlock()
}

// forget drops every report: a Redis restarted empty.
func (f *memFleet) forget() {
	f.mu.Lock()
	clear(f.reports)
	clear(f.reserve)
	clear(f.lent)
	f.mu.Unlock()
}

type memShares struct {
	f    *memFleet
	name string
}

var errCut = errors.New("store cut")

func (m memShares) ExchangeShares(_ context.Context, reports []ShareReport) ([]ShareAnswer, error) {
	f := m.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cut {
		return nil, errCut
	}
	now := f.now()
	out := make([]ShareAnswer, len(reports))
	for i, r := range reports {
		held := f.reports[r.Worker]
		if held == nil {
			held = map[string]memReport{}
			f.reports[r.Worker] = held
		}
		var others int64
		var fleet []ReplicaDemand
		for name, e := range held {
			if name == m.name {
				continue
			}
			if now.Sub(e.at) > ShareReportTTL {
				delete(held, name)
				continue
			}
			others += e.grant
			fleet = append(fleet, e.d)
		}
		grant := max(r.Hold, min(r.Want, r.Limit-others))
		d := ReplicaDemand{Replica: m.name, Interactive: r.Interactive, Demand: r.Demand, InteractiveWeight: r.InteractiveWeight, Weight: r.Weight}
		held[m.name] = memReport{d: d, grant: grant, at: now}
		if h := f.holdsOf(r.Worker); r.Reserve > 0 || r.ReserveTokens > 0 {
			h[m.name] = memHold{requests: r.Reserve, tokens: r.ReserveTokens, at: now}
		} else {
			delete(h, m.name)
		}
		if l := f.loansOf(r.Worker); r.Lent > 0 {
			l[m.name] = memHold{requests: r.Lent, at: now}
		} else {
			delete(l, m.name)
		}
		d.Self = true
		out[i] = ShareAnswer{Grant: grant, Fleet: append(fleet, d),
			ReserveHeld: sumOf(f.holdsOf(r.Worker)), ReserveLent: sumOf(f.loansOf(r.Worker))}
	}
	return out, nil
}

// simReplica is one gateway replica of a simulated fleet: a pool of one worker "w0" (limit 12)
// of model m, and a backlog of requests queued for m that it places whenever its pool lets it.
type simReplica struct {
	name string
	pool *Pool
	// queued are the requests waiting, interactive and other; life is how many rounds a placed
	// request stays in flight (0: until the test ends).
	queued [2]int
	// tenants is how many tenants of weight 1 the requests queued of each kind are spread
	// over (0: one).
	tenants [2]int
	life    int
	// keep is the least queued at the start of each round: a backlog that never runs out.
	keep   [2]int
	leases []simLease
	// placed counts the requests placed.
	placed int
}

type simLease struct {
	l    *Lease
	done int
}

const simLimit = 12

func newSimFleet(t *testing.T, clock *fakeClock, fleet *memFleet, names ...string) []*simReplica {
	t.Helper()
	return newSimFleetWith(t, clock, fleet, 0, names...)
}

// newSimFleetWith is newSimFleet with Options.InteractiveReserve set to reserve.
func newSimFleetWith(t *testing.T, clock *fakeClock, fleet *memFleet, reserve float64, names ...string) []*simReplica {
	t.Helper()
	var rs []*simReplica
	for _, name := range names {
		cfg := Config{Workers: []WorkerSpec{{ID: "w0", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: simLimit}}}
		opts := Options{Now: clock.Now, InteractiveReserve: reserve}
		if fleet != nil {
			opts.Shares = fleet.replica(name)
		}
		p, _ := newTestPoolWith(t, cfg, opts)
		rs = append(rs, &simReplica{name: name, pool: p})
	}
	return rs
}

func (r *simReplica) demand(string) ModelBacklog {
	var w [2]float64
	for k, n := range r.queued {
		if n > 0 {
			w[k] = float64(max(r.tenants[k], 1))
		}
	}
	return ModelBacklog{Interactive: int64(r.queued[0]), All: int64(r.queued[0] + r.queued[1]),
		InteractiveWeight: w[0], Weight: w[0] + w[1]}
}

// place places queued requests, interactive first, until the pool refuses one.
func (r *simReplica) place(t *testing.T, round int) {
	t.Helper()
	for r.queued[0]+r.queued[1] > 0 {
		interactive := r.queued[0] > 0
		l, err := r.pool.Pick(context.Background(), &Request{Model: "m", Interactive: interactive})
		if errors.Is(err, ErrNoRoom) {
			return
		}
		if err != nil {
			t.Fatalf("%s: pick: %v", r.name, err)
		}
		done := -1
		if r.life > 0 {
			done = round + r.life
		}
		r.leases = append(r.leases, simLease{l, done})
		r.placed++
		if interactive {
			r.queued[0]--
		} else {
			r.queued[1]--
		}
	}
}

// finish releases the requests whose life ended by round.
func (r *simReplica) finish(round int) {
	r.leases = slices.DeleteFunc(r.leases, func(s simLease) bool {
		if s.done >= 0 && s.done <= round {
			s.l.Release(Outcome{})
			return true
		}
		return false
	})
}

func (r *simReplica) inFlight() int64 { return modelWorkersOf(r.pool).InFlight() }

func (r *simReplica) share() int64 {
	n, _ := modelWorkersOf(r.pool).Share()
	return n
}

func modelWorkersOf(p *Pool) *Worker { return p.snap.Load().models["m"].workers[0] }

// simRun runs rounds of 50 ms: each replica in turn finishes, exchanges and places. It fails
// the test whenever the fleet has more than the worker's limit in flight, and returns the most
// it had.
func simRun(t *testing.T, clock *fakeClock, rs []*simReplica, from, rounds int) (peak int64) {
	t.Helper()
	for round := from; round < from+rounds; round++ {
		clock.Advance(50 * time.Millisecond)
		for _, r := range rs {
			r.queued[0], r.queued[1] = max(r.queued[0], r.keep[0]), max(r.queued[1], r.keep[1])
			r.finish(round)
			_ = r.pool.SyncShares(context.Background(), r.demand)
			r.place(t, round)
			var total int64
			for _, o := range rs {
				total += o.inFlight()
			}
			if total > simLimit {
				t.Fatalf("round %d: the fleet has %d in flight on w0, over its limit %d (%s)", round, total, simLimit, simState(rs))
			}
			peak = max(peak, total)
		}
	}
	return peak
}

func simState(rs []*simReplica) string {
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf("%s: in flight %d, share %d, queued %v; ", r.name, r.inFlight(), r.share(), r.queued)
	}
	return s
}

func wantInFlight(t *testing.T, rs []*simReplica, want ...int64) {
	t.Helper()
	for i, r := range rs {
		if got := r.inFlight(); got != want[i] {
			t.Fatalf("%s has %d in flight, want %d (%s)", r.name, got, want[i], simState(rs))
		}
	}
}

// TestSharesSplitByDemand: two replicas with a long backlog and one with two requests share a
// worker of 12 slots max-min: 2 for the small one, 5 each for the others, whichever exchanged
// first; the fleet never has more than 12 in flight. Without a fleet each replica fills the
// worker alone (36 in flight).
func TestSharesSplitByDemand(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleet(t, clock, newMemFleet(clock.Now), "a", "b", "c")
	rs[0].queued[1], rs[0].life = 400, 2
	rs[1].queued[1], rs[1].life = 400, 2
	rs[2].queued[1] = 2
	if peak := simRun(t, clock, rs, 0, 40); peak != simLimit {
		t.Fatalf("the fleet's peak in flight was %d, want the whole limit %d", peak, simLimit)
	}
	rs[0].finish(1 << 30)
	rs[1].finish(1 << 30)
	simRun(t, clock, rs, 40, 4)
	wantInFlight(t, rs, 5, 5, 2)

	alone := newSimFleet(t, clock, nil, "a", "b", "c")
	for _, r := range alone {
		r.queued[1] = 400
		r.place(t, 0)
	}
	wantInFlight(t, alone, 12, 12, 12)
}

// TestSharesFollowBackloggedTenants: tenants pinned to replicas (a balancer with client
// affinity): a queues for two tenants, b and c for one each, all with long backlogs. The worker
// of 12 slots is split 6/3/3, so each tenant has 3 wherever it is queued, as one queue would
// serve the four; split by the replicas' counts of requests it would be 4/4/4, and a's two
// tenants would get 2 each against b's and c's 4.
func TestSharesFollowBackloggedTenants(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleet(t, clock, newMemFleet(clock.Now), "a", "b", "c")
	for _, r := range rs {
		r.keep[1], r.life = 400, 2
	}
	rs[0].tenants[1] = 2
	simRun(t, clock, rs, 0, 60)
	for i, want := range []int64{6, 3, 3} {
		if got := rs[i].share(); got != want {
			t.Fatalf("%s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}
}

// TestPinnedTenantsServedAlikeBesideTheReserve: the pinned bench with the fleet's interactive
// reserve: a queues for two tenants, b and c for one each, all with long backlogs, on a worker
// of 12 slots of which the reserve keeps 1 (nobody interactive takes it), so the split divides
// 11 by 2:1:1. Over 30 s of requests of half a second, a places half of the requests and b and c
// a quarter each, as one queue would serve the four tenants. With the units left over in a
// fixed order the split was 6/3/2 at every exchange, and c placed 18% of them.
func TestPinnedTenantsServedAlikeBesideTheReserve(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleetWith(t, clock, newMemFleet(clock.Now), 1.0/simLimit, "a", "b", "c")
	for _, r := range rs {
		r.keep[1], r.life = 400, 10
	}
	rs[0].tenants[1] = 2
	simRun(t, clock, rs, 0, 40) // the shares settle
	for _, r := range rs {
		r.placed = 0
	}
	simRun(t, clock, rs, 40, 600)
	total := rs[0].placed + rs[1].placed + rs[2].placed
	for i, want := range []float64{0.5, 0.25, 0.25} {
		if got := float64(rs[i].placed) / float64(total); got < want-0.02 || got > want+0.02 {
			t.Errorf("%s placed %d of the %d requests (%.3f), want %.2f (%s)", rs[i].name, rs[i].placed, total, got, want, simState(rs))
		}
	}
}

// TestSharesServeInteractiveFirst: a replica that always has 8 interactive requests queued gets
// 8 of the worker's 12 slots from one with a batch flood, though max-min by the count of
// requests alone would give it 6.
func TestSharesServeInteractiveFirst(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleet(t, clock, newMemFleet(clock.Now), "a", "b")
	rs[0].keep[0], rs[0].life = 8, 2
	rs[1].keep[1], rs[1].life = 400, 2
	simRun(t, clock, rs, 0, 40)
	for i, want := range []int64{8, 4} {
		if got := rs[i].share(); got != want {
			t.Fatalf("%s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}
}

// TestSharesGrowOnlyIntoFreeRoom: a replica holds the whole worker with long requests; another
// gets a backlog. Its share grows only as the first one's requests end, the fleet never has
// more than the limit in flight, and the two end at half each.
func TestSharesGrowOnlyIntoFreeRoom(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleet(t, clock, newMemFleet(clock.Now), "a", "b")
	rs[0].queued[1], rs[0].life = 400, 10
	simRun(t, clock, rs, 0, 5)
	wantInFlight(t, rs, 12, 0)
	rs[1].queued[1], rs[1].life = 400, 10
	simRun(t, clock, rs, 5, 3)
	if got := rs[1].inFlight(); got != 0 {
		t.Fatalf("b placed %d while a's requests all ran, want 0 (%s)", got, simState(rs))
	}
	simRun(t, clock, rs, 8, 60)
	for _, r := range rs {
		r.life = 0
	}
	simRun(t, clock, rs, 68, 30)
	wantInFlight(t, rs, 6, 6)
}

// TestSharesFallBackWhenCutAndRejoin: split 5/5/2 by demand; with the store cut every replica
// keeps within its last grant and a third of the worker (4: a and b place nothing until their
// requests end below it), from its own counts, for as long as the cut lasts (c does not grow to
// its third: it cannot tell when a's and b's requests above theirs end); restored with its
// reports lost (a Redis restarted empty), the replicas stay within those for ShareReportTTL,
// until every one has reported again, and then return to the split by demand. The fleet never
// has more than the limit in flight.
func TestSharesFallBackWhenCutAndRejoin(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleet(t, clock, fleet, "a", "b", "c")
	rs[0].queued[1], rs[0].life = 4000, 2
	rs[1].queued[1], rs[1].life = 4000, 2
	rs[2].queued[1] = 2
	simRun(t, clock, rs, 0, 40)
	for i, want := range []int64{5, 5, 2} {
		if got := rs[i].share(); got != want {
			t.Fatalf("before the cut %s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}

	fleet.setCut(true)
	ttl := int(ShareReportTTL / (50 * time.Millisecond))
	simRun(t, clock, rs, 40, ttl-2)
	for i, want := range []int64{4, 4, 2} {
		if got := rs[i].share(); got != want {
			t.Fatalf("cut, the last grants still counted: %s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}
	simRun(t, clock, rs, 40+ttl-2, 4)
	for i, want := range []int64{4, 4, 2} {
		if got := rs[i].share(); got != want {
			t.Fatalf("cut past the reports' TTL: %s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}
	if got := rs[0].inFlight(); got != 4 {
		t.Fatalf("cut: a has %d in flight, want its third, 4 (%s)", got, simState(rs))
	}

	fleet.forget()
	fleet.setCut(false)
	at := 40 + ttl + 2
	simRun(t, clock, rs, at, ttl-2)
	for _, r := range rs {
		if got := r.share(); got > 4 {
			t.Fatalf("rejoining: %s's share is %d, want at most its third, 4 (%s)", r.name, got, simState(rs))
		}
	}
	simRun(t, clock, rs, at+ttl-2, 20)
	for i, want := range []int64{5, 5, 2} {
		if got := rs[i].share(); got != want {
			t.Fatalf("rejoined: %s's share is %d, want %d (%s)", rs[i].name, got, want, simState(rs))
		}
	}
}

// TestSharesNeverGrowWhileCut: a holds the whole worker with requests that outlast
// ShareReportTTL (10 s); b's backlog arrives as the store is cut. b cannot tell when a's
// requests end, so it stays within its last grant (none) for the whole cut, rather than take
// its third once its reports have expired: a's requests still run then, and the worker would
// be sent 16. Once the store is back, b's share grows as a's requests end.
func TestSharesNeverGrowWhileCut(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleet(t, clock, fleet, "a", "b", "c")
	rs[0].queued[1], rs[0].life = simLimit, 200
	simRun(t, clock, rs, 0, 10)
	wantInFlight(t, rs, simLimit, 0, 0)

	fleet.setCut(true)
	rs[1].keep[1], rs[1].life = 400, 2
	ttl := int(ShareReportTTL / (50 * time.Millisecond))
	simRun(t, clock, rs, 10, 3*ttl)
	wantInFlight(t, rs, simLimit, 0, 0)

	fleet.setCut(false)
	simRun(t, clock, rs, 10+3*ttl, 200)
	if got := rs[1].inFlight(); got == 0 {
		t.Fatalf("b placed nothing once the store was back and a's requests ended (%s)", simState(rs))
	}
}

// TestSharesWithoutStore: without a ShareStore a replica places up to the worker's whole limit,
// SyncShares does nothing, and the worker's status says it is not split.
func TestSharesWithoutStore(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	rs := newSimFleet(t, clock, nil, "a")
	if err := rs[0].pool.SyncShares(context.Background(), rs[0].demand); err != nil {
		t.Fatal(err)
	}
	if n, shared := modelWorkersOf(rs[0].pool).Share(); n != simLimit || shared {
		t.Fatalf("share %d (shared %v), want %d, not shared", n, shared, simLimit)
	}
}

// TestLeftoverUnitsRotateOverWorkers: three replicas of equal demand on 30 workers of 8 slots:
// each worker leaves 2 units over a split in thirds, and they go to different replicas on
// different workers, so each replica holds about a third of the fleet's 240 slots; by name
// alone the same replica would be left 2 on every worker (60 of 240).
func TestLeftoverUnitsRotateOverWorkers(t *testing.T) {
	fleet := []ReplicaDemand{{Replica: "a", Demand: 50}, {Replica: "b", Demand: 50}, {Replica: "c", Demand: 50}}
	got := make([]int64, len(fleet))
	for w := range 30 {
		s := &shares{fleet: map[string]*workerFleet{}}
		id := fmt.Sprintf("w%d", w)
		for self := range fleet {
			f := &workerFleet{demands: slices.Clone(fleet), self: self}
			f.demands[self].Self = true
			s.fleet[id] = f
			got[self] += s.target(id, ShareReport{Limit: 8, Demand: 50}, time.Unix(1000, 0))
		}
	}
	if sum(got) != 240 {
		t.Fatalf("the replicas' shares sum to %d over the workers, want 240 (%v)", sum(got), got)
	}
	for i, n := range got {
		if n < 72 || n > 88 {
			t.Errorf("replica %s holds %d of the 240 slots, want about a third, 72..88 (all: %v)", fleet[i].Replica, n, got)
		}
	}
}

// TestFractionalSharesCarryOverTime: the pinned bench with the fleet's interactive reserve
// out of the split: two workers of 7 requests each (8 less the reserve) split among a replica
// queueing for two tenants and two queueing for one each (weights 2:1:1), 3.5, 1.75 and 1.75 of
// each worker. At every moment the parts add up to each worker's 7; over 60 rounds each
// replica holds its exact part, so each tenant a quarter of the workers. With the units left
// over in a fixed order (the replica with the most demand first) the first replica held 4 of
// every 7, 8 of the 14 slots, and each of its tenants 29% of the service.
func TestFractionalSharesCarryOverTime(t *testing.T) {
	const u = shareWeightUnit
	fleet := []ReplicaDemand{{Replica: "a", Demand: 128, Weight: 2 * u}, {Replica: "b", Demand: 64, Weight: u},
		{Replica: "c", Demand: 64, Weight: u}}
	workers := []string{"sim-1", "sim-2"}
	const rounds = 60
	held := make([]int64, len(fleet))
	start := time.Unix(1000, 0)
	for r := range rounds {
		now := start.Add(time.Duration(r) * shareRound)
		for _, id := range workers {
			var total int64
			for self, d := range fleet {
				f := &workerFleet{demands: slices.Clone(fleet), self: self}
				f.demands[self].Self = true
				s := &shares{fleet: map[string]*workerFleet{id: f}}
				n := s.target(id, ShareReport{Limit: 7, Demand: d.Demand, Weight: d.Weight}, now)
				if n < 1 || n > 4 {
					t.Fatalf("round %d, %s: replica %s's share is %d, want the floor or the ceiling of its part", r, id, d.Replica, n)
				}
				total += n
				held[self] += n
			}
			if total != 7 {
				t.Fatalf("round %d, %s: the shares add up to %d, want the 7 the split divides", r, id, total)
			}
		}
	}
	for i, want := range []float64{7, 3.5, 3.5} {
		if got := float64(held[i]) / rounds; got < want-0.1 || got > want+0.1 {
			t.Errorf("replica %s held %.2f of the 14 slots on average, want %.1f (all: %v over %d rounds)", fleet[i].Replica, got, want, held, rounds)
		}
	}
}

// TestWholeSharesStayPut: a split that divides the limit exactly (8 requests 2:1:1) gives the
// same shares in every round, so nothing churns.
func TestWholeSharesStayPut(t *testing.T) {
	const u = shareWeightUnit
	fleet := []ReplicaDemand{{Replica: "a", Demand: 128, Weight: 2 * u}, {Replica: "b", Demand: 64, Weight: u},
		{Replica: "c", Demand: 64, Weight: u}}
	for r := range 20 {
		now := time.Unix(1000, 0).Add(time.Duration(r) * shareRound)
		for self, d := range fleet {
			f := &workerFleet{demands: slices.Clone(fleet), self: self}
			f.demands[self].Self = true
			s := &shares{fleet: map[string]*workerFleet{"w": f}}
			if got, want := s.target("w", ShareReport{Limit: 8, Demand: d.Demand, Weight: d.Weight}, now), []int64{4, 2, 2}[self]; got != want {
				t.Fatalf("round %d: replica %s's share is %d, want %d", r, d.Replica, got, want)
			}
		}
	}
}

// TestTokenCapacityIsTheShares: while the fleet splits a worker, a replica keeps within the part
// of the worker's token limit that its share is of the worker's concurrency limit, so that the
// replicas together stay within the engine's KV cache; a replica with nothing there still takes
// one request of any size, and without a split the whole token limit is its.
func TestTokenCapacityIsTheShares(t *testing.T) {
	cfg := Config{}
	cfg.SetDefaults()
	w, err := newWorker(WorkerSpec{ID: "w", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: 16, MaxTokensInFlight: 4096}, cfg, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Model: "m", Tokens: 600}
	take := func() bool {
		t.Helper()
		if !r.Eligible(w) {
			return false
		}
		if ok, _ := w.tryAcquire(int64(r.Tokens), r.Interactive); !ok {
			t.Fatal("eligible, but tryAcquire refused")
		}
		return true
	}
	w.share.Store(4) // a quarter of the worker: 1,024 tokens
	if !take() {
		t.Fatal("an idle replica refused a request")
	}
	if take() {
		t.Fatalf("a replica with a quarter of the worker took 1,200 tokens of its 4,096 (capacity %d)", w.tokenCapacity())
	}
	w.share.Store(noShare)
	for range 5 {
		if !take() {
			t.Fatalf("without a split, refused at %d tokens in flight of 4,096", w.inFlightTokens.Load())
		}
	}
	if take() {
		t.Fatal("without a split, took more than the worker's token limit")
	}
}
