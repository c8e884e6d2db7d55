package gateway

import (
	"context"
	"time"

	"github.com/usherllm/usher/routing"
)

// sharesEvery is how often this replica exchanges its demand on each worker with the fleet and
// takes its shares back (routing.Pool.SyncShares): one small round trip every 50 ms, beside the
// fair-share exchange, off the admission path.
const sharesEvery = 50 * time.Millisecond

// shareWorkers exchanges this replica's demand on the workers with the fleet at once and then
// every sharesEvery until ctx ends: its demand on a model is what the model's queue holds. It
// logs when the exchanges start failing (each worker's share then stays within its last grant
// and 1/n of its limit) and when they succeed again. The dispatcher's run owns it.
func (d *dispatcher) shareWorkers(ctx context.Context) {
	backlog := map[string]routing.ModelBacklog{}
	demand := func(model string) routing.ModelBacklog { return backlog[model] }
	d.exchangeWithFleet(ctx, sharesEvery, "worker shares exchanged with the fleet failed; each worker's share stays within its last grant and 1/n of its limit until it succeeds",
		"worker shares exchanged with the fleet again", func(ctx context.Context) error {
			clear(backlog)
			d.mu.Lock()
			for model, q := range d.queues {
				b := q.Backlog()
				backlog[model] = routing.ModelBacklog{Interactive: int64(b.Interactive), All: int64(b.All),
					InteractiveWeight: b.InteractiveWeight, Weight: b.Weight}
			}
			d.mu.Unlock()
			return d.pool.SyncShares(ctx, demand)
		})
}

// exchangeWithFleet runs exchange at once and then every interval until ctx ends: one of this
// replica's exchanges with the fleet through Redis. It logs failed (a warning, with the error)
// when the exchanges start failing and back when one succeeds again, not each one; an exchange
// that ctx's end cut short is not logged. Its caller owns it.
func (d *dispatcher) exchangeWithFleet(ctx context.Context, interval time.Duration, failed, back string, exchange func(context.Context) error) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	failing := false
	for {
		err := exchange(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && !failing:
			d.opts.Logger.Warn(failed, "err", err)
		case err == nil && failing:
			d.opts.Logger.Info(back)
		}
		failing = err != nil
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
