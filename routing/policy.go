package routing

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"
)

// Route says why a worker was picked; it is the value of the X-Usher-Route response header and a
// label of the decision metrics.
type Route string

// Routes of the policies of this package.
const (
	RouteRoundRobin   Route = "round_robin"   // next worker in turn
	RouteRandom       Route = "random"        // uniform choice
	RouteLeastRequest Route = "least_request" // fewest requests in flight
	RouteTarget       Route = "target"        // the worker named by Request.TargetWorker
)

// Policy picks a worker for a request among the workers that serve its model.
//
// r is the request as this pick sees it (see choice): a policy must skip every worker for which
// r.Eligible is false, and works from r.Prepared instead of doing I/O. workers is the model's
// shared, immutable snapshot: a policy must not modify it or keep it past the call. Pick returns
// nil when no worker is eligible, with any Route. Pick is called concurrently and must be safe
// for it; it does no I/O, modifies neither r nor its Request, and its cost must not grow with a
// copy of the fleet per request.
type Policy interface {
	Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route)
}

// workersObserver is implemented by policies that keep state per worker (rings, trees, ranges).
// The pool calls WorkersChanged with the model's new worker snapshot (nil when the model lost its
// last worker) after every membership change, under its write lock and before Pick can see the
// new snapshot. Picks on the old snapshot may still run concurrently.
type workersObserver interface {
	WorkersChanged(workers []*Worker)
}

// policyRunner is implemented by policies with background work (eviction, periodic re-cuts).
// Pool.Run runs it in a goroutine it owns; Run must return soon after ctx ends.
type policyRunner interface {
	Run(ctx context.Context)
}

// policyEnv is what the pool hands every policy it builds.
type policyEnv struct {
	model    string
	cfg      ModelConfig // with the pool's defaults applied
	now      func() time.Time
	rand     randSource
	logger   *slog.Logger
	maxAge   time.Duration // of a worker's load report (ScrapeConfig.MaxAge)
	pins     PinStore
	prefixes PrefixFeed // nil: no other replica to share with
	metrics  *poolMetrics
	scope    CacheScope // Config.CacheScope
}

// policyConstructor builds the policy of one model.
type policyConstructor func(env policyEnv) (Policy, error)

// policyConstructors maps a policy name to its constructor. Each policy file registers itself in
// an init function; the map is never written after package initialisation.
var policyConstructors = map[string]policyConstructor{}

func registerPolicy(name string, c policyConstructor) {
	if _, dup := policyConstructors[name]; dup {
		panic("routing: policy " + name + " registered twice")
	}
	policyConstructors[name] = c
}

func knownPolicy(name string) bool {
	_, ok := policyConstructors[name]
	return ok
}

func policyNames() string {
	names := make([]string, 0, len(policyConstructors))
	for n := range policyConstructors {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

func newPolicy(name string, env policyEnv) (Policy, error) {
	c, ok := policyConstructors[name]
	if !ok {
		return nil, fmt.Errorf("unknown policy %q (known: %s)", name, policyNames())
	}
	return c(env)
}

// mayWaitFor reports whether r may get w by waiting for a slot there: w takes requests and r
// has not already failed on it, so it can only be full.
func (r *Request) mayWaitFor(w *Worker) bool {
	return w.takesRequests() && !slices.Contains(r.Exclude, w.spec.ID)
}

// Eligible reports whether w may take r now, whatever the pick: healthy, not draining, circuit not
// open, not in r.Exclude, below its request cap (its limit, or this replica's share of it in a
// fleet: see ShareStore, with the room this replica holds of the fleet's interactive reserve for an
// interactive request), and with room for r.Tokens under its token cap (likewise this replica's
// part of it in a fleet; an idle worker takes a request of any size). The protections of one pick
// filter further (see choice.Eligible, which every policy filters with). It costs a few atomic
// loads plus a scan of r.Exclude (and a clock read while the worker's circuit is open); it modifies
// nothing.
func (r *Request) Eligible(w *Worker) bool {
	if !w.takesRequests() {
		return false
	}
	if requests, tokens, _ := r.shortfall(w); requests > 0 || tokens > 0 {
		return false
	}
	return !slices.Contains(r.Exclude, w.spec.ID)
}

// shortfall is Eligible's room test: how many of the requests and tokens in flight on w would
// have to end before r fits there (both 0: it fits), and the requests in flight, n. In requests,
// those beyond w's request cap less one; in tokens, those in flight plus r's beyond its token cap,
// none while w is idle (it takes a request of any size). Cost: up to six atomic loads.
func (r *Request) shortfall(w *Worker) (requests, tokens, n int64) {
	n = w.inFlight.Load()
	requests = max(n+1-w.capacityFor(r.Interactive), 0)
	if n > 0 {
		tokens = max(w.inFlightTokens.Load()+int64(r.Tokens)-w.tokenCapacityFor(r.Interactive), 0)
	}
	return requests, tokens, n
}
