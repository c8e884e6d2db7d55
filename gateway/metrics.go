package gateway

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/queue"
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
	// overhead is the time a call spent in usher itself: its whole time less its wait in the
	// queue and its time at the workers.
	overhead prometheus.Histogram
	// stageDuration and stageRequests are the stages of two-staged calls (disagg.go) by model,
	// stage (prefill; decode: the KV transfer and the decode) and worker; the requests by
	// result too (see stageResult).
	stageDuration *prometheus.HistogramVec
	stageRequests *prometheus.CounterVec
	// partDuration is where the time of two-staged calls answered went, by model and part (queue,
	// prefill, decode_first, decode: see disagg.go).
	partDuration *prometheus.HistogramVec
	// attainment counts the calls' verdicts against their objectives (objective.go).
	attainment *attainment

	// models caches the series of each served model (modelSeries); their labels come from the
	// config (a model no worker serves is labelled unservedModel, see Server.modelLabel), never
	// from what a client sends, so the cache is bounded as the series are.
	modelsMu sync.RWMutex // guards models
	models   map[string]*modelSeries
}

// modelSeries are the children of the data plane's vectors for one model label, each created,
// as by WithLabelValues, the first time it is used: a call finds them all with one lookup of its
// model (metrics.of) instead of a label validation and hash of every label of each of its series
// (about a microsecond a series, six series a call). Safe for concurrent use.
type modelSeries struct {
	m        *metrics
	model    string
	requests [600 - 100]child[prometheus.Counter] // by status, 100 to 599 (statusLabel)
	duration child[prometheus.Observer]
	ttft     [queue.Batch + 1]child[prometheus.Observer] // by class
	tokens   [len(tokenKinds)]child[prometheus.Counter]  // by kind
}

// The kinds of tokens of usher_tokens_total, in modelSeries.tokens' order.
const (
	promptTokens = iota
	completionTokens
	cachedTokens
)

var tokenKinds = [...]string{promptTokens: "prompt", completionTokens: "completion", cachedTokens: "cached"}

// child is one child of a metric vector, created by the first get. Concurrent first gets may
// both create it: WithLabelValues hands both the same child.
type child[M any] struct{ p atomic.Pointer[M] }

// get returns the child, created with create the first time.
func (c *child[M]) get(create func() M) M {
	if p := c.p.Load(); p != nil {
		return *p
	}
	m := create()
	c.p.Store(&m)
	return m
}

// of returns the series of the model label model, creating them on first use. Cost: a map
// lookup under a read lock.
func (m *metrics) of(model string) *modelSeries {
	m.modelsMu.RLock()
	ms := m.models[model]
	m.modelsMu.RUnlock()
	if ms != nil {
		return ms
	}
	m.modelsMu.Lock()
	defer m.modelsMu.Unlock()
	if ms = m.models[model]; ms == nil {
		ms = &modelSeries{m: m, model: model}
		m.models[model] = ms
	}
	return ms
}

// requestsWith is usher_requests_total of the model and status.
func (ms *modelSeries) requestsWith(status int) prometheus.Counter {
	if status < 100 || status >= 600 {
		return ms.m.requests.WithLabelValues(ms.model, statusLabel(status))
	}
	return ms.requests[status-100].get(func() prometheus.Counter {
		return ms.m.requests.WithLabelValues(ms.model, statusLabel(status))
	})
}

// durationOf is usher_request_duration_seconds of the model.
func (ms *modelSeries) durationOf() prometheus.Observer {
	return ms.duration.get(func() prometheus.Observer { return ms.m.duration.WithLabelValues(ms.model) })
}

// ttftOf is usher_time_to_first_token_seconds of the model and class.
func (ms *modelSeries) ttftOf(c queue.Class) prometheus.Observer {
	if int(c) >= len(ms.ttft) {
		return ms.m.ttft.WithLabelValues(ms.model, c.String())
	}
	return ms.ttft[c].get(func() prometheus.Observer { return ms.m.ttft.WithLabelValues(ms.model, c.String()) })
}

// tokensOf is usher_tokens_total of the model and kind (promptTokens, completionTokens,
// cachedTokens).
func (ms *modelSeries) tokensOf(kind int) prometheus.Counter {
	return ms.tokens[kind].get(func() prometheus.Counter { return ms.m.tokens.WithLabelValues(ms.model, tokenKinds[kind]) })
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
		partDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "usher_disaggregated_part_seconds", Help: "Where the time of requests served disaggregated went, by model and part: queue (arrival to placement of both stages), prefill (sending to the prefill worker to its answer, every attempt), decode_first (sending to the decode worker to its first event, less a prefill beside it: KV transfer, decode queue and first step, one part; not observed for whole answers), decode (from there to the answer's end).",
			Buckets: latencyBuckets}, []string{"model", "part"}),
	}
	m.overhead = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "usher_gateway_overhead_seconds",
		Help:    "Time an inference request spent in usher itself: from arrival to its answer's end, less its wait in the queue and its time at the workers (from sending to the answer's last byte).",
		Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3}})
	m.models = map[string]*modelSeries{}
	m.attainment = newAttainment()
	for _, c := range append([]prometheus.Collector{m.requests, m.duration, m.ttft, m.tokens, m.retries, m.preempted, m.prefillPieces, m.overhead,
		m.stageDuration, m.stageRequests, m.partDuration}, m.attainment.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// stage counts one stage of a two-staged call on worker, with its result and how long it took.
// The worker label is the pool's own ID, so the series are bounded by the fleet. (Only calls
// to disaggregated models pay the label lookups here.)
func (m *metrics) stage(model string, st routing.Stage, worker, result string, took time.Duration) {
	stage := st.String()
	m.stageDuration.WithLabelValues(model, stage, worker).Observe(took.Seconds())
	m.stageRequests.WithLabelValues(model, stage, worker, result).Inc()
}

// observeParts observes where the time of cl, a two-staged call a decode worker answered, went (see
// disagg.go); decode_first only when it was measured. The label values are the model's, from
// the config, and four fixed names.
func (m *metrics) observeParts(cl *call) {
	m.partDuration.WithLabelValues(cl.model, "queue").Observe(cl.queued.Seconds())
	m.partDuration.WithLabelValues(cl.model, "prefill").Observe(cl.prefillTime.Seconds())
	if cl.decodeFirst > 0 {
		m.partDuration.WithLabelValues(cl.model, "decode_first").Observe(cl.decodeFirst.Seconds())
	}
	m.partDuration.WithLabelValues(cl.model, "decode").Observe(cl.decodeRest.Seconds())
}
