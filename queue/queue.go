package queue

import (
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Request is what the gateway asks the queue to admit. The queue never modifies it.
type Request struct {
	// Tenant names the fair-share flow; requests of one tenant and class share a flow.
	Tenant string
	// Class is the class after the tier's cap and the client's downgrade are applied.
	Class Class
	// Weight is the tenant's tier weight in the fair share: a tenant of weight 2 is served twice
	// the tokens of a tenant of weight 1 while both are backlogged. 0 or less means 1.
	Weight float64
	// PromptTokens is the estimated prompt size and MaxTokens the expected output (max_tokens
	// or the tier's estimate). Their sum is the token capacity the request holds in flight.
	PromptTokens, MaxTokens int
	// Deadline is when the request is no longer worth dispatching. The zero time means none.
	Deadline time.Time
	// Due is the last moment a dispatch can still meet the request's latency objective (the
	// gateway's estimate); the zero time means none. Past it, the request goes after its
	// tenant's requests in the class that are not past theirs (see Order, "late last").
	Due time.Time
	// MaxQueued caps the requests the tenant may have waiting (its tier's cap); 0 or less
	// takes Config.MaxQueuedPerTenant. The lower of the two applies.
	MaxQueued int
	// Placer, when not nil, places the request when it would be released (see Placer): it is
	// released only once placed, with its placement in Grant.Placement. Nil: the pool's Capacity
	// alone decides.
	Placer Placer
}

// Capacity is what a model's pool can hold in flight at once: the sums over its healthy,
// non-draining workers of their concurrency and token budgets. Requests 0 dispatches nothing
// (no workers); Tokens 0 means no token budget (only requests count).
type Capacity struct {
	Requests int
	Tokens   int
}

// Usage is what a request really consumed, as the worker reported it. The zero Usage means
// nothing was served: the whole fair-share charge is refunded.
type Usage struct {
	PromptTokens, CompletionTokens int
}

// Options are the queue's dependencies. The zero value works: real clock, no metrics, no logs.
type Options struct {
	// Model labels the metrics (label "model"), so the queues of several models can share one
	// Registerer.
	Model      string
	Clock      Clock
	Registerer prometheus.Registerer
	Logger     *slog.Logger
	// FairShare, when set, shares the fair-share counters with the other replicas of a fleet
	// (see SyncFairShare); nil: this queue's counters alone order its tenants.
	FairShare FairShareStore
}

// Queue admits and orders the requests of one model and releases each one when the pool can
// take it now. It is safe for concurrent use; all its state is guarded by one mutex, held for
// O(log n) work per Enqueue, dispatch, Done or cancellation (n queued requests) and never while
// blocking.
type Queue struct {
	cfg   Config // with defaults; never modified
	clock Clock
	log   *slog.Logger
	m     *metrics
	model string
	fleet FairShareStore // nil: no fleet

	// syncMu serializes SyncFairShare and guards its reused buffers.
	syncMu      sync.Mutex
	syncCharges []FlowCharge
	syncFlows   []*flow

	// mu guards every field below, every tenant, flow and classQueue, and the state, err and
	// list links of every Ticket.
	mu          sync.Mutex
	closed      bool
	capacity    Capacity
	reserveReq  int   // requests Standard and Batch leave free
	reserveTok  int64 // tokens Standard and Batch leave free
	classes     [numClasses]classQueue
	tenants     map[string]*tenant
	deadlines   heap[*flow] // every backlogged flow, by the deadline of its head
	timer       Timer       // fires at the earliest deadline; nil until first needed
	armedAt     int64       // deadline (unix ns) the timer is set for; 0 when not armed
	seq         uint64      // arrival order and flow tie-breaks
	inflightReq int
	inflightTok int64
	lowerReq    int // in flight in Standard and Batch
	lowerTok    int64
	serviceTime float64 // EWMA of seconds from dispatch to Done; 0 until measured
	expired     int64   // deadline misses
	// reserveOutside: the interactive reserve is kept outside capacity (SetReserveOutside), and
	// reserveReq and reserveTok are 0.
	reserveOutside bool
}

// ewmaWeight is the weight of the newest sample in the service-time average.
const ewmaWeight = 0.1

// tenant is one tenant's state across classes.
type tenant struct {
	name   string
	queued int // over all classes, for the per-tenant cap
	flows  [numClasses]*flow
	served prometheus.Counter
	// forgotten is set by ForgetTenant while the tenant still had requests queued or in flight:
	// its series is gone, and the tenant goes when its last request does.
	forgotten bool
}

// flow is the queue of one tenant in one class: its requests by earliest deadline, and its
// virtual token counter.
type flow struct {
	tenant       *tenant
	class        Class
	fairShare    float64    // weighted tokens charged so far: the fair-share (virtual token) counter
	stamp        uint64     // when it last entered or was charged: equal counters go round-robin
	items        ticketHeap // its requests not yet found past their due, by deadline then arrival
	late         ticketHeap // its requests found past their due, by deadline then arrival
	lateTokens   int64      // the cost of those in late
	idx          int        // position in its class's flow heap; -1 when it has nothing queued
	deadlineIdx  int        // position in the queue's deadline heap; -1 when it has nothing queued
	headDeadline int64      // the earliest deadline of its requests (unix ns; math.MaxInt64 for none)
	queuedTokens int64
	inflight     int
	refused      int // requests refused by their Placer in the current release round
	passedItems  int // requests passed over with the whole flow in the current round; 0: not passed
	// With a fleet (Queue.fleet): the charges and the lift the fleet has not been told of yet
	// (see SyncFairShare and flow.lift).
	unsent   float64
	lifted   bool
	liftBase float64
	// queuedElsewhere is, with a fleet, how many of the flow's requests the other replicas had
	// queued at the last exchange that told (0: none, or not known); see Backlog.
	queuedElsewhere int
}

// classQueue is one class: its backlogged flows by virtual counter, and its tickets in arrival
// order (for oldest-wait, FIFO mode and Close).
type classQueue struct {
	flows          flowHeap
	queued         int
	queuedTokens   int64
	inflight       int
	inflightTokens int64
	share          float64 // starvation guard: minimum share of dispatches while backlogged
	credit         float64 // dispatches owed by the guard; reset when the class drains
	fairShareFloor float64 // counter of the flow served last: the floor for returning flows
	head, tail     *Ticket
	dispatched     int64
	passed         int // tickets passed over in the current release round (see passOverLocked)
	// fleetFloor is, with a fleet, the least counter backlogged in the fleet at the last
	// exchange; +Inf when none is or the exchange failed (see SyncFairShare).
	fleetFloor float64
}

// New builds a queue from cfg (validated, defaults filled in) with the given dependencies. The
// queue starts with zero capacity: nothing is dispatched until SetCapacity. Close it to end its
// timer and unregister its metrics.
func New(cfg Config, opts Options) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if opts.Clock == nil {
		opts.Clock = realClock{}
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer, opts.Model)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	q := &Queue{
		cfg:     cfg,
		clock:   opts.Clock,
		log:     opts.Logger.With("model", opts.Model),
		m:       m,
		model:   opts.Model,
		fleet:   opts.FairShare,
		tenants: make(map[string]*tenant),
		deadlines: heap[*flow]{
			less:     func(a, b *flow) bool { return a.headDeadline < b.headDeadline },
			setIndex: func(f *flow, i int) { f.deadlineIdx = i },
		},
	}
	for c := range q.classes {
		q.classes[c].fleetFloor = math.Inf(1)
	}
	q.classes[Standard].share = *cfg.StandardMinShare
	q.classes[Batch].share = *cfg.BatchMinShare
	return q, nil
}

