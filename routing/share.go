package routing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"
)

// ShareStore splits each worker's concurrency limit among the gateway replicas of a fleet, so
// that the replicas together never keep more than the limit in flight on a worker, and each
// holds the part its demand calls for (a RedisStore). Without one, a replica places up to each
// worker's whole limit, and sees the others only in the worker's /metrics.
type ShareStore interface {
	// ExchangeShares publishes this replica's report of each worker and returns each worker's
	// answer, in the same order, in one round trip. For each worker, atomically: the grant is
	// max(Hold, min(Want, Limit - the holds of the other live replicas)), and the grant is
	// then this replica's hold, which the others' grants leave room for until this replica's
	// report expires (a few seconds after its last exchange: a replica that stops exchanging
	// is not live). The answer lists the demands of every live replica, this one included. On
	// an error no answer is to be taken as given, and the reports may or may not be applied.
	// Safe for concurrent use.
	//
	// It also records, for each worker, the report's hold of the worker's interactive reserve
	// (Reserve, ReserveTokens) as this replica's, replacing the one before, for TakeReserve to
	// count until the report expires.
	ExchangeShares(ctx context.Context, reports []ShareReport) ([]ShareAnswer, error)
	// TakeReserve takes room for one interactive request from the interactive reserve of one
	// of claims' workers, in one round trip, atomically: of the workers whose live replicas'
	// holds (as the last exchange of each, and TakeReserve since, recorded them) leave at least
	// one request and Want tokens of the claim's Requests and Tokens, the one with the most
	// tokens left; it adds one request and Want tokens to this replica's hold there and returns
	// the claim's index. -1: no worker has room. On an error nothing is to be taken as held.
	// Safe for concurrent use.
	TakeReserve(ctx context.Context, claims []ReserveClaim) (int, error)
	// LendReserve changes this replica's loan to the interactive reserve of worker (see
	// Pool.LendReserve) by delta, in one round trip, atomically, where size is the reserve's
	// requests (ReserveClaim.Requests) and its room is size plus the live loans less the live
	// holds: delta > 0 lends that much more while the reserve has no room (a request of its
	// share this replica ends and keeps free gives an interactive request that found none
	// room); delta < 0 takes back up to -delta of its loan, as far as the room allows. It
	// returns this replica's loan after, and the reserve's room after. A loan counts in the
	// reserve's room for TakeReserve until the replica's report expires, and ExchangeShares
	// records it as reported (ShareReport.Lent). On an error nothing is to be taken as changed.
	// Safe for concurrent use.
	LendReserve(ctx context.Context, worker string, size, delta int64) (lent, room int64, err error)
}

// ShareReport is one replica's state on one worker, as it sends it in an exchange. Every count
// is at least 0 and at most maxSlots.
type ShareReport struct {
	Worker string
	// Limit is the worker's concurrency limit as this replica knows it (learned or fixed), less
	// the fleet's interactive reserve of it (see Options.InteractiveReserve): what the split
	// divides.
	Limit int64
	// Hold is the room this replica keeps whatever the answer: what it may still use until the
	// exchange is answered, at least its requests in flight there.
	Hold int64
	// Want is the share this replica asks for (its part of the split by demand).
	Want int64
	// Interactive and Demand are the replica's demand on the worker: the interactive requests
	// queued for the worker's models, and all of its requests queued for them plus its
	// requests in flight on the worker (so Demand >= Interactive).
	Interactive, Demand int64
	// InteractiveWeight and Weight weigh the demand as the fair share does: the sums of the
	// weights of the flows (tenant and class) with requests queued for the worker's models,
	// interactive and of every class (so Weight >= InteractiveWeight), in thousandths, at
	// most maxShareWeight (see ModelBacklog).
	InteractiveWeight, Weight int64
	// Reserve and ReserveTokens are the room this replica holds of the worker's interactive
	// reserve (see TakeReserve), within [0, maxSlots] and [0, maxReserveTokens]; Hold does
	// not count the requests in flight on it.
	Reserve, ReserveTokens int64
	// Lent is the requests of its share this replica lends the worker's interactive reserve
	// (LendReserve), within [0, maxSlots]: kept free of its own requests, counted in Hold.
	Lent int64
}

