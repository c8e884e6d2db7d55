package gateway

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// Windows of the overview: rates over the last rateWindow, latency percentiles and shed rates
// over the last trafficWindow.
const (
	rateWindow    = 10 * time.Second
	trafficWindow = 60 * time.Second
	// trafficSlots is one slot per second of trafficWindow.
	trafficSlots = int(trafficWindow / time.Second)
	// maxTTFTPerSlot bounds the samples kept per class and second; beyond it the slot keeps the
	// first ones, so percentiles under heavy load come from a prefix of each second.
	maxTTFTPerSlot = 512
)

// classes lists every class, highest priority first.
var classes = []queue.Class{queue.Interactive, queue.Standard, queue.Batch}

// traffic counts the requests of the last minute by class and second: how many, how many were
// shed, and their times to first token. Safe for concurrent use; observe costs one mutex and an
// append.
type traffic struct {
	now func() time.Time
	mu  sync.Mutex // guards slots
	// slots[class][unix second % trafficSlots]
	slots [3][trafficSlots]trafficSlot
}

type trafficSlot struct {
	sec            int64 // the unix second the slot counts; a slot of another second is stale
	requests, shed int
	ttft           []time.Duration
}

// shed reports whether status refuses a request for want of capacity: a full queue or rate
// limit (429) or no capacity, a missed deadline or shutdown (503).
func shed(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable
}

// observe counts one request of class that ended with status; ttft 0 means no byte was sent.
func (t *traffic) observe(class queue.Class, status int, ttft time.Duration) {
	if int(class) >= len(t.slots) {
		return
	}
	sec := t.now().Unix()
	t.mu.Lock()
	defer t.mu.Unlock()
	sl := &t.slots[class][sec%int64(trafficSlots)]
	if sl.sec != sec {
		*sl = trafficSlot{sec: sec, ttft: sl.ttft[:0]}
	}
	sl.requests++
	if shed(status) {
		sl.shed++
	}
	if ttft > 0 && len(sl.ttft) < maxTTFTPerSlot {
		sl.ttft = append(sl.ttft, ttft)
	}
}

// classTraffic is one class's figures over the windows.
type classTraffic struct {
	rate     float64 // requests per second over rateWindow
	ttft     []time.Duration
	requests int
	shed     int
}

func (t *traffic) class(class queue.Class) classTraffic {
	now := t.now().Unix()
	var out classTraffic
	t.mu.Lock()
	defer t.mu.Unlock()
	var recent int
	for i := range t.slots[class] {
		sl := &t.slots[class][i]
		age := now - sl.sec
		if age < 0 || age >= int64(trafficSlots) {
			continue
		}
		out.requests += sl.requests
		out.shed += sl.shed
		out.ttft = append(out.ttft, sl.ttft...)
		// The current second is still filling: the rate counts the whole seconds before it.
		if age >= 1 && age <= int64(rateWindow/time.Second) {
			recent += sl.requests
		}
	}
	out.rate = float64(recent) / rateWindow.Seconds()
	return out
}

// percentile returns the p-quantile (0 < p <= 1) of sorted by the nearest-rank method; 0 for
// no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(rank, len(sorted)-1))]
}

// Overview is the fleet at a glance: the console's first page and GET /admin/api/v1/overview.
type Overview struct {
	At time.Time `json:"at"`
	// RequestsPerSecond is over the last 10 s, all classes.
	RequestsPerSecond float64         `json:"requests_per_second"`
	Classes           []ClassOverview `json:"classes"`
	// Workers counts the workers in each state; every state is present.
	Workers     map[routing.WorkerState]int `json:"workers"`
	WorkerCount int                         `json:"worker_count"`
	// DeadlineMisses sums the requests whose deadline passed while queued, since start.
	DeadlineMisses int64 `json:"deadline_misses"`
}

// ClassOverview is one class in an Overview. Latencies and shed rate are over the last 60 s,
// the rate over the last 10 s, the queue is now (all models).
type ClassOverview struct {
	Class             queue.Class `json:"class"`
	RequestsPerSecond float64     `json:"requests_per_second"`
	TTFTP50Seconds    float64     `json:"ttft_p50_seconds"`
	TTFTP99Seconds    float64     `json:"ttft_p99_seconds"`
	// ShedRate is the fraction of the class's requests refused with 429 or 503.
	ShedRate          float64 `json:"shed_rate"`
	Requests          int     `json:"requests"`
	Queued            int     `json:"queued"`
	InFlight          int     `json:"in_flight"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// overview gathers the Overview. Cost: one queue snapshot per model and a sort of the last
// minute's latency samples.
func (s *Server) overview() (Overview, error) {
	o := Overview{At: s.now(), Workers: map[routing.WorkerState]int{}}
	for _, st := range []routing.WorkerState{routing.StateHealthy, routing.StateUnhealthy, routing.StateCircuitOpen, routing.StateDraining, routing.StateDrained} {
		o.Workers[st] = 0
	}
	for _, w := range s.pool.Workers() {
		o.Workers[w.State]++
		o.WorkerCount++
	}
	byClass := make([]ClassOverview, len(classes))
	for i, cl := range classes {
		tr := s.traffic.class(cl)
		slices.Sort(tr.ttft)
		co := ClassOverview{Class: cl, RequestsPerSecond: tr.rate, Requests: tr.requests,
			TTFTP50Seconds: percentile(tr.ttft, 0.5).Seconds(), TTFTP99Seconds: percentile(tr.ttft, 0.99).Seconds()}
		if tr.requests > 0 {
			co.ShedRate = float64(tr.shed) / float64(tr.requests)
		}
		o.RequestsPerSecond += tr.rate
		byClass[i] = co
	}
	for _, model := range s.pool.Models() {
		q, err := s.dispatcher.queueFor(model)
		if err != nil {
			return Overview{}, err
		}
		snap := q.Snapshot()
		o.DeadlineMisses += snap.DeadlineMisses
		for _, cs := range snap.Classes {
			if int(cs.Class) >= len(byClass) {
				continue
			}
			co := &byClass[cs.Class]
			co.Queued += cs.Queued
			co.InFlight += cs.InFlight
			co.OldestWaitSeconds = max(co.OldestWaitSeconds, cs.OldestWait.Seconds())
		}
	}
	o.Classes = byClass
	return o, nil
}

func (s *Server) overviewAPI(c echo.Context) error {
	o, err := s.overview()
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, o)
}