// Enqueue admits r or refuses it at once. A refusal is a *Rejection (QueueFull,
// DeadlineUnreachable, TooLarge or Shutdown, with RetryAfter); any other error means r is
// malformed. An admitted request may already be dispatched when Enqueue returns; the caller
// must call Wait on the ticket. Cost: O(log n), two allocations.
func (q *Queue) Enqueue(r Request) (*Ticket, error) {
	if !r.Class.valid() {
		return nil, fmt.Errorf("queue: enqueue: unknown class %d", uint8(r.Class))
	}
	if r.PromptTokens < 0 || r.MaxTokens < 0 {
		return nil, fmt.Errorf("queue: enqueue: negative tokens (prompt %d, max %d)", r.PromptTokens, r.MaxTokens)
	}
	if math.IsNaN(r.Weight) || math.IsInf(r.Weight, 0) {
		return nil, fmt.Errorf("queue: enqueue: weight %v is not a finite number", r.Weight)
	}
	if r.Weight <= 0 {
		r.Weight = 1
	}
	cost := int64(r.PromptTokens) + int64(r.MaxTokens)
	now := q.clock.Now()

	q.mu.Lock()
	defer q.mu.Unlock()
	c := r.Class
	if q.closed {
		return nil, q.rejectLocked(c, Shutdown, q.cfg.ShutdownRetryAfter)
	}
	if q.neverFits(c, cost) {
		return nil, q.rejectLocked(c, TooLarge, 0)
	}
	ten := q.tenantLocked(r.Tenant)
	f := ten.flows[c]
	if f == nil {
		f = q.newFlow(ten, c)
	}
	q.demoteLateLocked(f, now.UnixNano())
	wait, measured := q.estimateWaitLocked(c, f, cost)
	tenantCap := q.cfg.MaxQueuedPerTenant
	if r.MaxQueued > 0 {
		tenantCap = min(tenantCap, r.MaxQueued)
	}
	if ten.queued >= tenantCap || q.classes[c].queued >= q.cfg.MaxQueuedPerClass {
		return nil, q.rejectLocked(c, QueueFull, wait)
	}
	if !r.Deadline.IsZero() {
		budget := r.Deadline.Sub(now)
		if budget <= 0 || measured && wait > budget {
			return nil, q.rejectLocked(c, DeadlineUnreachable, wait-budget)
		}
	}

	t := &Ticket{q: q, flow: f, ch: make(chan struct{}), cost: cost, weight: r.Weight,
		deadline: math.MaxInt64, due: math.MaxInt64, enqueuedAt: now.UnixNano(), placer: r.Placer}
	t.charge = float64(r.PromptTokens+2*r.MaxTokens) / r.Weight
	t.grant.t = t
	if !r.Deadline.IsZero() {
		t.deadline = r.Deadline.UnixNano()
	}
	if !r.Due.IsZero() {
		t.due = r.Due.UnixNano()
	}
	q.pushLocked(t)
	q.dispatchLocked(now)
	q.armLocked(now)
	return t, nil
}

