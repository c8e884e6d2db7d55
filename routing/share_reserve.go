package routing

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"
)

// The fleet's interactive reserve (Options.InteractiveReserve): the queue's interactive reserve
// kept fleet-wide instead of inside each replica's share. One replica's queue keeps the last
// tenth of the pool for interactive requests, so one that arrives finds room at once. Split
// among replicas, that tenth would be a sliver of each replica's share of each worker, smaller
// than one request, and a replica whose share its own batch fills would have none: its
// interactive request would wait for its batch to end, or for the next exchange, while another
// replica's batch held the rest of the worker. So the split divides each worker's limit less
// its reserve, and the reserve stays whole in the store: a replica where an interactive request
// finds no room takes room for that one request from it (TakeReserve, one round trip), and
// gives it back at the exchanges that follow once its interactive requests no longer need it.
//
//
// Held, the reserve has no room for the next interactive request until the holder's own
// requests fit its share again. A replica whose interactive request then finds no room, and
// nothing of its own to preempt (its part of the split is one or two requests of a worker that
// the others' batch fills), used to wait for another replica's request to end: at three
// replicas in front of real llama-servers, 7 of 9 missed objectives in one run waited so,
// 177-956 ms (docs/benchmarks.md, "Three replicas in front of real llama-servers"). So it
// calls the others (CallForRoom); one with a lower-class request on a worker it may use lends
// the reserve one request of its share (LendReserve: atomic in the store, so one replica lends
// for one call however many hear it) and ends that request, as it would preempt for its own
// interactive request; the waiting replica takes the room the loan made (TakeReserve again).
// The loan goes back once the holds no longer need it.

// ReserveClaim asks the fleet's interactive reserve of one worker for room for one interactive
// request (ShareStore.TakeReserve).
type ReserveClaim struct {
	Worker string
	// Requests and Tokens are the worker's reserve as this replica knows it (reserveSize): what
	// the live replicas' holds of it may add up to. Requests is within [1, maxSlots], Tokens
	// within [0, maxReserveTokens].
	Requests, Tokens int64
	// Want and WantRequests are the room to take: the request's tokens and one request, and
	// what this replica holds on the worker beyond its share and its hold of the reserve (its
	// share shrank below its requests in flight), which the request needs too. Want is within
	// [0, Tokens], WantRequests within [1, Requests].
	Want, WantRequests int64
}

// maxReserveTokens bounds the tokens of a worker's reserve and of a replica's hold of it, so
// the store's arithmetic stays exact (Lua's numbers are doubles).
const maxReserveTokens = 1 << 40

// reserveKeep is how long room taken from the reserve stays this replica's whatever it holds
// in flight: the interactive request it was taken for is placed by the queue's next round,
// which an exchange in between must not find unused and give back.
const reserveKeep = 200 * time.Millisecond

// reserveSize is w's part of the fleet's interactive reserve: the requests sizeFleetReserves
// gave it, at most all but one of its limit, and the same part of its token limit.
func (w *Worker) reserveSize() (requests, reserveTokens int64) {
	limit := max(w.limit.Load(), 0)
	requests = min(w.fleetReserve.Load(), max(limit-1, 0))
	if requests <= 0 {
		return 0, 0
	}
	tokens := min(max(w.tokenLimit.Load(), 0), maxReserveTokens)
	// tokens x requests / limit without overflow: requests < limit <= maxSlots.
	return requests, int64(float64(tokens) * float64(requests) / float64(limit))
}

