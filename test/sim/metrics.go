package sim

import (
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// latencyHistograms are vLLM's per-request latency histograms, in seconds of wall time.
type latencyHistograms struct {
	queue, ttft, e2e prometheus.Observer
}

// vLLM's buckets for time to first token, and for queue and end-to-end latency.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10,
		20, 40, 80, 160, 640, 2560}
	requestBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960,
		1920, 7680}
)

// registerMetrics exposes the engine's counters under the names of the engine it stands for:
// vLLM's, each labelled with model_name, in ModeKV; llama-server's, unlabelled, in ModeSlots.
// A router reads a simulated worker exactly as it reads the real one, and only one engine's
// names appear, so nothing that sums over engines' names counts a request twice. Counters and
// gauges read the lock-free counters at scrape time; the returned histograms (nil in ModeSlots,
// as llama-server has none) are fed by the scheduler.
func (e *Engine) registerMetrics(reg prometheus.Registerer) *latencyHistograms {
	// The sim's own, under its own name in either mode: no engine reports it, no router reads it.
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "usher_sim_requests_peak",
		Help: "Most requests the engine held at once (running and waiting) since it started."}, load(&e.stats.peak)))
	seconds := func(v *atomic.Int64) func() float64 {
		return func() float64 { return time.Duration(v.Load()).Seconds() }
	}
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "usher_sim_sequence_seconds_total",
			Help: "Time sequences spent computing: each step's cost times the sequences it computed."}, seconds(&e.stats.seqTime)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "usher_sim_cancelled_sequence_seconds_total",
			Help: "Of usher_sim_sequence_seconds_total, that of sequences cancelled while running: work thrown away."}, seconds(&e.stats.lostSeqTime)))
	if e.cfg.Mode == ModeSlots {
		e.registerLlamaCppMetrics(reg)
		return nil
	}
	return e.registerVLLMMetrics(reg)
}

func load(v interface{ Load() int64 }) func() float64 {
	return func() float64 { return float64(v.Load()) }
}

func (e *Engine) registerVLLMMetrics(reg prometheus.Registerer) *latencyHistograms {
	labels := prometheus.Labels{"model_name": e.cfg.Model}
	gauge := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, read)
	}
	counter := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, read)
	}
	s := &e.stats
	reg.MustRegister(
		gauge("vllm:num_requests_running", "Number of requests in the running batch.", load(&s.running)),
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be admitted, those pulling their KV from a prefill worker included.",
			func() float64 { return float64(s.waiting.Load() + s.receiving.Load()) }),
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
		// vLLM exports its cache config as an info gauge of value 1, every field a label; a
		// router reads the KV cache's size in tokens as block_size x num_gpu_blocks.
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "vllm:cache_config_info",
			Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{
				"block_size":             strconv.Itoa(e.cfg.BlockSize),
				"num_gpu_blocks":         strconv.Itoa(e.cfg.numBlocks()),
				"num_cpu_blocks":         "0",
				"cache_dtype":            "auto",
				"enable_prefix_caching":  "True",
				"gpu_memory_utilization": "0.9",
			},
		}, func() float64 { return 1 }),
	)
	histogram := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: buckets})
		reg.MustRegister(h)
		return h
	}
	return &latencyHistograms{
		queue: histogram("vllm:request_queue_time_seconds", "Time from arrival to first admission.", requestBuckets),
		ttft:  histogram("vllm:time_to_first_token_seconds", "Time from arrival to the first generated token.", ttftBuckets),
		e2e:   histogram("vllm:e2e_request_latency_seconds", "Time from arrival to the last generated token.", requestBuckets),
	}
}

// registerLlamaCppMetrics exposes what llama-server --metrics exposes (no labels, help texts as
// llama-server words them) that the sim can state truthfully: the slots' occupancy and queue,
// token counts and decode calls. Its throughput gauges (prompt_tokens_seconds,
// predicted_tokens_seconds) and time counters are left out.
func (e *Engine) registerLlamaCppMetrics(reg prometheus.Registerer) {
	gauge := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, read)
	}
	counter := func(name, help string, read func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, read)
	}
	s := &e.stats
	reg.MustRegister(
		counter("llamacpp:prompt_tokens_total", "Number of prompt tokens processed.",
			func() float64 { return float64(s.promptTokens.Load() - s.cachedPromptTokens.Load()) }),
		counter("llamacpp:prompt_tokens_cached_total", "Number of prompt tokens served from the prompt cache.", load(&s.cachedPromptTokens)),
		counter("llamacpp:tokens_predicted_total", "Number of generation tokens processed.", load(&s.generatedTokens)),
		counter("llamacpp:n_decode_total", "Total number of llama_decode() calls", load(&s.steps)),
		gauge("llamacpp:n_busy_slots_per_decode", "Average number of busy slots per llama_decode() call", func() float64 {
			if n := s.steps.Load(); n > 0 {
				return float64(s.stepSeqs.Load()) / float64(n)
			}
			return 0
		}),
		gauge("llamacpp:requests_processing", "Number of requests processing.", load(&s.running)),
		gauge("llamacpp:requests_deferred", "Number of requests deferred.", load(&s.waiting)),
	)
}