// SetCapacity sets what the pool can hold in flight. The gateway calls it whenever the sum
// over the model's healthy, non-draining workers changes (a worker added, removed, drained,
// marked unhealthy or back, or its learned budget updated). Capacity may shrink below what is in
// flight: nothing new is dispatched until in-flight falls below it. A queued request that no
// longer fits even an empty pool ends with a TooLarge Rejection. Negative values count as 0.
func (q *Queue) SetCapacity(c Capacity) {
	c.Requests, c.Tokens = max(c.Requests, 0), max(c.Tokens, 0)
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.capacity = c
	q.setReserveLocked()
	q.log.Debug("queue capacity set", "requests", c.Requests, "tokens", c.Tokens,
		"reserve_requests", q.reserveReq, "reserve_tokens", q.reserveTok)
	q.dispatchLocked(now)
	q.armLocked(now)
}

// SetReserveOutside says whether the interactive reserve is kept outside the capacity the queue
// is given: a gateway fleet keeps it whole in the split of its workers, so each replica's
// capacity is its share less the reserve, and the room of the reserve comes on top of it for an
// interactive request that needs it. Then Standard and Batch may fill the whole capacity. False
// by default; a call that changes nothing costs a lock.
func (q *Queue) SetReserveOutside(outside bool) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.reserveOutside == outside {
		return
	}
	q.reserveOutside = outside
	q.setReserveLocked()
	q.dispatchLocked(now)
	q.armLocked(now)
}