// sizeFleetReserves sizes the fleet's interactive reserve of each of workers as one replica's
// queue sizes its own of a model: for each group of workers that serve the same models in the
// same role (a disaggregated model's prefill and decode pools each keep theirs),
// ceil(share x the sum of their limits) requests, each worker floor(share x its limit) and the
// units left over one each to those with the largest remainders (ties in the order of their
// IDs, so every replica that knows the same limits sizes alike), at most all but one of a
// worker's limit. Sized per worker instead, ceil(share x its limit), a reserve of a tenth kept
// one slot of each llama-server-like worker of four, two of two workers' eight, where one
// replica's queue keeps one of the eight: batch at three replicas had 6 slots of 8 against 7,
// and 0.85 of what interactive left against one replica's 0.96 (docs/benchmarks.md, "Three
// replicas: the prefill budget divided"). SyncShares calls it under shares.mu before each
// exchange.
func (p *Pool) sizeFleetReserves(workers []*Worker) {
	groups := map[string][]*Worker{}
	for _, w := range workers {
		groups[w.reserveGroup] = append(groups[w.reserveGroup], w)
	}
	type part struct {
		w               *Worker
		requests, limit int64
		remainder       float64
	}
	for _, g := range groups {
		var total float64
		parts := make([]part, len(g))
		for i, w := range g {
			limit := max(w.limit.Load(), 0)
			exact := p.reserveShare * float64(limit)
			n := min(int64(math.Floor(exact+1e-9)), max(limit-1, 0))
			parts[i] = part{w: w, requests: n, limit: limit, remainder: exact - float64(n)}
			total += exact
		}
		left := int64(math.Ceil(total - 1e-9))
		for _, pt := range parts {
			left -= pt.requests
		}
		slices.SortStableFunc(parts, func(a, b part) int {
			return cmp.Or(cmp.Compare(b.remainder, a.remainder), cmp.Compare(a.w.spec.ID, b.w.spec.ID))
		})
		for i := range parts {
			if left > 0 && parts[i].requests < parts[i].limit-1 {
				parts[i].requests++
				left--
			}
			parts[i].w.fleetReserve.Store(parts[i].requests)
		}
	}
}

// reserveGroupOf is the group of a worker of spec in sizeFleetReserves: its role and its
// models in order.
func reserveGroupOf(spec WorkerSpec) string {
	models := slices.Clone(spec.Models)
	slices.Sort(models)
	return string(cmp.Or(spec.Role, RoleBoth)) + "\x00" + strings.Join(models, "\x00")
}

// FleetReserve reports whether the fleet's split keeps an interactive reserve of the workers
// out of every replica's share (Options.InteractiveReserve, with a ShareStore): the queues of
// this replica then keep none of their own.
func (p *Pool) FleetReserve() bool { return p.reserveShare > 0 }

// shareLimit is what the fleet's split divides of w's limit: the limit less the fleet's
// interactive reserve of w.
func (p *Pool) shareLimit(w *Worker) int64 {
	n, _ := w.reserveSize()
	return max(w.limit.Load(), 0) - n
}

// ownCapacity is the most requests this replica's own requests may keep in flight on w within
// its share: the share (capacity) less what it lends the fleet's reserve of w (see
// LendReserve). Two or three atomic loads.
func (w *Worker) ownCapacity() int64 {
	return max(w.capacity()-w.lent.Load(), 0)
}

// capacityFor is the most requests this replica may keep in flight on w now for a request of
// the interactive class (interactive) or another: its share less its loans (ownCapacity), and
// for an interactive one the room it holds of the fleet's reserve too. Three to five atomic loads.
func (w *Worker) capacityFor(interactive bool) int64 {
	c := w.ownCapacity()
	if interactive {
		if r := w.reserve.Load(); r > 0 {
			c = min(c+r, w.limit.Load())
		}
	}
	return c
}

// tokenCapacityFor is tokenCapacity, and for an interactive request the tokens this replica
// holds of the fleet's reserve of w too.
func (w *Worker) tokenCapacityFor(interactive bool) int64 {
	c := w.tokenCapacity()
	if interactive {
		if r := w.reserveTokens.Load(); r > 0 {
			c = min(c+r, w.tokenLimit.Load())
		}
	}
	return c
}