// ShareAnswer is the fleet's answer to one ShareReport.
type ShareAnswer struct {
	// Grant is the most requests this replica may keep in flight on the worker until its next
	// exchange.
	Grant int64
	// Fleet is the demand of every live replica on the worker, this one included (Self).
	Fleet []ReplicaDemand
	// ReserveHeld and ReserveLent are the live replicas' holds of the worker's interactive
	// reserve and their loans to it, this replica's as reported included, within [0, maxSlots].
	ReserveHeld, ReserveLent int64
}

// ReplicaDemand is one replica's demand on one worker in a ShareAnswer, as in its ShareReport.
type ReplicaDemand struct {
	// Replica names the replica; it orders the replicas the same way on every replica.
	Replica                   string
	Self                      bool
	Interactive, Demand       int64
	InteractiveWeight, Weight int64
}

// ModelBacklog is what a replica has queued for one model, as SyncShares asks it of the
// gateway (which reads it from the model's queue).
type ModelBacklog struct {
	// Interactive and All count the requests queued: interactive, and of every class.
	Interactive, All int64
	// InteractiveWeight and Weight sum the weights of the flows (tenant and class) with
	// requests queued: interactive, and of every class. The fair share serves every
	// backlogged flow in proportion to its weight whatever the length of its queue, so the
	// split gives each replica room in proportion to these, not to its count of requests: a
	// replica that queues for two tenants gets twice the room of one that queues as many
	// requests for one.
	InteractiveWeight, Weight float64
}

// shareWeightUnit is the fixed point of the weights in ShareReport and ReplicaDemand: a flow
// of weight 1 counts shareWeightUnit.
const shareWeightUnit = 1000

// maxShareWeight bounds a replica's weight on one worker (ShareReport, ReplicaDemand): with
// at most maxShareReplicas replicas and maxSlots slots, the split's arithmetic stays within
// int64.
const maxShareWeight = 1 << 32

// weightUnits is w in thousandths, within [0, maxShareWeight]; at least 1 when w > 0, so a
// backlogged flow of any weight counts.
func weightUnits(w float64) int64 {
	switch {
	case !(w > 0):
		return 0
	case w >= maxShareWeight/shareWeightUnit:
		return maxShareWeight
	}
	return max(int64(math.Round(w*shareWeightUnit)), 1)
}

const (
	// MaxShareWorkers bounds the workers of one exchange; workers beyond it (in the order they
	// were added) are placed on as though the store were cut: 1/n of their limit.
	MaxShareWorkers = 1024
	// maxShareReplicas bounds the replicas an answer may list for a worker.
	maxShareReplicas = 256
	// ShareReportTTL is how long a replica's report counts after its exchange: the liveness of
	// a replica in the split. It is also how long a replica that rejoins after a failed
	// exchange stays within its fallback share, so that every live replica has reported its
	// hold again before it takes more.
	ShareReportTTL = 3 * time.Second
)

// noShare is a Worker's share without a ShareStore: the worker's whole limit is this replica's.
const noShare = -1

// shares is a pool's part of the fleet's split (see Pool.SyncShares).
type shares struct {
	store ShareStore
	// calls is store's RoomCalls, nil when it has none.
	calls RoomCalls

	// mu serializes SyncShares and guards every field below.
	mu sync.Mutex
	// fleet is, by worker, the replicas' demands at the last successful exchange, by Replica.
	fleet map[string]*workerFleet
	// replicas is the most replicas an answer listed at the last successful exchange (at
	// least 1): the n of the fallback 1/n.
	replicas int
	failing  bool
	// joined says an exchange has succeeded since the pool was made, at started: from then on a
	// cut only ever shrinks a share (see SyncShares).
	joined  bool
	started time.Time
	// rejoinUntil: after a failed exchange, the first to succeed starts a ShareReportTTL
	// during which each worker's share stays within the fallback applied while failing.
	rejoinUntil time.Time
}

// workerFleet is one worker's fleet at the last successful exchange.
type workerFleet struct {
	demands []ReplicaDemand // by Replica
	self    int             // this replica's index in demands
	// fallback is the share applied while the last exchanges failed; -1: none since the last
	// rejoin ended.
	fallback int64
}