// setReserveLocked sets the reserve from the capacity: ceil(InteractiveReserve x capacity) in
// each dimension, at most all but one request slot; none when it is kept outside. q.mu must be
// held.
func (q *Queue) setReserveLocked() {
	c := q.capacity
	share := *q.cfg.InteractiveReserve
	if q.reserveOutside {
		share = 0
	}
	q.reserveReq = min(int(math.Ceil(share*float64(c.Requests)-1e-9)), max(c.Requests-1, 0))
	q.reserveTok = min(int64(math.Ceil(share*float64(c.Tokens)-1e-9)), max(int64(c.Tokens)-1, 0))
}

// Close shuts the queue down: every queued ticket ends with a Shutdown Rejection (its Wait
// returns it), later Enqueues are refused with Shutdown, the deadline timer stops and the
// metrics are unregistered. Grants already given stay valid and must still be Done. Close is
// idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return
	}
	q.closed = true
	ended := 0
	for c := range q.classes {
		for q.classes[c].head != nil {
			q.endLocked(q.classes[c].head, &Rejection{Reason: Shutdown, RetryAfter: q.cfg.ShutdownRetryAfter}, Shutdown)
			ended++
		}
	}
	if q.timer != nil {
		q.timer.Stop()
		q.armedAt = 0
	}
	q.mu.Unlock()
	q.m.unregister()
	q.log.Info("queue closed", "queued_ended", ended)
}

func (q *Queue) tenantLocked(name string) *tenant {
	ten := q.tenants[name]
	if ten == nil {
		ten = &tenant{name: name, served: q.m.served.WithLabelValues(name)}
		q.tenants[name] = ten
	}
	if ten.forgotten { // back (a new tenant of the same id) before its last request ended
		ten.forgotten = false
		ten.served = q.m.served.WithLabelValues(name)
	}
	return ten
}

// ForgetTenant drops what the queue keeps of a tenant that no longer exists: its series of
// usher_queue_tokens_served_total at once, and its fair-share state once it has nothing queued
// or in flight (an idle tenant's counter is not needed: a returning tenant starts from the floor
// of the busy ones). Requests of the tenant still in the queue are served as usual. Cost: O(1).
func (q *Queue) ForgetTenant(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.m.served.DeleteLabelValues(name)
	if ten := q.tenants[name]; ten != nil {
		ten.forgotten = true
		q.dropIfIdleLocked(ten)
	}
}

// dropIfIdleLocked removes a forgotten tenant that has nothing queued or in flight.
func (q *Queue) dropIfIdleLocked(ten *tenant) {
	if !ten.forgotten || ten.queued > 0 {
		return
	}
	for _, f := range ten.flows {
		if f != nil && f.inflight > 0 {
			return
		}
	}
	delete(q.tenants, ten.name)
}

func (q *Queue) newFlow(ten *tenant, c Class) *flow {
	f := &flow{tenant: ten, class: c, idx: -1, deadlineIdx: -1}
	ten.flows[c] = f
	return f
}

// queued is how many of the flow's requests wait, on time and late.
func (f *flow) queued() int { return len(f.items) + len(f.late) }

// next is the flow's next request in its order: the earliest deadline (then arrival) of those not
// found past their due, else of those found late; nil when it has none queued.
func (f *flow) next() *Ticket {
	switch {
	case len(f.items) > 0:
		return f.items[0].t
	case len(f.late) > 0:
		return f.late[0].t
	}
	return nil
}

// earliest is the flow's queued request with the earliest deadline, on time or late (the one the
// deadline timer ends first); nil when it has none queued.
func (f *flow) earliest() *Ticket {
	switch {
	case len(f.late) == 0:
		return f.next()
	case len(f.items) == 0 || f.late[0].before(&f.items[0]):
		return f.late[0].t
	}
	return f.items[0].t
}

// file puts t in the flow's heap for it: late, or the others.
func (f *flow) file(t *Ticket) {
	if t.late {
		f.late.push(t)
		f.lateTokens += t.cost
		return
	}
	f.items.push(t)
}

