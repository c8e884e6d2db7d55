package bench

import (
	"math"
	"math/rand/v2"
	"time"
)

// arrival is one request of the run: when it is sent, for whom, and what it asks.
type arrival struct {
	at     time.Duration // from the start of the run
	tenant int           // index into the run's tenants
	item   Item
}

// process is one Poisson arrival process of a schedule.
type process struct {
	rate    float64       // requests per second; +Inf sends at once
	tenants []int         // tenants it feeds
	cum     []float64     // their cumulative shares
	next    time.Duration // its next arrival
}

// schedule turns a workload into arrivals. For untimed workloads, tenants with their own rate
// each have their own Poisson process; the others share one process at the run's rate and each
// of its arrivals goes to one of them drawn by share (the same as a Poisson process per tenant
// at its share of the rate). The merged stream takes the workload's items in order. For timed
// workloads (traces) the items keep their times and each is given a tenant drawn by share.
// Arrivals never depend on responses: the loop is open. Used by one goroutine.
type schedule struct {
	wl    Workload
	rng   *rand.Rand
	procs []*process
	all   process // every tenant by share, for timed workloads
}

// newSchedule expects cfg with defaults applied.
func newSchedule(cfg Config, wl Workload) *schedule {
	s := &schedule{wl: wl, rng: seeded(cfg.Seed, saltArrivals)}
	pooled := &process{rate: cfg.Rate}
	for i, t := range cfg.Tenants {
		s.all.add(i, t.Share)
		if t.Rate > 0 {
			p := &process{rate: t.Rate}
			p.add(i, t.Share)
			s.procs = append(s.procs, p)
		} else {
			pooled.add(i, t.Share)
		}
	}
	if len(pooled.tenants) > 0 {
		s.procs = append(s.procs, pooled)
	}
	for _, p := range s.procs {
		p.next = s.gap(p)
	}
	return s
}

func (p *process) add(tenant int, share float64) {
	total := share
	if n := len(p.cum); n > 0 {
		total += p.cum[n-1]
	}
	p.tenants = append(p.tenants, tenant)
	p.cum = append(p.cum, total)
}

// gap draws the time to p's next arrival.
func (s *schedule) gap(p *process) time.Duration {
	if math.IsInf(p.rate, 1) {
		return 0
	}
	return time.Duration(s.rng.ExpFloat64() / p.rate * float64(time.Second))
}

// pick draws one of p's tenants with probability proportional to its share.
func (s *schedule) pick(p *process) int {
	if len(p.tenants) == 1 {
		return p.tenants[0]
	}
	x := s.rng.Float64() * p.cum[len(p.cum)-1]
	for i, c := range p.cum {
		if x < c {
			return p.tenants[i]
		}
	}
	return p.tenants[len(p.tenants)-1]
}

// next returns the next arrival in time order; false when the workload is exhausted.
func (s *schedule) next() (arrival, bool) {
	if s.wl.Timed() {
		it, ok := s.wl.Next()
		if !ok {
			return arrival{}, false
		}
		return arrival{at: it.At, tenant: s.pick(&s.all), item: it}, true
	}
	p := s.procs[0]
	for _, q := range s.procs[1:] {
		if q.next < p.next {
			p = q
		}
	}
	at := p.next
	p.next += s.gap(p)
	it, ok := s.wl.Next()
	if !ok {
		return arrival{}, false
	}
	return arrival{at: at, tenant: s.pick(p), item: it}, true
}