// capacity is the most requests this replica may keep in flight on w now: its limit, or within
// it its share of the fleet's split. Two atomic loads.
func (w *Worker) capacity() int64 {
	limit := w.limit.Load()
	if s := w.share.Load(); s >= 0 {
		return min(limit, s)
	}
	return limit
}

// tokenCapacity is the most tokens this replica may keep in flight on w now: its token limit,
// or, while the fleet splits w (see ShareStore), the part of it that this replica's share is of
// w's concurrency limit, so that the replicas together stay within what the engine holds (its
// KV cache) as they stay within its concurrency limit. Three atomic loads.
func (w *Worker) tokenCapacity() int64 {
	tokens := w.tokenLimit.Load()
	share, limit := w.share.Load(), w.limit.Load()
	if share < 0 || limit <= 0 || share >= limit {
		return tokens
	}
	return tokens * share / limit
}

// Share is the most requests this replica may keep in flight on the worker now (see
// ShareStore), and whether it is a share of a fleet's split: without a ShareStore it is the
// worker's whole MaxConcurrency.
func (w *Worker) Share() (n int64, shared bool) {
	return w.capacity(), w.share.Load() >= 0
}

// SyncShares exchanges this replica's demand on every worker with the fleet (Options.Shares)
// and sets the share of each worker it places on until the next exchange. demand gives, for a
// model, what this replica has queued for it. The gateway calls it every few tens of
// milliseconds, off the admission path: one round trip.
//
// A share is the replica's part of a deterministic split of the worker's limit (less the fleet's
// interactive reserve of it, see TakeReserve) by the replicas' demands, weighted as the fair share
// weighs them (splitShares: interactive demand served first, then the rest by the weights of the
// backlogged flows, room nobody asks for spread evenly; in fractions of a request, each replica's
// part rounded up or down in turn over shareRound periods, see target), computed by each replica
// from what the last exchange said of the others; the store grants it only as far as the other
// replicas' holds leave room, so a replica whose share grows waits until the room is given up, and
// the worker is never sent more than its limit in all. A share that shrinks applies before the
// exchange. When the exchange fails, every worker's share falls to this replica's part of 1/n of
// its limit, n the replicas of the last successful exchange, when it is above it, and otherwise
// stays: a share never grows while the store is cut, since the others' requests in flight above
// their parts (long answers outlast any report's TTL) end when they end, and nothing tells this
// replica when; the grants of the last exchanges add up to the limit at most, so the fleet stays
// within it. (A replica whose exchanges never succeeded takes the whole limit ShareReportTTL after
// its start.) The first exchange that succeeds again starts ShareReportTTL within the share applied
// meanwhile, so every live replica has reported its hold again before any grows; then the split by
// demand resumes. Without a store it does nothing. Calls are serialized; Changes is told when a
// share changed.
func (p *Pool) SyncShares(ctx context.Context, demand func(model string) ModelBacklog) error {
	s := p.shares
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	var over []*Worker
	if len(workers) > MaxShareWorkers {
		workers, over = workers[:MaxShareWorkers], workers[MaxShareWorkers:]
	}
	p.sizeFleetReserves(slices.Concat(workers, over))
	now := p.now()
	rejoining := now.Before(s.rejoinUntil)
	reports := make([]ShareReport, len(workers))
	changed := false
	for i, w := range workers {
		var inter, all int64
		var interWeight, weight float64
		for _, m := range w.spec.Models {
			b := demand(m)
			inter, all = inter+max(b.Interactive, 0), all+max(b.All, 0)
			interWeight, weight = interWeight+max(b.InteractiveWeight, 0), weight+max(b.Weight, 0)
		}
		all += w.inFlight.Load()
		r := ShareReport{Worker: w.spec.ID, Limit: min(max(p.shareLimit(w), 0), maxSlots),
			Interactive: min(inter, maxSlots), Demand: min(max(all, inter), maxSlots),
			InteractiveWeight: weightUnits(interWeight)}
		r.Weight = max(weightUnits(weight), r.InteractiveWeight)
		r.Want = s.target(w.spec.ID, r, now)
		if f := s.fleet[w.spec.ID]; rejoining && f != nil && f.fallback >= 0 {
			r.Want = min(r.Want, f.fallback)
		}
		// Shrink first: a request placed from here on fits the smaller share, and Hold counts
		// what the share left in flight.
		keep := min(max(w.share.Load(), 0), r.Want)
		changed = w.setShare(keep) || changed
		var settled bool
		r.Reserve, r.ReserveTokens, settled = w.settleReserve(now)
		changed = settled || changed
		// A loan to the reserve stays in this replica's grant: the reserve's room counts it.
		r.Lent = min(w.lent.Load(), maxSlots)
		r.Hold = min(max(keep, w.inFlight.Load()+r.Lent-r.Reserve), maxSlots)
		reports[i] = r
	}
	got, err := s.store.ExchangeShares(ctx, reports)
	if err == nil {
		err = validAnswers(reports, got)
	}
	if err != nil {
		s.failing = true
		// A share only shrinks toward 1/n: the others' requests in flight above their 1/n
		// end when they end, which nothing tells this replica while it is cut, so room
		// beyond its last grant may still be in use. A replica that never exchanged has no
		// grant to keep within: it takes 1/n of the fleet it knows (the whole worker) once
		// any reports of an earlier process of its own have expired.
		grow := !s.joined && now.Sub(s.started) >= ShareReportTTL
		// A new slice: workers and over share the pool's array.
		for _, w := range slices.Concat(workers, over) {
			_, _, settled := w.settleReserve(now)
			changed = settled || changed
			fb := s.fallback(w.spec.ID, p.shareLimit(w))
			if !grow {
				fb = min(fb, max(w.share.Load(), 0))
			}
			f := s.fleet[w.spec.ID]
			if f == nil {
				f = &workerFleet{self: -1}
				s.fleet[w.spec.ID] = f
			}
			f.fallback = fb
			changed = w.setShare(fb) || changed
			// Who else sends w lower-class prompts is not known while cut: every replica
			// the fleet had, as the fallback share assumes.
			w.lowerSenders.Store(int64(max(s.replicas, 1)))
		}
		if changed {
			p.changes.notify()
		}
		p.metrics.shareExchanges.WithLabelValues("failed").Inc()
		return fmt.Errorf("routing: worker shares: %w", err)
	}
	if s.failing {
		s.failing, s.rejoinUntil, rejoining = false, now.Add(ShareReportTTL), true
	}
	s.joined = true
	n := 1
	seen := make(map[string]bool, len(workers))
	for i, w := range workers {
		a := got[i]
		slices.SortFunc(a.Fleet, func(x, y ReplicaDemand) int { return cmp.Compare(x.Replica, y.Replica) })
		f := s.fleet[w.spec.ID]
		if f == nil {
			f = &workerFleet{fallback: -1}
			s.fleet[w.spec.ID] = f
		}
		f.demands, f.self = a.Fleet, slices.IndexFunc(a.Fleet, func(d ReplicaDemand) bool { return d.Self })
		if !rejoining {
			f.fallback = -1
		}
		n = max(n, len(a.Fleet))
		seen[w.spec.ID] = true
		share := min(a.Grant, s.target(w.spec.ID, reports[i], now))
		if f.fallback >= 0 {
			share = min(share, f.fallback)
		}
		changed = w.setShare(share) || changed
		w.lowerSenders.Store(lowerSenders(a.Fleet))
		changed = p.settleLoan(ctx, w, a) || changed
	}
	for _, w := range over {
		changed = w.setShare(s.fallback(w.spec.ID, p.shareLimit(w))) || changed
		w.lowerSenders.Store(int64(n))
	}
	maps.DeleteFunc(s.fleet, func(id string, _ *workerFleet) bool { return !seen[id] })
	if rejoining {
		n = max(n, s.replicas)
	}
	s.replicas = n
	p.metrics.shareExchanges.WithLabelValues("ok").Inc()
	if changed {
		p.changes.notify()
	}
	return nil
}