// unfile takes t out of the flow's heap it is in.
func (f *flow) unfile(t *Ticket) {
	if t.late {
		f.late.remove(t.flowIdx)
		f.lateTokens -= t.cost
		return
	}
	f.items.remove(t.flowIdx)
}

// demoteLateLocked files the flow's next requests that are past their due at now (unix ns)
// among its late ones, until its next is not or none is left: late last. A request that can no longer
// meet its objective waits behind those of its tenant and class that still can, so that under
// overload most are served in time instead of every one of them late, in the way of adaptive
// LIFO (Maurer, "Fail at Scale", 2015). Those it passes are still served before it whenever
// they arrive within their own due; it is served once none of them waits, or its deadline ends
// it. Each request is filed at most once: O(log n) each; usher_queue_late_total counts them.
func (q *Queue) demoteLateLocked(f *flow, now int64) {
	n := 0
	for ; len(f.items) > 0 && f.items[0].t.due <= now; n++ {
		t := f.items[0].t
		f.items.remove(0)
		t.late = true
		f.file(t)
	}
	if n > 0 {
		q.m.late[f.class].Add(float64(n))
	}
}

func (q *Queue) rejectLocked(c Class, r Reason, retryAfter time.Duration) *Rejection {
	q.m.shed[c][r].Inc()
	if r != TooLarge {
		retryAfter = max(retryAfter, q.cfg.MinRetryAfter)
	}
	return &Rejection{Reason: r, RetryAfter: retryAfter}
}

// pushLocked files a new (or requeued) ticket: in its flow (lifting a returning flow's counter to the
// least of the backlogged ones, so idling earns no credit), its class's arrival list and the
// deadline heap.
func (q *Queue) pushLocked(t *Ticket) {
	q.seq++
	if t.seq == 0 { // a requeued ticket keeps its arrival number
		t.seq = q.seq
	}
	f, cls := t.flow, &q.classes[t.flow.class]
	if f.idx < 0 {
		floor := cls.fairShareFloor
		if cls.flows.len() > 0 {
			floor = cls.flows.peek().fairShare
		}
		if q.fleet != nil && !math.IsInf(cls.fleetFloor, 1) {
			// The least counter backlogged in the fleet: a heavy tenant backlogged here alone
			// must not lift a tenant the rest of the fleet serves ahead of it.
			if cls.flows.len() > 0 {
				floor = min(floor, cls.fleetFloor)
			} else {
				floor = cls.fleetFloor
			}
		}
		f.lift(floor, q.fleet != nil)
		f.stamp = q.seq
		cls.flows.push(f)
	}
	f.file(t)
	f.queuedTokens += t.cost
	f.tenant.queued++
	switch {
	case f.deadlineIdx < 0:
		f.headDeadline = t.deadline
		q.deadlines.push(f)
	case t.deadline < f.headDeadline:
		f.headDeadline = t.deadline
		q.deadlines.fix(f.deadlineIdx)
	}
	t.prev = cls.tail
	if cls.tail != nil {
		cls.tail.next = t
	} else {
		cls.head = t
	}
	cls.tail = t
	cls.queued++
	cls.queuedTokens += t.cost
	q.m.depth[f.class].Inc()
}

// removeLocked takes a queued ticket out of every structure it is filed in.
func (q *Queue) removeLocked(t *Ticket) {
	f, cls := t.flow, &q.classes[t.flow.class]
	f.unfile(t)
	f.queuedTokens -= t.cost
	switch {
	case f.queued() == 0:
		cls.flows.remove(f.idx)
		q.deadlines.remove(f.deadlineIdx)
	case t.deadline == f.headDeadline:
		f.headDeadline = f.earliest().deadline
		q.deadlines.fix(f.deadlineIdx)
	}
	f.tenant.queued--
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		cls.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		cls.tail = t.prev
	}
	t.prev, t.next = nil, nil
	cls.queued--
	cls.queuedTokens -= t.cost
	if cls.queued == 0 {
		cls.credit = 0
	}
	q.m.depth[f.class].Dec()
}

