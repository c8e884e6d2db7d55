package routing

import (
	"context"
	"sync/atomic"
)

func init() {
	registerPolicy("round_robin", func(policyEnv) (Policy, error) { return &RoundRobin{}, nil })
}

// RoundRobin picks the workers in turn, skipping those not eligible. It has no parameters. The
// zero value is ready; safe for concurrent use; a pick costs one atomic add plus a scan over the
// ineligible workers it skips.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Policy = (*RoundRobin)(nil)

// Pick implements Policy.
func (p *RoundRobin) Pick(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	n := len(workers)
	if n == 0 {
		return nil, RouteRoundRobin
	}
	start := int((p.next.Add(1) - 1) % uint64(n))
	for i := range n {
		if w := workers[(start+i)%n]; r.Eligible(w) {
			return w, RouteRoundRobin
		}
	}
	return nil, RouteRoundRobin
}
