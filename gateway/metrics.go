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
	// preempted counts attempts cancelled for an interactive request, by model and class.
	preempted *prometheus.CounterVec
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
		preempted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_preempted_total", Help: "Standard and batch requests whose attempt was cancelled (before their answer began) for an interactive request, and requeued."},
			[]string{"model", "class"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.ttft, m.tokens, m.retries, m.preempted} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