// endLocked ends a queued ticket without dispatch: Wait returns err.
func (q *Queue) endLocked(t *Ticket, err error, why Reason) {
	q.removeLocked(t)
	t.state = stateEnded
	t.err = err
	q.m.shed[t.flow.class][why].Inc()
	if why == shedDeadlineExceeded {
		q.expired++
	}
	close(t.ch)
	q.dropIfIdleLocked(t.flow.tenant)
}

// reqLimit and tokLimit are the part of the pool class c may fill: all of it for Interactive
// (and in FIFO mode), all but the interactive reserve for Standard and Batch.
func (q *Queue) reqLimit(c Class) int {
	if c == Interactive || q.cfg.FIFO {
		return q.capacity.Requests
	}
	return q.capacity.Requests - q.reserveReq
}

func (q *Queue) tokLimit(c Class) int64 {
	if c == Interactive || q.cfg.FIFO {
		return int64(q.capacity.Tokens)
	}
	return int64(q.capacity.Tokens) - q.reserveTok
}

// neverFits reports whether a request of cost tokens could not be dispatched in class c even
// with nothing in flight.
func (q *Queue) neverFits(c Class, cost int64) bool {
	return q.capacity.Tokens > 0 && cost > q.tokLimit(c)
}

func (q *Queue) fitsPool(t *Ticket) bool {
	return q.inflightReq+1 <= q.capacity.Requests &&
		(q.capacity.Tokens == 0 || q.inflightTok+t.cost <= int64(q.capacity.Tokens))
}

// leavesReserve reports whether dispatching t leaves at least the interactive reserve free:
// the rule for an ordinary Standard or Batch dispatch.
func (q *Queue) leavesReserve(t *Ticket) bool {
	return q.inflightReq+1 <= q.reqLimit(Standard) &&
		(q.capacity.Tokens == 0 || q.inflightTok+t.cost <= q.tokLimit(Standard))
}

// lowerFits reports whether Standard and Batch together stay within capacity minus the
// reserve after dispatching t: the rule for a dispatch the starvation guard owes, which may use
// free room that interactive requests left, but never more than lower classes may ever hold.
func (q *Queue) lowerFits(t *Ticket) bool {
	return q.lowerReq+1 <= q.reqLimit(Standard) &&
		(q.capacity.Tokens == 0 || q.lowerTok+t.cost <= q.tokLimit(Standard))
}

// dispatchLocked runs a release round: it releases requests, in the order the package doc
// describes, for as long as the next one fits and its Placer places it. A request its Placer
// finds no room for is passed over for the round, so the ones behind it are tried (see
// passOverLocked; at most maxPassedOver are).
func (q *Queue) dispatchLocked(now time.Time) {
	nowNano := now.UnixNano()
	var r round
	for !r.full() {
		t := q.nextLocked(nowNano)
		if t == nil {
			break
		}
		switch q.placeLocked(t) {
		case placed:
			q.grantLocked(t, now)
		case noRoom:
			q.passOverLocked(t, &r)
		}
	}
	q.restoreLocked(&r)
}

// headLocked returns class c's next request in order, first ending those whose deadline has
// passed or that can never fit; nil when the class is empty or every request in it was passed
// over in this round.
func (q *Queue) headLocked(c Class, nowNano int64) *Ticket {
	cls := &q.classes[c]
	for cls.queued > cls.passed {
		var t *Ticket
		if q.cfg.FIFO {
			t = cls.head
			for t.passed {
				t = t.next
			}
		} else {
			f := cls.flows.peek()
			q.demoteLateLocked(f, nowNano)
			t = f.next()
		}
		switch {
		case t.deadline <= nowNano:
			q.endLocked(t, ErrDeadlineExceeded, shedDeadlineExceeded)
		case q.neverFits(c, t.cost):
			q.endLocked(t, &Rejection{Reason: TooLarge}, TooLarge)
		default:
			return t
		}
	}
	return nil
}