// lowerSenders is how many replicas of fleet send the worker standard or batch prompts: this
// one, and every other that queues lower-class requests for the worker's models (a weight of
// lower-class flows, Weight above InteractiveWeight). A replica whose lower-class requests are
// all in flight, none queued, is not counted: the budget is holding none of its requests back,
// so it is not contending for it (its pieces in flight still go, one at a time).
func lowerSenders(fleet []ReplicaDemand) int64 {
	n := int64(1)
	for _, d := range fleet {
		if !d.Self && d.Weight > d.InteractiveWeight {
			n++
		}
	}
	return n
}

// SharesWorkers reports whether the pool has a ShareStore: whether SyncShares is to be called.
func (p *Pool) SharesWorkers() bool { return p.shares != nil }

// joinShares starts w with no share of the fleet's split, when there is one: the next exchange
// gives it one (with room the other replicas do not hold).
func (p *Pool) joinShares(w *Worker) {
	if p.shares != nil {
		w.share.Store(0)
	}
}

// setShare sets w's share and reports whether it changed.
func (w *Worker) setShare(n int64) bool {
	return w.share.Swap(max(n, 0)) != max(n, 0)
}

// validAnswers checks the store's answers to reports: one per report, each grant within
// [0, maxSlots] and each fleet of at most maxShareReplicas replicas with counts within
// [0, maxSlots] and weights within [0, maxShareWeight], this replica listed exactly once.
func validAnswers(reports []ShareReport, got []ShareAnswer) error {
	if len(got) != len(reports) {
		return fmt.Errorf("%d answers for %d workers", len(got), len(reports))
	}
	for i, a := range got {
		if a.Grant < 0 || a.Grant > maxSlots || len(a.Fleet) > maxShareReplicas ||
			a.ReserveHeld < 0 || a.ReserveHeld > maxSlots || a.ReserveLent < 0 || a.ReserveLent > maxSlots {
			return fmt.Errorf("worker %q: grant %d, %d replicas, reserve held %d, lent %d", reports[i].Worker,
				a.Grant, len(a.Fleet), a.ReserveHeld, a.ReserveLent)
		}
		self := 0
		for _, d := range a.Fleet {
			if d.Interactive < 0 || d.Demand < 0 || d.Interactive > maxSlots || d.Demand > maxSlots ||
				d.InteractiveWeight < 0 || d.Weight < 0 || d.InteractiveWeight > maxShareWeight || d.Weight > maxShareWeight {
				return fmt.Errorf("worker %q: demand %d/%d (weights %d/%d) of replica %q", reports[i].Worker,
					d.Interactive, d.Demand, d.InteractiveWeight, d.Weight, d.Replica)
			}
			if d.Self {
				self++
			}
		}
		if self != 1 {
			return errors.New("this replica not listed once in the fleet's answer")
		}
	}
	return nil
}

