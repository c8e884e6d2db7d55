package gateway

import (
	"github.com/prometheus/client_golang/prometheus"
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
	// attainment counts the calls' verdicts against their objectives (objective.go).
	attainment *attainment
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
	}
	m.overhead = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "usher_gateway_overhead_seconds",
		Help:    "Time an inference request spent in usher itself: from arrival to its answer's end, less its wait in the queue and its time at the workers (from sending to the answer's last byte).",
		Buckets: []float64{10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 100e-3}})
	m.attainment = newAttainment()
	for _, c := range append([]prometheus.Collector{m.requests, m.duration, m.ttft, m.tokens, m.retries, m.preempted, m.prefillPieces, m.overhead},
		m.attainment.collectors()...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