// nextLocked picks the request to dispatch now, or nil when the next one in order does not fit.
func (q *Queue) nextLocked(nowNano int64) *Ticket {
	if q.cfg.FIFO {
		var first *Ticket
		for _, c := range allClasses {
			if t := q.headLocked(c, nowNano); t != nil && (first == nil || t.seq < first.seq) {
				first = t
			}
		}
		if first == nil || !q.fitsPool(first) {
			return nil
		}
		return first
	}

	var order [2 * numClasses]Class
	owed := 0
	for _, c := range allClasses {
		if q.classes[c].credit >= 1 && q.classes[c].queued > 0 {
			order[owed] = c
			owed++
		}
	}
	n := owed
	for _, c := range allClasses {
		order[n] = c
		n++
	}
	var seen [numClasses]bool
	lowerBlocked := false
	for i, c := range order[:n] {
		if seen[c] || c != Interactive && lowerBlocked {
			continue
		}
		seen[c] = true
		t := q.headLocked(c, nowNano)
		if t == nil {
			continue
		}
		if !q.fitsPool(t) {
			return nil
		}
		if c != Interactive && !(i < owed && q.lowerFits(t) || i >= owed && q.leavesReserve(t)) {
			lowerBlocked = true
			continue
		}
		return t
	}
	return nil
}

// grantLocked dispatches t: charges its flow, moves it from queued to in flight, settles the
// starvation guard's credits and wakes its Wait. It does not allocate.
func (q *Queue) grantLocked(t *Ticket, now time.Time) {
	f := t.flow
	c := f.class
	cls := &q.classes[c]
	if !q.cfg.FIFO {
		for k := range q.classes {
			g := &q.classes[k]
			if g.share > 0 && g.queued > 0 {
				g.credit += g.share
			}
		}
		cls.credit = max(cls.credit-1, 0)
		cls.fairShareFloor = max(cls.fairShareFloor, f.fairShare)
		f.charge(t.charge)
		q.seq++
		f.stamp = q.seq
	}
	q.removeLocked(t)
	if f.idx >= 0 {
		cls.flows.fix(f.idx)
	}
	q.inflightReq++
	q.inflightTok += t.cost
	if c != Interactive {
		q.lowerReq++
		q.lowerTok += t.cost
	}
	cls.inflight++
	cls.inflightTokens += t.cost
	cls.dispatched++
	f.inflight++

	t.state = stateDispatched
	t.grant.done.Store(false) // a requeued request's grant is live again
	t.grant.Class = c
	t.grant.Waited = max(time.Duration(now.UnixNano()-t.enqueuedAt), 0)
	t.grant.dispatchedAt = now.UnixNano()
	q.m.wait[c].Observe(t.grant.Waited.Seconds())
	q.m.dispatched[c].Inc()
	close(t.ch)
}

// requeue puts a dispatched request back: frees its capacity, refunds its whole charge, and files
// it again under its old arrival number, so it is the next of its flow among equal deadlines.
func (q *Queue) requeue(t *Ticket) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	f := t.flow
	c := f.class
	cls := &q.classes[c]
	q.uncountLocked(t)
	if !q.cfg.FIFO {
		f.charge(-t.charge)
		if f.idx >= 0 {
			cls.flows.fix(f.idx)
		}
	}
	q.m.requeued[c].Inc()
	// It keeps its place (its seq), but its wait begins again: the time it was served is not
	// queue time, nor is its first wait, which its first grant told.
	t.enqueuedAt = now.UnixNano()
	t.state = stateQueued
	t.grant.Placement = nil
	t.ch = make(chan struct{})
	q.pushLocked(t)
	q.dispatchLocked(now)
	q.armLocked(now)
}

// uncountLocked takes a dispatched request out of the in-flight counts.
func (q *Queue) uncountLocked(t *Ticket) {
	f := t.flow
	c := f.class
	cls := &q.classes[c]
	q.inflightReq--
	q.inflightTok -= t.cost
	if c != Interactive {
		q.lowerReq--
		q.lowerTok -= t.cost
	}
	cls.inflight--
	cls.inflightTokens -= t.cost
	f.inflight--
}