// settleReserve gives back the room of the fleet's reserve of w that this replica's requests no
// longer use (in flight beyond its share: its interactive requests placed on the reserve), once
// reserveKeep has passed since it last took some, and returns what it still holds, to report,
// and whether the requests it holds changed (the pool then tells Changes).
// Tokens in flight beyond the replica's part of w's token limit count as held of the reserve
// whatever placed them (a share that shrank below what its requests hold: the split counts
// requests, not tokens), so that no other replica is lent them. SyncShares calls it under
// shares.mu, after setting the share, so a request placed meanwhile is either within what is
// returned or counted in the requests in flight it reads after.
func (w *Worker) settleReserve(now time.Time) (requests, tokens int64, changed bool) {
	excess := max(w.inFlightTokens.Load()-w.tokenCapacity(), 0)
	if now.UnixNano()-w.reserveAt.Load() >= int64(reserveKeep) {
		if used := max(w.inFlight.Load()-w.ownCapacity(), 0); used < w.reserve.Load() {
			w.reserve.Store(used)
			changed = true
		}
		if excess < w.reserveTokens.Load() {
			w.reserveTokens.Store(excess)
		}
	}
	if excess > w.reserveTokens.Load() {
		w.reserveTokens.Store(min(excess, maxReserveTokens))
	}
	return min(w.reserve.Load(), maxSlots), min(w.reserveTokens.Load(), maxReserveTokens), changed
}

// TakeReserve takes room for r, an interactive request that found none, from the fleet's
// interactive reserve of one of the workers it may use (see Options.InteractiveReserve): one
// round trip to the store, which answers with the worker whose reserve has the most tokens
// left, if any has room for one request of r.Tokens (and for what this replica holds there
// beyond its share and its hold of the reserve). It reports whether it took some; the pool then
// tells Changes, and the room, on that worker, takes only interactive requests.
//
// It takes nothing for a request of another class, without a ShareStore or a reserve, while
// the last exchange failed or the fleet's split is rejoining after a cut (until every live
// replica has reported its hold again, see SyncShares). It waits for an exchange under way
// (one round trip, at most the exchange's timeout). So the fleet never holds more than a
// worker's limit: the shares add up to the limit less the reserve, and the holds of the
// reserve to the reserve at most. Safe for concurrent use.
func (p *Pool) TakeReserve(ctx context.Context, r *Request) bool {
	s := p.shares
	if s == nil || !(p.reserveShare > 0) || !r.Interactive {
		return false
	}
	ms := p.snap.Load().models[r.Model]
	if ms != nil {
		ms = ms.stageSet(r.Stage)
	}
	if ms == nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := p.now()
	if !s.joined || s.failing || now.Before(s.rejoinUntil) {
		p.metrics.reserveTakes.WithLabelValues("failed").Inc()
		return false
	}
	want := int64(max(r.Tokens, 0))
	var claims []ReserveClaim
	var workers []*Worker
	for _, w := range ms.workers {
		id := w.spec.ID
		if !w.takesRequests() || slices.Contains(r.Exclude, id) || r.TargetWorker != "" && r.TargetWorker != id {
			continue
		}
		if f := s.fleet[id]; f == nil || f.self < 0 {
			// Not in the last exchange: its reserve is nobody's to take.
			continue
		}
		n, tokens := w.reserveSize()
		over := max(w.inFlight.Load()-w.ownCapacity()-w.reserve.Load(), 0)
		overTokens := max(w.inFlightTokens.Load()-w.tokenCapacity()-w.reserveTokens.Load(), 0)
		c := ReserveClaim{Worker: id, Requests: n, Tokens: tokens, Want: want + overTokens, WantRequests: 1 + over}
		if c.WantRequests > n || c.Want > tokens {
			continue
		}
		claims = append(claims, c)
		workers = append(workers, w)
	}
	if len(claims) == 0 {
		p.metrics.reserveTakes.WithLabelValues("refused").Inc()
		return false
	}
	i, err := s.store.TakeReserve(ctx, claims)
	switch {
	case err != nil || i >= len(workers):
		p.metrics.reserveTakes.WithLabelValues("failed").Inc()
		return false
	case i < 0:
		p.metrics.reserveTakes.WithLabelValues("refused").Inc()
		return false
	}
	w := workers[i]
	w.reserveAt.Store(now.UnixNano())
	w.reserve.Add(claims[i].WantRequests)
	w.reserveTokens.Add(claims[i].Want)
	p.metrics.reserveTakes.WithLabelValues("taken").Inc()
	p.changes.notify()
	return true
}

