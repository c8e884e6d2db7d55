package routing

import (
	"context"
	"time"
)

func init() {
	registerPolicy("power_of_two", func(env policyEnv) (Policy, error) {
		return &PowerOfTwo{rand: env.rand, now: env.now, maxAge: env.maxAge}, nil
	})
}

// RoutePowerOfTwo: the lighter of two random workers.
const RoutePowerOfTwo Route = "power_of_two"

// PowerOfTwo draws two eligible workers at random and picks the lighter: fewer tokens in flight
// from this gateway plus the queue the worker itself reports, each queued request weighed as one
// average request slot (MaxTokensInFlight / MaxConcurrency tokens). A stale report counts as a full
// queue. It has no parameters. Safe for concurrent use; a pick costs a few random draws and one
// clock read.
type PowerOfTwo struct {
	rand   randSource
	now    func() time.Time
	maxAge time.Duration // of a worker's load report (ScrapeConfig.MaxAge)
}

var _ Policy = (*PowerOfTwo)(nil)

// Pick implements Policy.
func (p *PowerOfTwo) Pick(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	a := pickRandom(p.rand, r, workers)
	if a == nil {
		return nil, RoutePowerOfTwo
	}
	b := p.second(r, workers, a)
	if b == nil {
		return a, RoutePowerOfTwo
	}
	now := p.now()
	if p.score(b, now) < p.score(a, now) {
		return b, RoutePowerOfTwo
	}
	return a, RoutePowerOfTwo
}

// second draws an eligible worker other than a: a few random probes, then a scan from a random
// start (which small or mostly ineligible fleets need).
func (p *PowerOfTwo) second(r choice, workers []*Worker, a *Worker) *Worker {
	n := len(workers)
	for range randomProbes {
		if w := workers[intN(p.rand, n)]; w != a && r.Eligible(w) {
			return w
		}
	}
	start := intN(p.rand, n)
	for i := range n {
		if w := workers[(start+i)%n]; w != a && r.Eligible(w) {
			return w
		}
	}
	return nil
}

func (p *PowerOfTwo) score(w *Worker, now time.Time) int64 {
	return w.InFlightTokens() + w.ReportedQueue(now, p.maxAge)*(w.tokenLimit.Load()/max(1, w.limit.Load()))
}
