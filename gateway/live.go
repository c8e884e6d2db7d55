package gateway

import (
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/usherllm/usher/queue"
)

// What the data plane shows of itself, live: the admin plane (package adminui) reads the
// admission queues and the last minute's traffic per class through these methods, and tells the
// data plane when it changed the fleet.

// QueueSnapshot is the admission queue of model as it is now. Like a request of the model, it
// creates the queue on first use; after StopAdmitting it fails with a queue.Shutdown rejection.
// Safe for concurrent use; costs one queue lock.
func (s *Server) QueueSnapshot(model string) (queue.Snapshot, error) {
	q, err := s.dispatcher.queueFor(model)
	if err != nil {
		return queue.Snapshot{}, err
	}
	return q.Snapshot(), nil
}

// Traffic is the requests of class over the last minute. Safe for concurrent use; costs one
// copy and sort of the minute's TTFT samples of the class.
func (s *Server) Traffic(class queue.Class) ClassTraffic {
	tr := s.traffic.class(class)
	slices.Sort(tr.ttft)
	return ClassTraffic{RequestsPerSecond: tr.rate, Requests: tr.requests, Shed: tr.shed,
		TTFTP50: percentile(tr.ttft, 0.5), TTFTP99: percentile(tr.ttft, 0.99)}
}

// FleetChanged makes the admission queues' capacity follow the workers at once, in the caller's
// goroutine, without waiting for Run to see the pool's Changes (or when Run is not running). The
// admin plane calls it after it adds, removes, drains or undrains a worker.
func (s *Server) FleetChanged() { s.dispatcher.refresh() }

// ForgetTenant drops what the data plane keeps of a deleted tenant: its fair-share state and its
// usher_queue_tokens_served_total series in every model's queue (see queue.Queue.ForgetTenant)
// and its usher_objective_* series,
// so that tenants coming and going do not grow memory or the metrics. serve calls it from the
// tenant directory's reloads (tenants.DirectoryOptions.TenantRemoved). Safe for concurrent use.
func (s *Server) ForgetTenant(id string) {
	d := s.dispatcher
	d.mu.Lock()
	queues := slices.Collect(maps.Values(d.queues))
	d.mu.Unlock()
	for _, q := range queues {
		q.ForgetTenant(id)
	}
	s.metrics.attainment.forget(id)
}

// ClassTraffic is one class's requests as the data plane counted them.
type ClassTraffic struct {
	// RequestsPerSecond is over the last 10 s (the whole seconds before the current one).
	RequestsPerSecond float64
	// Requests and Shed count the last 60 s; Shed are those refused with 429 or 503.
	Requests, Shed int
	// TTFTP50 and TTFTP99 are the times to first byte over the last 60 s; 0 without samples.
	TTFTP50, TTFTP99 time.Duration
}

// Windows of the traffic counts: rates over the last rateWindow, latency percentiles and shed
// counts over the last trafficWindow.
const (
	rateWindow    = 10 * time.Second
	trafficWindow = 60 * time.Second
	// trafficSlots is one slot per second of trafficWindow.
	trafficSlots = int(trafficWindow / time.Second)
	// maxTTFTPerSlot bounds the samples kept per class and second; beyond it the slot keeps the
	// first ones, so percentiles under heavy load come from a prefix of each second.
	maxTTFTPerSlot = 512
)

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
	var out classTraffic
	if int(class) >= len(t.slots) {
		return out
	}
	now := t.now().Unix()
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