// target is this replica's part of the split of r's worker by the demands of the last
// exchange, with its own demand as in r, at now. Without a last exchange (or with the worker's
// fleet not known) it asks for the worker's whole limit: the grant leaves the others' holds alone.
//
// The split is computed in fractions of a request (splitShares on limit x unit) and rounded by
// roundShare, which gives each replica the floor or the ceiling of its exact part, the ceiling
// for a part of the shareRound periods equal to the fraction: 7 requests split 2:1:1 are 3.5,
// 1.75 and 1.75 over time, where whole units left over in a fixed order gave 4, 2 and 1 (the
// replica with the most demand first) at every exchange, so the heavier replica's tenants took
// more than their part for as long as the backlog lasted.
func (s *shares) target(id string, r ShareReport, now time.Time) int64 {
	f := s.fleet[id]
	if f == nil || f.self < 0 {
		return r.Limit
	}
	n := len(f.demands)
	limit := max(r.Limit, 0)
	unit := shareUnit(limit)
	inter, all := make([]int64, n), make([]int64, n)
	interWeight, weight := make([]int64, n), make([]int64, n)
	for i, d := range f.demands {
		inter[i], all[i], interWeight[i], weight[i] = d.Interactive, d.Demand, d.InteractiveWeight, d.Weight
	}
	inter[f.self], all[f.self] = r.Interactive, r.Demand
	interWeight[f.self], weight[f.self] = r.InteractiveWeight, r.Weight
	ties := tieOrder(id, f.demands)
	slices.SortStableFunc(ties, func(a, b int) int {
		return cmp.Or(cmp.Compare(inter[b], inter[a]), cmp.Compare(all[b], all[a]))
	})
	// A demand above the limit splits as the limit does (no part exceeds it), and keeps the
	// split in fractions within maxSlots.
	for i := range n {
		inter[i], all[i] = min(inter[i], limit)*unit, min(all[i], limit)*unit
	}
	parts := splitShares(limit*unit, fleetDemand{inter, all, interWeight, weight}, ties)
	return roundShare(parts, f.self, unit, roundOffset(id, unit, now))
}

