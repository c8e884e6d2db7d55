package routing

import "context"

func init() {
	registerPolicy("least_request", func(env policyEnv) (Policy, error) { return &LeastRequest{rand: env.rand}, nil })
}

// LeastRequest picks the eligible worker with the fewest requests in flight from this gateway;
// ties go to whichever the scan, starting at a random worker, meets first, so idle workers share
// the load. It has no parameters. Safe for concurrent use; a pick scans every worker once.
type LeastRequest struct {
	rand randSource
}

var _ Policy = (*LeastRequest)(nil)

// Pick implements Policy.
func (p *LeastRequest) Pick(_ context.Context, r choice, workers []*Worker) (*Worker, Route) {
	n := len(workers)
	if n == 0 {
		return nil, RouteLeastRequest
	}
	var best *Worker
	var bestLoad int64
	start := intN(p.rand, n)
	for i := range n {
		w := workers[(start+i)%n]
		if load := w.InFlight(); (best == nil || load < bestLoad) && r.Eligible(w) {
			best, bestLoad = w, load
		}
	}
	return best, RouteLeastRequest
}
