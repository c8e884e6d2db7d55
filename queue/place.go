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
type Placer interface {
	Place() (Placement, error)
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

// Retry runs a release round: call it when room may have appeared that Capacity does not show,
// such as a slot freed on a worker a Placer found full. Cost: that of the requests it releases
// and at most maxPassedOver refused Place calls.
func (q *Queue) Retry() {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	q.dispatchLocked(now)
	q.armLocked(now)
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
	p, err := t.placer.Place()
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

// passOverLocked takes a queued ticket its Placer could not place out of its flow's order for
// the rest of this release round, so that the requests behind it are tried. It stays counted as
// queued and in its class's arrival list (FIFO mode skips it there); restoreLocked puts it back.
func (q *Queue) passOverLocked(t *Ticket) {
	f, cls := t.flow, &q.classes[t.flow.class]
	f.items.remove(t.flowIdx)
	if len(f.items) == 0 {
		cls.flows.remove(f.idx)
	}
	t.passed = true
	cls.passed++
}

// restoreLocked files the tickets passed over in a round back in their flows, each where it was
// (its deadline and arrival number are its keys), and its flow back with the counter it has.
func (q *Queue) restoreLocked(passed []*Ticket) {
	for _, t := range passed {
		if !t.passed {
			continue
		}
		f, cls := t.flow, &q.classes[t.flow.class]
		t.passed = false
		cls.passed--
		f.items.push(t)
		if f.idx < 0 {
			cls.flows.push(f)
		}
		head := f.items[0].t.deadline
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
