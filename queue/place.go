package queue

import "errors"

// Placer places one request where it will be served (a worker). The queue asks it when the
// request is next in the queue's order and the pool's Capacity has room for it, under the
// queue's lock, so a request is released only once it has its place: the order of the queue is
// the order of service.
//
// Place returns the placement; or an error wrapping ErrNoRoom when the request cannot be placed
// now but may be once room frees (every worker it may use is full): the queue then tries the
// requests behind it, and this one again at the next release round; or any other error when it
// can never be placed (no worker it may use takes requests): the request then leaves the queue
// and its Wait returns that error. Place must not block, must not call back into the queue, and
// costs the queue's lock for as long as it runs.
//
// waiting is how many other requests the queue holds as it asks (every class, this replica's):
// what a placement that adds work to the pool delays besides the request itself.
type Placer interface {
	Place(waiting int) (Placement, error)
}

// Placement is where a released request goes, handed to its caller in Grant.Placement.
type Placement interface {
	// Undo gives the placement back unused. The queue calls it, outside its lock, when the
	// caller left (its Wait's context ended) at the instant the request was released.
	Undo()
}

// ErrNoRoom is what a Placer's error wraps when the request cannot be placed now but may be
// later.
var ErrNoRoom = errors.New("no room to place the request now")

// maxPassedOver bounds the requests a release round passes over because their Placer found no
// room (each one costs a Place): beyond it, the round stops and the requests further back wait
// for the next round (the next Enqueue, Done, Retry or capacity change).
const maxPassedOver = 16

// maxRefusedPerFlow is how many of one flow's requests (one tenant in one class) a round passes
// over one by one; at the next refusal it passes over the rest of the flow for the round. So a
// tenant whose requests cannot be placed (all pinned to one full worker, say) spends at most
// that many of the round's maxPassedOver, and holds back no other tenant's requests.
const maxRefusedPerFlow = 2

// round is what a release round passed over, restored at its end.
type round struct {
	tickets [maxPassedOver]*Ticket
	flows   [maxPassedOver]*flow
	nt, nf  int
}

// full reports whether the round passed over as many as it may.
func (r *round) full() bool { return r.nt+r.nf >= maxPassedOver }

// Retry runs a release round: call it when room may have appeared that Capacity does not show,
// such as a slot freed on a worker a Placer found full. Cost: that of the requests it releases
// and at most maxPassedOver refused Place calls; with nothing queued, as on a fleet with room
// (where a slot frees at the end of every request), a lock and no clock read.
func (q *Queue) Retry() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.waitingLocked() == 0 {
		return
	}
	now := q.clock.Now()
	q.dispatchLocked(now)
	q.armLocked(now)
}

// waitingLocked is how many requests are queued, over all classes. With none, a release round
// would release none and leave the deadline timer as it is (armLocked keeps it stopped while no
// deadline is queued).
func (q *Queue) waitingLocked() int {
	n := 0
	for c := range q.classes {
		n += q.classes[c].queued
	}
	return n
}

// placement outcomes of placeLocked.
const (
	placed   = iota // t may be released: t.grant.Placement is set (nil without a Placer)
	noRoom          // t cannot be placed now
	unplaced        // t can never be placed: it ended with the Placer's error
)

// placeLocked asks t's Placer, if it has one, for its placement.
func (q *Queue) placeLocked(t *Ticket) int {
	if t.placer == nil {
		return placed
	}
	p, err := t.placer.Place(q.waitingLocked() - 1)
	switch {
	case err == nil:
		t.grant.Placement = p
		return placed
	case errors.Is(err, ErrNoRoom):
		return noRoom
	default:
		q.endLocked(t, err, shedUnplaceable)
		return unplaced
	}
}

// passOverLocked takes a queued ticket its Placer could not place out of the order for the rest
// of round r, so that the requests behind it are tried: the ticket alone, or, at its flow's
// maxRefusedPerFlow-th refusal in the round (except in FIFO mode), its whole flow. A ticket passed
// over stays counted as queued and in its class's arrival list (FIFO mode skips it there);
// restoreLocked puts it back.
func (q *Queue) passOverLocked(t *Ticket, r *round) {
	f, cls := t.flow, &q.classes[t.flow.class]
	f.refused++
	if !q.cfg.FIFO && f.refused >= maxRefusedPerFlow {
		cls.flows.remove(f.idx)
		f.passedItems = f.queued()
		cls.passed += f.passedItems
		r.flows[r.nf] = f
		r.nf++
		return
	}
	f.unfile(t)
	if f.queued() == 0 {
		cls.flows.remove(f.idx)
	}
	t.passed = true
	cls.passed++
	r.tickets[r.nt] = t
	r.nt++
}

// restoreLocked files what round r passed over back where it was: each flow with the counter it
// has, each ticket in its flow (its deadline and arrival number are its keys).
func (q *Queue) restoreLocked(r *round) {
	for _, f := range r.flows[:r.nf] {
		cls := &q.classes[f.class]
		cls.flows.push(f)
		cls.passed -= f.passedItems
		f.passedItems = 0
	}
	for _, t := range r.tickets[:r.nt] {
		f, cls := t.flow, &q.classes[t.flow.class]
		f.refused = 0
		t.passed = false
		cls.passed--
		f.file(t)
		if f.idx < 0 {
			cls.flows.push(f)
		}
		head := f.earliest().deadline
		switch {
		case f.deadlineIdx < 0:
			f.headDeadline = head
			q.deadlines.push(f)
		case f.headDeadline != head:
			f.headDeadline = head
			q.deadlines.fix(f.deadlineIdx)
		}
	}
}
