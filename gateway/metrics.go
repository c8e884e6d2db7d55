package gateway

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/routing"
)

// metrics are the data plane's Prometheus series.
type metrics struct {
	requests *prometheus.CounterVec   // model, status
	duration *prometheus.HistogramVec // model
	ttft     *prometheus.HistogramVec // model, class
	tokens   *prometheus.CounterVec   // model, kind (prompt, completion, cached)
	retries  *prometheus.CounterVec   // model
	// preempted counts standard and batch calls that gave their capacity to an interactive
	// request, by model, class and stage: "sent" (their attempt was cancelled at its worker; the
	// only stage since a call waits only in the queue, where it holds nothing).
	preempted *prometheus.CounterVec
	// prefillPieces counts the leading pieces of standard and batch prompts sent ahead of their
	// request (see prefill.go).
	prefillPieces *prometheus.CounterVec
	// stageDuration and stageRequests are the stages of two-staged calls (disagg.go) by model,
	// stage (prefill; decode: the KV transfer and the decode) and worker; the requests by
	// result too (see stageResult).
	stageDuration *prometheus.HistogramVec
	stageRequests *prometheus.CounterVec
	// overhead is the time a call spent in usher itself: its whole time less its wait in the
	// queue and its time at the workers.
	overhead prometheus.Histogram
	// attainment counts the calls' verdicts against their objectives (objective.go).
	attainment *attainment
	// children caches the data plane's series; their labels come from the config (a model no
	// worker serves is labelled unservedModel, see Server.modelLabel), never from what a client
	// sends, so the cache is bounded as the series are.
	children children
}

// children caches children of the data plane's metric vectors by their label values: a call
// looks each of its series up in one Go map instead of having the vector validate and hash its
// labels (about a microsecond a series, nine series a call). A child is created, as by
// WithLabelValues, the first time it is used. Safe for concurrent use.
type children struct {
	mu sync.RWMutex // guards m
	m  map[childKey]prometheus.Metric
}

// childKey is a vector (its position in vecs) and the label values of one of its children.
type childKey struct {
	vec    uint8
	labels [5]string
}

// The vectors children caches.
const (
	vecRequests uint8 = iota
	vecDuration
	vecTTFT
	vecTokens
	vecStageDuration
	vecStageRequests
	vecObjectiveTTFT
	vecObjectiveTPOT
	vecObjectiveRequests
)

// get returns the child of k, creating it with vec's WithLabelValues (n labels) the first time.
func (c *children) get(k childKey, n int, with func(...string) prometheus.Metric) prometheus.Metric {
	c.mu.RLock()
	m, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return m
	}
	labels := make([]string, n)
	copy(labels, k.labels[:n])
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.m[k]; ok {
		return m
	}
	if c.m == nil {
		c.m = map[childKey]prometheus.Metric{}
	}
	m = with(labels...)
	c.m[k] = m
	return m
}

// counter is the child of the counter vector vec (at position id) with labels l, cached.
func (c *children) counter(vec *prometheus.CounterVec, id uint8, l ...string) prometheus.Counter {
	k := childKey{vec: id}
	n := copy(k.labels[:], l)
	return c.get(k, n, func(lv ...string) prometheus.Metric { return vec.WithLabelValues(lv...) }).(prometheus.Counter)
}

// observer is counter for a histogram vector.
func (c *children) observer(vec *prometheus.HistogramVec, id uint8, l ...string) prometheus.Observer {
	k := childKey{vec: id}
	n := copy(k.labels[:], l)
	return c.get(k, n, func(lv ...string) prometheus.Metric { return vec.WithLabelValues(lv...).(prometheus.Histogram) }).(prometheus.Observer)
}

// forget drops the cached children of the vectors from vec on whose label at position i is v
// (their series are being deleted).
func (c *children) forget(vec uint8, i int, v string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k.vec >= vec && k.labels[i] == v {
			delete(c.m, k)
		}
	}
}

// statusLabels are the status label values of 100 to 599, so that a label costs no formatting.
var statusLabels = func() (l [500]string) {
	for i := range l {
		l[i] = strconv.Itoa(100 + i)
	}
	return l
}()

// statusLabel is status as the requests series labels it.
func statusLabel(status int) string {
	if status >= 100 && status < 600 {
		return statusLabels[status-100]
	}
	return strconv.Itoa(status)
}

var latencyBuckets = []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_requests_total", Help: "Inference requests by model and HTTP status."},
			[]string{"model", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_request_duration_seconds", Help: "Time from arrival to the last byte sent.",
			Buckets: latencyBuckets}, []string{"model"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_time_to_first_token_seconds", Help: "Time from arrival to the first byte of the answer sent to the client.",
			Buckets: latencyBuckets}, []string{"model", "class"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_tokens_total", Help: "Tokens served as reported by workers, by kind (prompt, completion, cached)."},
			[]string{"model", "kind"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_upstream_retries_total", Help: "Requests sent to another worker after a failure before the first byte."},
			[]string{"model"}),
		prefillPieces: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_prefill_pieces_total", Help: "Leading pieces of standard and batch prompts sent to a worker ahead of their request while interactive requests were present, so that no engine step prefills a whole long prompt (routing.concurrency.prefill_piece_tokens)."},
			[]string{"model"}),
		preempted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_preempted_total", Help: "Standard and batch requests that gave their capacity to an interactive request and were requeued: stage \"sent\": their attempt was cancelled at its worker before their answer began (the engine's work so far is lost)."},
			[]string{"model", "class", "stage"}),
		stageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_stage_duration_seconds", Help: "Time of each stage of requests served disaggregated, by model, stage (prefill: from sending to the prefill worker's answer; decode: from sending to the decode worker to the answer's end, the KV transfer included) and worker.",
			Buckets: latencyBuckets}, []string{"model", "stage", "worker"}),
		stageRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_stage_requests_total", Help: "Stages of requests served disaggregated, by model, stage (prefill, decode), worker and result (ok; failed: before the worker answered, tried again; refused: the engine answered 4xx, relayed to the client; preempted; cancelled: the client left)."},
			[]string{"model", "stage", "worker", "result"}),
	}
	m.overhead = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "usher_gateway_overhead_seconds",
		Help:    "Time an inference request spent in usher itself: from arrival to its answer's end, less its wait in the queue and its time at the workers (from sending to the answer's last byte).",
		Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3}})
	m.attainment = newAttainment(&m.children)
	for _, c := range append([]prometheus.Collector{m.requests, m.duration, m.ttft, m.tokens, m.retries, m.preempted, m.prefillPieces, m.overhead,
		m.stageDuration, m.stageRequests},
		m.attainment.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// stage counts one stage of a two-staged call on worker, with its result and how long it took.
// The worker label is the pool's own ID, so the series are bounded by the fleet.
func (m *metrics) stage(model string, st routing.Stage, worker, result string, took time.Duration) {
	stage := st.String()
	m.children.observer(m.stageDuration, vecStageDuration, model, stage, worker).Observe(took.Seconds())
	m.children.counter(m.stageRequests, vecStageRequests, model, stage, worker, result).Inc()
}