// release ends a dispatched request: frees its capacity, corrects its flow's counter from the
// estimate to the real usage and, when measured, feeds the service-time average.
func (q *Queue) release(t *Ticket, u Usage, measured bool) {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	f := t.flow
	cls := &q.classes[f.class]
	q.uncountLocked(t)
	if !q.cfg.FIFO {
		f.charge(float64(u.PromptTokens+2*u.CompletionTokens)/t.weight - t.charge)
		if f.idx >= 0 {
			cls.flows.fix(f.idx)
		}
	}
	if served := u.PromptTokens + u.CompletionTokens; served > 0 && !f.tenant.forgotten {
		f.tenant.served.Add(float64(served))
	}
	q.dropIfIdleLocked(f.tenant)
	if measured {
		d := max(time.Duration(now.UnixNano()-t.grant.dispatchedAt), 0).Seconds()
		if q.serviceTime == 0 {
			q.serviceTime = d
		} else {
			q.serviceTime += ewmaWeight * (d - q.serviceTime)
		}
	}
	q.dispatchLocked(now)
	q.armLocked(now)
}

// estimateWaitLocked guesses how long a request of cost tokens arriving in flow f would wait:
// the work ahead of it (every queued request of higher classes; in its class its own flow's
// queue but its late requests, which go after it, and, from each other backlogged flow, at most
// as much again, as the fair share would interleave them) divided by the pool's drain rate (its
// limit over the service-time average).
// ok is false before any measurement or with no capacity: then the queue admits.
func (q *Queue) estimateWaitLocked(c Class, f *flow, cost int64) (wait time.Duration, ok bool) {
	capReq, capTok := q.reqLimit(c), q.tokLimit(c)
	if q.serviceTime == 0 || capReq <= 0 {
		return 0, false
	}
	var reqs, toks int64
	if q.cfg.FIFO {
		for k := range q.classes {
			reqs += int64(q.classes[k].queued)
			toks += q.classes[k].queuedTokens
		}
	} else {
		for k := Interactive; k < c; k++ {
			reqs += int64(q.classes[k].queued)
			toks += q.classes[k].queuedTokens
		}
		cls := &q.classes[c]
		// Its own late requests go after it (late last).
		own, ownTok := int64(len(f.items)), f.queuedTokens-f.lateTokens
		others := int64(cls.flows.len())
		if f.idx >= 0 {
			others--
		}
		// Under the fair share every other backlogged tenant is served about as much as this one
		// before its turn comes, whatever it has queued right now: tenants that keep sending
		// take their turns ahead of a request deep in its own tenant's queue. Counting only what
		// the others have queued now under-estimates the wait, and a request admitted on such
		// an estimate waits its whole deadline for a 504.
		reqs += own + others*(own+1)
		toks += ownTok + others*(ownTok+cost)
	}
	rounds := float64(reqs) / float64(capReq)
	if q.capacity.Tokens > 0 && capTok > 0 {
		rounds = max(rounds, float64(toks)/float64(capTok))
	}
	return time.Duration(rounds * q.serviceTime * float64(time.Second)), true
}

// armLocked sets the timer for the earliest queued deadline, or stops it when there is none.
func (q *Queue) armLocked(now time.Time) {
	next := int64(math.MaxInt64)
	if !q.closed && q.deadlines.len() > 0 {
		next = q.deadlines.peek().headDeadline
	}
	if next == math.MaxInt64 {
		if q.armedAt != 0 {
			q.timer.Stop()
			q.armedAt = 0
		}
		return
	}
	if q.armedAt == next {
		return
	}
	d := time.Duration(next - now.UnixNano())
	if q.timer == nil {
		q.timer = q.clock.AfterFunc(d, q.onTimer)
	} else {
		q.timer.Reset(d)
	}
	q.armedAt = next
}

// onTimer runs on the timer's goroutine (owned by the queue, stopped by Close): it ends every
// request whose deadline has passed and dispatches what that unblocked.
func (q *Queue) onTimer() {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	q.armedAt = 0
	if q.closed {
		return
	}
	for q.deadlines.len() > 0 && q.deadlines.peek().headDeadline <= now.UnixNano() {
		q.endLocked(q.deadlines.peek().earliest(), ErrDeadlineExceeded, shedDeadlineExceeded)
	}
	q.dispatchLocked(now)
	q.armLocked(now)
}
