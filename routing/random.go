package routing

import "context"

func init() {
	registerPolicy("random", func(env policyEnv) (Policy, error) { return &Random{rand: env.rand}, nil })
}

// randomProbes is how many uniform draws Random tries before it scans the fleet.
const randomProbes = 4

// Random picks uniformly among the eligible workers. It has no parameters. Safe for concurrent
// use; a pick costs a few random draws, or one scan of the workers when most are ineligible.
type Random struct {
	rand randSource
}

var _ Policy = (*Random)(nil)

// Pick implements Policy.
func (p *Random) Pick(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	return pickRandom(p.rand, r, workers), RouteRandom
}

// pickRandom returns a uniformly chosen eligible worker, or nil. Rejection sampling keeps the
// common case O(1); when it misses, reservoir sampling over the eligible ones stays uniform.
func pickRandom(rnd randSource, r choice, workers []*Worker) *Worker {
	n := len(workers)
	if n == 0 {
		return nil
	}
	for range randomProbes {
		if w := workers[intN(rnd, n)]; r.Eligible(w) {
			return w
		}
	}
	var chosen *Worker
	seen := 0
	for _, w := range workers {
		if !r.Eligible(w) {
			continue
		}
		seen++
		if intN(rnd, seen) == 0 {
			chosen = w
		}
	}
	return chosen
}
