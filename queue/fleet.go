package queue

import (
	"context"
	"fmt"
	"math"
)

// FairShareStore keeps the fair-share counters of a fleet: the gateway replicas that serve one
// model each keep a Queue, and with a store they order their tenants by one counter per tenant
// and class, the fleet's, instead of each by its own. The gateway implements it over Redis.
type FairShareStore interface {
	// Exchange publishes one replica's batch and reads the fleet's counters back, in one round
	// trip: for each flow of ex, in order, the fleet's counter is first raised to at least Lift
	// (when Lifted), then Charge is added; this replica's floors replace the ones it sent
	// before. It returns the fleet's counter of each flow of ex, in the same order, and the
	// fleet's floors: by class, the least of the floors the replicas sent within the last
	// second or so, +Inf when none has a backlog. On an error nothing is to be taken as applied:
	// the queue sends the charges again with its next batch (a batch applied whose answer was
	// lost is then counted twice, an error of at most one batch). Safe for concurrent use.
	Exchange(ctx context.Context, ex FairShareExchange) (FairShareCounts, error)
}

// FairShareExchange is one replica's batch for one model's counters.
type FairShareExchange struct {
	Model string
	// Floors are this replica's least backlogged counters, by Class; +Inf for a class with
	// nothing queued here.
	Floors [numClasses]float64
	// Flows are the flows charged, lifted or backlogged here since the last exchange; at most
	// MaxFleetFlows.
	Flows []FlowCharge
}

// FlowCharge is what one replica did to one flow's (tenant and class) counter since its last
// exchange.
type FlowCharge struct {
	// Tenant is the tenant's id, as the gateway gave it: untrusted, of any length and bytes.
	Tenant string
	Class  Class
	// Charge is the weighted tokens charged, less the refunds and corrections (may be negative).
	Charge float64
	// Lifted says the flow came back from idle here: the fleet's counter is first raised to at
	// least Lift, what this replica then held the flow's counter at (at least the floor), less
	// the charges of this batch made before it.
	Lifted bool
	Lift   float64
	// Queued is how many of the flow's requests are queued here now.
	Queued int
}

// FairShareCounts is the fleet's answer to an exchange.
type FairShareCounts struct {
	// Counters are the fleet's counters of the exchange's flows, in its order.
	Counters []float64
	// Floors are the fleet's least backlogged counters by Class; +Inf when no replica has a
	// backlog in the class (or none said so lately).
	Floors [numClasses]float64
	// Queued are the requests of each of the exchange's flows, in its order, queued in the
	// fleet: the sum of the Queued the replicas sent lately, this exchange's included. Nil:
	// not known (Backlog then weighs each flow in full here).
	Queued []int
}

// MaxFleetFlows bounds the flows of one exchange, so one round trip stays small whatever the
// number of tenants; the flows left out wait for the next exchange and are ordered by the local
// counters meanwhile.
const MaxFleetFlows = 1024

// SyncFairShare exchanges this queue's fair-share charges with the fleet (Options.FairShare) and
// takes the fleet's counters back, so requests are then ordered by the fleet's service of each
// tenant, not this replica's alone, and a tenant that comes back from idle starts at the least
// counter backlogged anywhere in the fleet. The gateway calls it every few tens of
// milliseconds, off the admission path: the queue's lock is never held across the round trip,
// and charges made meanwhile are kept on top of the fleet's answer. When the exchange fails (Redis cut or slow), the charges are kept to be
// sent with the next one and the queue goes on with its own counters, which carry what it last
// read of the fleet; the first exchange that succeeds again rejoins the fleet. Without a store,
// or once the queue is closed, it does nothing and returns nil. Calls are serialized. Cost: one
// pass over the tenants, and one Exchange of at most MaxFleetFlows flows.
func (q *Queue) SyncFairShare(ctx context.Context) error {
	if q.fleet == nil || q.cfg.FIFO {
		return nil
	}
	q.syncMu.Lock()
	defer q.syncMu.Unlock()

	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil
	}
	ex := FairShareExchange{Model: q.model, Flows: q.syncCharges[:0]}
	flows := q.syncFlows[:0]
	for c := range q.classes {
		ex.Floors[c] = math.Inf(1)
		if q.classes[c].flows.len() > 0 {
			ex.Floors[c] = q.classes[c].flows.peek().fairShare
		}
	}