// LendReserve lends the fleet's interactive reserve of w one request of this replica's share,
// for an interactive request another replica waits with and cannot place (it called for room,
// see WatchRoomCalls): one round trip to the store, which lends only while the reserve of w has
// no room left (its live holds use it and the loans to it). Lent, the request is kept free of
// this replica's own requests (ownCapacity) until the holds no longer need it (settleLoan, not
// before loanKeep), the other replicas are told (RoomCalls), and the caller must end one of its
// own requests in flight on w that is not interactive, whose room the loan is: the fleet then
// holds w's limit at most again. It lends nothing without a ShareStore or a reserve of w, while
// the split is cut or rejoining, or for a worker where this replica has no request of its own
// in flight beyond its loans. Safe for concurrent use.
func (p *Pool) LendReserve(ctx context.Context, w *Worker) bool {
	s := p.shares
	if s == nil || !(p.reserveShare > 0) {
		return false
	}
	size, _ := w.reserveSize()
	if size <= 0 {
		return false
	}
	s.mu.Lock() // so that an exchange never reports a loan the store has not answered
	result := "failed"
	switch {
	case !s.joined || s.failing || p.now().Before(s.rejoinUntil):
	case w.inFlight.Load()-w.reserve.Load() <= 0:
		result = "refused" // nothing of its own share in flight to end for it
	default:
		lent, _, err := s.store.LendReserve(ctx, w.spec.ID, size, 1)
		if err != nil || lent < 0 || lent > maxSlots {
			break
		}
		result = "refused"
		if lent > w.lent.Load() {
			result = "lent"
			w.lentAt.Store(p.now().UnixNano())
		}
		w.lent.Store(lent)
	}
	s.mu.Unlock()
	p.metrics.reserveLoans.WithLabelValues(result).Inc()
	if result != "lent" {
		return false
	}
	p.announceLoan(ctx, w)
	return true
}

// loanKeep is how long a loan to the fleet's reserve stays lent whatever the holds: the
// interactive request it was made for takes it (TakeReserve) once the lender's call reaches its
// replica, which an exchange in between must not find unused and take back.
const loanKeep = reserveKeep

// settleLoan takes back, after an exchange that answered a, what this replica lends the fleet's
// reserve of w beyond what the holds need (the reserve has room: its size and the loans exceed
// the holds), once loanKeep has passed since its last loan (LendReserve, one round trip, only
// then), and reports whether its room on w grew. Nothing while the split is rejoining after a
// cut: a store that restarted empty knows the holds only as each live replica reports them
// again, and a loan taken back from a hold it forgot would be room used twice. SyncShares calls
// it under shares.mu.
func (p *Pool) settleLoan(ctx context.Context, w *Worker, a ShareAnswer) bool {
	s := p.shares
	mine := w.lent.Load()
	size, _ := w.reserveSize()
	room := size + a.ReserveLent - a.ReserveHeld
	if mine <= 0 || room <= 0 || p.now().Before(s.rejoinUntil) ||
		p.now().UnixNano()-w.lentAt.Load() < int64(loanKeep) {
		return false
	}
	lent, _, err := s.store.LendReserve(ctx, w.spec.ID, size, -min(mine, room))
	if err != nil || lent < 0 || lent > mine {
		p.metrics.reserveLoans.WithLabelValues("failed").Inc()
		return false
	}
	w.lent.Store(lent)
	p.metrics.reserveLoans.WithLabelValues("returned").Add(float64(mine - lent))
	return lent < mine
}
