package queue

import (
	"cmp"
	"slices"
	"time"
)

// Snapshot is a consistent picture of the queue for the admin console.
type Snapshot struct {
	FIFO     bool
	Capacity Capacity
	// InFlight is what dispatched, not yet Done requests hold.
	InFlight Capacity
	// Reserve is what Standard and Batch leave free for arriving interactive requests.
	Reserve Capacity
	// Classes lists every class, highest first.
	Classes []ClassSnapshot
	// Tenants lists every tenant and class with something queued or in flight, by tenant
	// then class.
	Tenants []TenantSnapshot
	// DeadlineMisses counts requests whose deadline passed while queued.
	DeadlineMisses int64
	// ServiceTime is the average time from dispatch to Done; 0 until measured.
	ServiceTime time.Duration
}

// ClassSnapshot is one class in a Snapshot.
type ClassSnapshot struct {
	Class          Class
	Queued         int
	QueuedTokens   int64
	InFlight       int
	InFlightTokens int64
	// OldestWait is how long the oldest queued request has waited; 0 when none is queued.
	OldestWait time.Duration
	Dispatched int64
	// GuardCredit is the dispatches the starvation guard owes the class (one is owed at 1).
	GuardCredit float64
}

// TenantSnapshot is one tenant's flow in one class.
type TenantSnapshot struct {
	Tenant   string
	Class    Class
	Queued   int
	InFlight int
	// VirtualTokens is the fair-share counter: weighted tokens charged so far.
	VirtualTokens float64
}

// Backlog is what a queue holds now, as a fleet's split of the workers weighs it.
type Backlog struct {
	// Interactive and All count the requests queued: interactive, and of every class (passed
	// over by their Placer or not).
	Interactive, All int
	// InteractiveWeight and Weight sum the weights of the flows (tenant and class) with requests
	// queued: interactive, and of every class. The fair share serves each backlogged flow in
	// proportion to its weight, whatever the length of its queue, so a replica whose backlog is
	// two tenants' needs twice the room of one whose backlog is one tenant's. A flow's weight is
	// that of the request at its head. With a fleet, a flow queued on other replicas too counts
	// here in part: its weight times its requests queued here over those queued in the fleet
	// (as of the last exchange), so that over the fleet each flow weighs its weight once.
	InteractiveWeight, Weight float64
}

// Backlog returns what is queued now. Cost: the queue's lock, and a pass over the backlogged
// flows.
func (q *Queue) Backlog() Backlog {
	q.mu.Lock()
	defer q.mu.Unlock()
	var b Backlog
	for c := range q.classes {
		cls := &q.classes[c]
		b.All += cls.queued
		var w float64
		for _, e := range cls.flows {
			if n := e.f.queued(); n > 0 {
				w += e.f.next().weight * float64(n) / float64(n+e.f.queuedElsewhere)
			}
		}
		b.Weight += w
		if Class(c) == Interactive {
			b.Interactive, b.InteractiveWeight = cls.queued, w
		}
	}
	return b
}

// Snapshot returns the current state. Cost: O(tenants log tenants) under the queue's lock.
func (q *Queue) Snapshot() Snapshot {
	now := q.clock.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	s := Snapshot{
		FIFO:           q.cfg.FIFO,
		Capacity:       q.capacity,
		InFlight:       Capacity{Requests: q.inflightReq, Tokens: int(q.inflightTok)},
		Reserve:        Capacity{Requests: q.reserveReq, Tokens: int(q.reserveTok)},
		Classes:        make([]ClassSnapshot, 0, numClasses),
		DeadlineMisses: q.expired,
		ServiceTime:    time.Duration(q.serviceTime * float64(time.Second)),
	}
	if q.cfg.FIFO {
		s.Reserve = Capacity{}
	}
	for _, c := range allClasses {
		cls := &q.classes[c]
		cs := ClassSnapshot{Class: c, Queued: cls.queued, QueuedTokens: cls.queuedTokens,
			InFlight: cls.inflight, InFlightTokens: cls.inflightTokens, Dispatched: cls.dispatched,
			GuardCredit: cls.credit}
		if cls.head != nil {
			cs.OldestWait = time.Duration(now.UnixNano() - cls.head.enqueuedAt)
		}
		s.Classes = append(s.Classes, cs)
	}
	for _, ten := range q.tenants {
		for _, f := range ten.flows {
			if f == nil || f.queued() == 0 && f.inflight == 0 {
				continue
			}
			s.Tenants = append(s.Tenants, TenantSnapshot{Tenant: ten.name, Class: f.class,
				Queued: f.queued(), InFlight: f.inflight, VirtualTokens: f.fairShare})
		}
	}
	slices.SortFunc(s.Tenants, func(a, b TenantSnapshot) int {
		return cmp.Or(cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Class, b.Class))
	})
	return s
}