collect:
	for _, ten := range q.tenants {
		for _, f := range ten.flows {
			if f == nil || f.unsent == 0 && !f.lifted && f.idx < 0 {
				continue
			}
			if len(flows) == MaxFleetFlows {
				break collect
			}
			ex.Flows = append(ex.Flows, FlowCharge{Tenant: ten.name, Class: f.class, Charge: f.unsent,
				Lifted: f.lifted, Lift: f.liftBase, Queued: f.queued()})
			flows = append(flows, f)
			f.unsent, f.lifted, f.liftBase = 0, false, 0
		}
	}
	q.mu.Unlock()

	got, err := q.fleet.Exchange(ctx, ex)
	if err == nil && (len(got.Counters) != len(ex.Flows) || got.Queued != nil && len(got.Queued) != len(ex.Flows)) {
		err = fmt.Errorf("fleet answered %d counters and %d queued for %d flows", len(got.Counters), len(got.Queued), len(ex.Flows))
	}
	if err == nil {
		for _, v := range got.Counters {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				err = fmt.Errorf("fleet answered a counter of %v", v)
				break
			}
		}
	}

	q.mu.Lock()
	defer q.mu.Unlock()
	if err != nil {
		for i, f := range flows {
			f.unsend(ex.Flows[i])
		}
		for c := range q.classes {
			q.classes[c].fleetFloor = math.Inf(1)
		}
		for _, ten := range q.tenants {
			for _, f := range ten.flows {
				if f != nil {
					f.queuedElsewhere = 0
				}
			}
		}
	} else {
		for i, f := range flows {
			f.queuedElsewhere = 0
			if got.Queued != nil {
				f.queuedElsewhere = max(got.Queued[i]-ex.Flows[i].Queued, 0)
			}
			v := got.Counters[i]
			if f.lifted {
				v = max(v, f.liftBase)
			}
			f.fairShare = v + f.unsent
			if f.idx >= 0 {
				q.classes[f.class].flows.fix(f.idx)
			}
		}
		for c := range q.classes {
			q.classes[c].fleetFloor = got.Floors[c]
			if math.IsNaN(got.Floors[c]) || math.IsInf(got.Floors[c], -1) {
				q.classes[c].fleetFloor = math.Inf(1)
			}
		}
	}
	clear(ex.Flows)
	clear(flows)
	q.syncCharges, q.syncFlows = ex.Flows, flows
	if err != nil {
		q.m.exchanges[1].Inc()
		return fmt.Errorf("queue: fair share of %s: %w", q.model, err)
	}
	q.m.exchanges[0].Inc()
	return nil
}

// charge adds d to the flow's counter, and to what the fleet has still to be told.
func (f *flow) charge(d float64) {
	f.fairShare += d
	f.unsent += d
}

// lift raises a returning flow's counter to floor and, with a fleet, notes the lift for the next
// exchange, expressed before the charges not yet sent: the fleet's counter becomes
// max(counter, liftBase) + unsent. The lift is noted even when the counter was above the floor:
// the fleet's counter may have expired while the flow was idle, and must not restart below what
// this replica knew of it.
func (f *flow) lift(floor float64, fleet bool) {
	f.fairShare = max(f.fairShare, floor)
	if fleet {
		base := f.fairShare - f.unsent
		if !f.lifted || base > f.liftBase {
			f.liftBase = base
		}
		f.lifted = true
	}
}

// unsend puts back a batch the fleet did not take, before what was charged since: the batch's
// charge and lift come first, the later ones are re-expressed on top of its charge.
func (f *flow) unsend(c FlowCharge) {
	switch {
	case c.Lifted && f.lifted:
		f.liftBase = max(c.Lift, f.liftBase-c.Charge)
	case c.Lifted:
		f.liftBase, f.lifted = c.Lift, true
	case f.lifted:
		f.liftBase -= c.Charge
	}
	f.unsent += c.Charge
}