// shareRound is how long one rounding of the fleet's split lasts (see roundShare): long enough
// that a share which shrinks has time to give up a request before it grows again, short
// against the windows over which tenants compare what they were served.
const shareRound = time.Second

// maxShareUnit is the finest fraction of a request the split computes in.
const maxShareUnit = 1 << 10

// shareUnit is the fractions of a request the split of limit computes in: at most
// maxShareUnit, and limit x unit within maxSlots, so the split's arithmetic stays as bounded as
// in whole requests.
func shareUnit(limit int64) int64 {
	return min(max(maxSlots/max(limit, 1), 1), maxShareUnit)
}

// roundOffset is where the rounding of worker id's split starts in the shareRound period of
// now, in [0, unit): the golden-ratio sequence over the periods, shifted by a hash of the
// worker, so that over any few periods each replica's ceiling comes up in proportion to its
// fraction, and workers round differently from one another. The same on every replica whose
// clock agrees.
func roundOffset(id string, unit int64, now time.Time) int64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	// FNV leaves the high bits of names that differ in their last bytes alike: mixed
	// (splitmix64's finalizer) before they place the worker's start.
	x := h.Sum64()
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	x ^= x >> 31
	period := uint64(now.UnixNano() / int64(shareRound))
	hi, _ := bits.Mul64(x+period*0x9e3779b97f4a7c15, uint64(unit))
	return int64(hi)
}

// roundShare is the whole requests of replica self in a split in parts of unit (parts in
// the order of the fleet's demands, by Replica): the replicas lie end to end from offset, and
// each takes the unit boundaries that fall within its parts. So each gets the floor or the
// ceiling of its exact part, the whole parts add up to the limit whatever the offset, and
// with the offset uniform each gets its exact part on average. offset within [0, unit).
func roundShare(parts []int64, self int, unit, offset int64) int64 {
	from := offset + sum(parts[:self])
	return (from+parts[self])/unit - from/unit
}

