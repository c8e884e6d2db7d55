package sim

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerMetrics exposes the engine's counters under vLLM's metric names, each labelled with
// model_name, so a router reads a simulated worker exactly as it reads vLLM. Every metric reads
// the lock-free counters at scrape time.
func (e *Engine) registerMetrics(reg prometheus.Registerer) {
	labels := prometheus.Labels{"model_name": e.cfg.Model}
	gauge := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, read)
	}
	counter := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, read)
	}
	load := func(v interface{ Load() int64 }) func() float64 {
		return func() float64 { return float64(v.Load()) }
	}
	s := &e.stats
	reg.MustRegister(
		gauge("vllm:num_requests_running", "Number of requests in the running batch.", load(&s.running)),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be admitted.", load(&s.waiting)),
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage: 1 means every block is held by a running request.", s.kvUsage),
		gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, under vLLM V0's name.", s.kvUsage),
		counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", load(&s.prefixQueries)),
		counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", load(&s.prefixHits)),
		counter("vllm:prompt_tokens_total", "Prompt tokens of admitted requests.", load(&s.promptTokens)),
		counter("vllm:generation_tokens_total", "Generated tokens.", load(&s.generatedTokens)),
		counter("vllm:num_preemptions_total", "Running requests preempted for lack of KV-cache blocks.", load(&s.preemptions)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "vllm:request_success_total",
			Help:        "Requests finished by the engine.",
			ConstLabels: prometheus.Labels{"model_name": e.cfg.Model, "finished_reason": finishLength},
		}, load(&s.completed)),
	)
}
