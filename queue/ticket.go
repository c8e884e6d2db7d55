package queue

import (
	"context"
	"sync/atomic"
	"time"
)

type ticketState uint8

const (
	stateQueued     ticketState = iota
	stateDispatched             // capacity reserved; the Grant is valid
	stateEnded                  // left without dispatch; err says why
)

// Ticket is an admitted request's place in the queue. Exactly one goroutine calls Wait, once.
//
// It is kept small and poor in pointers: a backlog of 100,000 of them is what the garbage
// collector scans.
type Ticket struct {
	q          *Queue
	flow       *flow         // its tenant and class
	ch         chan struct{} // closed when the ticket leaves the queue
	cost       int64         // tokens held in flight: prompt + max output
	charge     float64       // estimated fair-share charge: (prompt + 2 x output) / weight
	weight     float64       // the request's weight, defaulted
	deadline   int64         // unix nanoseconds; math.MaxInt64 when none
	due        int64         // unix nanoseconds; math.MaxInt64 when none (Request.Due)
	seq        uint64
	enqueuedAt int64  // unix nanoseconds: when it last went into the queue (Enqueue, Requeue)
	placer     Placer // nil: placed by Capacity alone
	grant      Grant

	// Guarded by q.mu. err is written before ch is closed and read only after.
	state      ticketState
	err        error
	flowIdx    int     // position in its flow's items or late
	late       bool    // filed in its flow's late: found past its due
	passed     bool    // passed over in the current release round (see passOverLocked)
	prev, next *Ticket // arrival list of its class
}

// Ready returns a channel closed once the ticket has left the queue, dispatched or not; Wait
// then returns at once.
func (t *Ticket) Ready() <-chan struct{} { return t.ch }

// Wait blocks until the request is dispatched and returns its Grant: capacity is then reserved
// for it and, with a Placer, its placement made (Grant.Placement); the caller sends the request
// and calls Grant.Done when it ends. Otherwise it returns:
//   - ErrDeadlineExceeded when the deadline passed while queued;
//   - a *Rejection with Reason Shutdown when Close ended the queue, or TooLarge when capacity
//     shrank below what the request needs;
//   - the Placer's error when it found the request can never be placed;
//   - ctx.Err() when ctx ended first: the request is removed at once, and if it was dispatched
//     in the same instant its capacity and placement are given back, so no slot leaks.
func (t *Ticket) Wait(ctx context.Context) (*Grant, error) {
	select {
	case <-t.ch:
		return t.result()
	default:
	}
	select {
	case <-t.ch:
		return t.result()
	case <-ctx.Done():
	}
	q := t.q
	q.mu.Lock()
	if t.state == stateQueued {
		now := q.clock.Now()
		q.endLocked(t, ctx.Err(), shedCanceled)
		q.dispatchLocked(now)
		q.armLocked(now)
		q.mu.Unlock()
		return nil, ctx.Err()
	}
	q.mu.Unlock()
	if g, err := t.result(); err == nil {
		if g.Placement != nil {
			g.Placement.Undo()
		}
		g.finish(Usage{}, false)
	}
	return nil, ctx.Err()
}

func (t *Ticket) result() (*Grant, error) {
	if t.err != nil {
		return nil, t.err
	}
	return &t.grant, nil
}

// Grant is a dispatched request's hold on capacity. Its fields are set before Wait returns it
// and never change.
type Grant struct {
	// Class is the class the request was served in, for the X-Usher-Class header and for
	// handing a priority down to workers that schedule by it.
	Class Class
	// Waited is the time spent queued before this grant: since the request was enqueued, or
	// requeued (Requeue) for a second grant, for the X-Usher-Queue-Ms header.
	Waited time.Duration
	// Placement is where the request's Placer placed it; nil without a Placer. The caller owns
	// it: the queue neither undoes nor reads it once Wait returned the grant.
	Placement Placement

	t            *Ticket
	dispatchedAt int64 // unix nanoseconds
	done         atomic.Bool
}

// Done ends the request: it frees its capacity (which may dispatch others) and corrects its
// tenant's fair-share counter from the estimate to u, the usage the worker reported. Pass the
// zero Usage when nothing was served (the whole charge is refunded). Call it exactly once, when
// the response has ended or failed; later calls do nothing. Safe from any goroutine.
func (g *Grant) Done(u Usage) { g.finish(u, u != Usage{}) }

// Requeue gives the grant's capacity back and puts its request back in the queue, ahead of the
// requests its tenant queued later in the same class, its fair-share charge refunded: for a
// request the gateway preempted before any of its answer reached the client, so that a request
// of a higher class can have its capacity, or one whose attempt failed and that must be placed
// again (elsewhere). The caller has given its placement back first. It returns the request's
// ticket: Wait on it again, for a new grant and placement.
// The grant is then spent (Done does nothing) until the ticket is dispatched again. Call it
// instead of Done, once.
func (g *Grant) Requeue() *Ticket {
	if !g.done.CompareAndSwap(false, true) {
		return g.t
	}
	g.t.q.requeue(g.t)
	return g.t
}

func (g *Grant) finish(u Usage, measured bool) {
	if !g.done.CompareAndSwap(false, true) {
		return
	}
	g.t.q.release(g.t, u, measured)
}