// tieOrder is the order in which the replicas of a worker's fleet take the units a split leaves
// over: by a hash of the worker's and the replica's names, the same on every replica, and
// different from one worker to the next, so no replica is the last on every worker.
func tieOrder(worker string, fleet []ReplicaDemand) []int {
	keys := make([]uint64, len(fleet))
	order := make([]int, len(fleet))
	for i, d := range fleet {
		h := fnv.New64a()
		h.Write([]byte(worker))
		h.Write([]byte{0})
		h.Write([]byte(d.Replica))
		keys[i], order[i] = h.Sum64(), i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
	return order
}

// fallback is this replica's part of 1/n of limit, n the replicas of the last successful
// exchange: limit/n, and one more for the first limit%n replicas in the worker's tieOrder when
// this replica's place in the worker's fleet is known, so the parts add up to the limit.
func (s *shares) fallback(id string, limit int64) int64 {
	n := int64(max(s.replicas, 1))
	limit = max(limit, 0)
	part := limit / n
	if f := s.fleet[id]; f != nil && f.self >= 0 && int64(len(f.demands)) == n &&
		int64(slices.Index(tieOrder(id, f.demands), f.self)) < limit%n {
		part++
	}
	return part
}

// fleetDemand is the demands of a worker's replicas, by index, as in their ReplicaDemand:
// demand[i] >= interactive[i] >= 0, weight[i] >= interactiveWeight[i] >= 0.
type fleetDemand struct {
	interactive, demand       []int64
	interactiveWeight, weight []int64
}

// splitShares splits limit among replicas by their demands as one queue would serve them:
//
//  1. Interactive first: the interactive demands, in proportion to the weights of the
//     interactive flows (weighted max-min: no replica gets more than it asks for, and what it
//     leaves goes to the others in proportion to theirs).
//  2. A replica with nothing queued keeps its requests in flight (its demand): it has no flow
//     to weigh, and the room it holds goes to no one sooner than its requests end; max-min
//     among such replicas.
//  3. All demands, in proportion to the weights of all the backlogged flows (weighted max-min,
//     each replica keeping at least what it has so far), so each backlogged tenant has about
//     the same room wherever it is queued: the fleet serves the tenants in the order one queue
//     would. A replica's interactive part counts toward its part here, and its interactive
//     flows weigh here too, so a replica that queues interactive requests alone keeps room
//     for those it has in flight. (The classes below interactive are one level here: a
//     replica's standard and batch flows weigh alike.)
//  4. What nobody asked for, max-min, so that a replica with no demand has room for its next
//     request while nobody else needs it.
//
// The units left over at a level go in the order ties lists the replicas (nil: by index), so
// every replica computes the same split. The result sums to limit (at least 0).
func splitShares(limit int64, d fleetDemand, ties []int) []int64 {
	n := len(d.demand)
	if ties == nil {
		ties = make([]int, n)
		for i := range ties {
			ties[i] = i
		}
	}
	out := weightedFill(limit, make([]int64, n), d.interactive, d.interactiveWeight, ties)
	idle := slices.Clone(out)
	for i := range idle {
		if d.weight[i] == 0 {
			idle[i] = d.demand[i]
		}
	}
	out = waterFill(limit, out, idle, ties)
	out = weightedFill(limit, out, d.demand, d.weight, ties)
	all := make([]int64, n)
	for i := range all {
		all[i] = max(limit, 0)
	}
	return waterFill(limit, out, all, ties)
}

// weightedFill raises shares, from base, toward demands, in proportion to weights within
// capacity (weighted max-min): each i gets max(base[i], min(demands[i], floor(level x
// weights[i] / the sum of the weights))) at the highest level that fits, and what is left goes
// one each, in the order of ties, to those the next level would raise. Those without weight
// keep their base. base must fit in capacity; weights within [0, maxShareWeight], at most
// maxShareReplicas of them. Cost: O(n log(max demand x sum of weights)), integer arithmetic
// only, so every replica computes the same.
func weightedFill(capacity int64, base, demands, weights []int64, ties []int) []int64 {
	var total uint64
	for _, w := range weights {
		total += uint64(max(w, 0))
	}
	out := slices.Clone(base)
	if total == 0 {
		return out
	}
	at := func(i int, level uint64) int64 {
		w := weights[i]
		if w <= 0 {
			return base[i]
		}
		hi, lo := bits.Mul64(level, uint64(w))
		q, _ := bits.Div64(hi, lo, total) // q <= level: w <= total
		return max(base[i], int64(min(q, uint64(max(demands[i], 0)))))
	}
	used := func(level uint64) int64 {
		var s int64
		for i := range demands {
			s += at(i, level)
		}
		return s
	}
	// At level top every demand is met: floor(top x w / total) >= demand.
	var top uint64
	for i, w := range weights {
		if w > 0 && demands[i] > 0 {
			top = max(top, (uint64(demands[i])+1)*total/uint64(w)+1)
		}
	}
	lo, hi := uint64(0), top // used(0) = sum(base) <= capacity; find the highest level that fits
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if used(mid) <= capacity {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	for i := range out {
		out[i] = at(i, lo)
	}
	left := capacity - used(lo)
	for _, i := range ties {
		if left > 0 && at(i, lo+1) > out[i] {
			out[i]++
			left--
		}
	}
	return out
}

// waterFill raises shares, from base, toward demands, max-min fair within capacity: each i gets
// max(base[i], min(demands[i], level)) at the highest level that fits, and what is left below
// the next level goes one each to those still below their demand, in the order of ties (a
// permutation of the indices). base must fit in capacity. Cost: O(n log max demand).
func waterFill(capacity int64, base, demands []int64, ties []int) []int64 {
	used := func(level int64) int64 {
		var s int64
		for i, d := range demands {
			s += max(base[i], min(max(d, 0), level))
		}
		return s
	}
	var top int64
	for _, d := range demands {
		top = max(top, d)
	}
	lo, hi := int64(0), top // used(lo) <= capacity (base fits); find the highest such level
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if used(mid) <= capacity {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	out := make([]int64, len(demands))
	for i, d := range demands {
		out[i] = max(base[i], min(max(d, 0), lo))
	}
	left := capacity - used(lo)
	for _, i := range ties {
		if left > 0 && out[i] == lo && lo < demands[i] {
			out[i]++
			left--
		}
	}
	return out
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}
