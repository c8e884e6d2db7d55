package queue

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// outcome labels of usher_queue_shed_total: the four Rejection reasons, then the three ways a
// queued request leaves without being dispatched.
const (
	shedDeadlineExceeded = Shutdown + 1 + iota
	shedCanceled
	shedUnplaceable // its Placer found it can never be placed
	numShed
)

var shedNames = [numShed]string{"", "queue_full", "deadline_unreachable", "request_too_large", "shutdown",
	"deadline_exceeded", "canceled", "unplaceable"}

// metrics are the queue's Prometheus series. Children are resolved once in newMetrics so that
// the dispatch path only touches atomics and never allocates.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	depth      [numClasses]prometheus.Gauge
	wait       [numClasses]prometheus.Observer
	dispatched [numClasses]prometheus.Counter
	requeued   [numClasses]prometheus.Counter
	late       [numClasses]prometheus.Counter
	shed       [numClasses][numShed]prometheus.Counter
	served     *prometheus.CounterVec
	// exchanges counts SyncFairShare's exchanges with the fleet: [0] answered, [1] failed.
	exchanges [2]prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, model string) (*metrics, error) {
	labels := prometheus.Labels{"model": model}
	depth := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "usher_queue_depth", ConstLabels: labels,
		Help: "Requests waiting in the queue, by class.",
	}, []string{"class"})
	wait := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "usher_queue_wait_seconds", ConstLabels: labels,
		Help:    "Time from enqueue to dispatch of dispatched requests, by class.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
	}, []string{"class"})
	dispatched := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_dispatched_total", ConstLabels: labels,
		Help: "Requests released to a worker, by class.",
	}, []string{"class"})
	requeued := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_requeued_total", ConstLabels: labels,
		Help: "Dispatched requests put back in the queue (preempted before their answer began, or sent again after a failed attempt), by class.",
	}, []string{"class"})
	late := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_late_total", ConstLabels: labels,
		Help: "Requests found past their due while queued (the last moment their dispatch could meet their TTFT objective), and so served after their tenant's requests that were not, by class: a queue past its model's capacity.",
	}, []string{"class"})
	shed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_shed_total", ConstLabels: labels,
		Help: "Requests that left without dispatch, by class and reason.",
	}, []string{"class", "reason"})
	served := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_tokens_served_total", ConstLabels: labels,
		Help: "Tokens (prompt + completion) served, by tenant, as reported at the end of each request.",
	}, []string{"tenant"})

	exchanges := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_queue_fair_share_exchanges_total", ConstLabels: labels,
		Help: "Exchanges of the fair-share counters with the fleet (Redis), by result: ok, or failed (the queue ordered by its own counters until the next ok).",
	}, []string{"result"})
	m := &metrics{reg: reg, served: served,
		collectors: []prometheus.Collector{depth, wait, dispatched, requeued, late, shed, served, exchanges}}
	m.exchanges[0] = exchanges.WithLabelValues("ok")
	m.exchanges[1] = exchanges.WithLabelValues("failed")
	for _, c := range allClasses {
		m.depth[c] = depth.WithLabelValues(c.String())
		m.wait[c] = wait.WithLabelValues(c.String())
		m.dispatched[c] = dispatched.WithLabelValues(c.String())
		m.requeued[c] = requeued.WithLabelValues(c.String())
		m.late[c] = late.WithLabelValues(c.String())
		for r := QueueFull; r < numShed; r++ {
			m.shed[c][r] = shed.WithLabelValues(c.String(), shedNames[r])
		}
	}
	if reg == nil {
		return m, nil
	}
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, done := range m.collectors[:i] {
				reg.Unregister(done)
			}
			return nil, fmt.Errorf("register queue metrics for model %q: %w", model, err)
		}
	}
	return m, nil
}

// unregister removes the series, so that a queue for the same model can be made again.
func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
