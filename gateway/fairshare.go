package gateway

import (
	"context"
	"math"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/tenants"
)

// FairShare keeps the fair-share counters of a fleet of replicas; *tenants.FairShareCounters
// implements it over Redis.
type FairShare interface {
	// Exchange adds charges to the fleet's counters of model, sets this replica's floors (its
	// least backlogged counter by class, +Inf for none) and its queued requests of each flow
	// charged, and returns the fleet's counters (in the order of charges), floors (the least of
	// the replicas', +Inf for none) and queued requests of each flow, in one round trip.
	Exchange(ctx context.Context, model string, floors []float64, charges []tenants.FairShareCharge) (tenants.FairShareFleet, error)
}

// fairShareEvery is how often each queue exchanges its fair-share charges with the fleet: often
// enough that replicas agree on the order within a few dispatches, rarely enough that the Redis
// work is one small round trip per model every 50 ms, off the admission path.
const fairShareEvery = 50 * time.Millisecond

// fleetFairShare is a queue's FairShareStore over the gateway's FairShare.
type fleetFairShare struct{ fs FairShare }

var _ queue.FairShareStore = fleetFairShare{}

func (f fleetFairShare) Exchange(ctx context.Context, ex queue.FairShareExchange) (queue.FairShareCounts, error) {
	charges := make([]tenants.FairShareCharge, len(ex.Flows))
	for i, c := range ex.Flows {
		charges[i] = tenants.FairShareCharge{Tenant: c.Tenant, Class: int(c.Class), Charge: c.Charge, Lifted: c.Lifted, Lift: c.Lift,
			Queued: int64(c.Queued)}
	}
	fleet, err := f.fs.Exchange(ctx, ex.Model, ex.Floors[:], charges)
	if err != nil {
		return queue.FairShareCounts{}, err
	}
	got := queue.FairShareCounts{Counters: fleet.Counters}
	copy(got.Floors[:], fleet.Floors)
	if len(fleet.Queued) == len(charges) {
		got.Queued = make([]int, len(charges))
		for i, n := range fleet.Queued {
			got.Queued[i] = int(min(n, math.MaxInt32))
		}
	}
	return got, nil
}

// shareFairness exchanges every queue's fair-share charges with the fleet at once and then
// every fairShareEvery until ctx ends. It logs when the exchanges start failing (each queue
// then orders by its own counters) and when they succeed again. The dispatcher's run owns it.
func (d *dispatcher) shareFairness(ctx context.Context) {
	var qs []*queue.Queue
	d.exchangeWithFleet(ctx, fairShareEvery, "fair share shared with the fleet failed; each queue orders by its own counters until it succeeds",
		"fair share shared with the fleet again", func(ctx context.Context) error {
			d.mu.Lock()
			qs = qs[:0]
			for _, q := range d.queues {
				qs = append(qs, q)
			}
			d.mu.Unlock()
			var firstErr error
			for _, q := range qs {
				if err := q.SyncFairShare(ctx); err != nil && firstErr == nil {
					firstErr = err
				}
			}
			clear(qs)
			return firstErr
		})
}
