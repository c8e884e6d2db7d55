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

// schedule turns a workload into arrivals. For untimed workloads each tenant has its own
// Poisson process, at its own rate or at its share of the run's rate, and the merged stream
// takes the workload's items in order. For timed workloads (traces) the items keep their times
// and each is given a tenant drawn by share. Arrivals never depend on responses: the loop is
// open. Used by one goroutine.
type schedule struct {
	wl      Workload
	rng     *rand.Rand
	rates   []float64       // per tenant, requests per second; +Inf sends at once
	nextAt  []time.Duration // per tenant, next Poisson arrival
	weights []float64       // cumulative shares, for timed workloads
}

// newSchedule expects cfg with defaults applied.
func newSchedule(cfg Config, wl Workload) *schedule {
	s := &schedule{wl: wl, rng: seeded(cfg.Seed, saltArrivals)}
	var pooled float64
	for _, t := range cfg.Tenants {
		if t.Rate == 0 {
			pooled += t.Share
		}
	}
	var cum float64
	for _, t := range cfg.Tenants {
		cum += t.Share
		s.weights = append(s.weights, cum)
		r := t.Rate
		if r == 0 {
			r = cfg.Rate * t.Share / pooled
		}
		s.rates = append(s.rates, r)
	}
	if !wl.Timed() {
		s.nextAt = make([]time.Duration, len(s.rates))
		for i := range s.nextAt {
			s.nextAt[i] = s.gap(i)
		}
	}
	return s
}

// gap draws the time to tenant i's next Poisson arrival.
func (s *schedule) gap(i int) time.Duration {
	if math.IsInf(s.rates[i], 1) {
		return 0
	}
	return time.Duration(s.rng.ExpFloat64() / s.rates[i] * float64(time.Second))
}

// next returns the next arrival in time order; false when the workload is exhausted.
func (s *schedule) next() (arrival, bool) {
	if s.wl.Timed() {
		it, ok := s.wl.Next()
		if !ok {
			return arrival{}, false
		}
		return arrival{at: it.At, tenant: s.byShare(), item: it}, true
	}
	t := 0
	for i := range s.nextAt {
		if s.nextAt[i] < s.nextAt[t] {
			t = i
		}
	}
	at := s.nextAt[t]
	s.nextAt[t] += s.gap(t)
	it, ok := s.wl.Next()
	if !ok {
		return arrival{}, false
	}
	return arrival{at: at, tenant: t, item: it}, true
}

// byShare draws a tenant with probability proportional to its share.
func (s *schedule) byShare() int {
	x := s.rng.Float64() * s.weights[len(s.weights)-1]
	for i, w := range s.weights {
		if x < w {
			return i
		}
	}
	return len(s.weights) - 1
}
