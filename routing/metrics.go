package routing

import (
	"github.com/prometheus/client_golang/prometheus"
)

// poolMetrics are the pool's Prometheus metrics, registered on the Registerer of Options.
type poolMetrics struct {
	pool      *Pool                  // for the per-worker gauges, read at scrape time
	decisions *prometheus.CounterVec // model, policy, route ("none": no worker)
	outcomes  *prometheus.CounterVec // worker, result
	checks    *prometheus.CounterVec // worker, result
	// breakerOpens counts circuit openings by worker.
	breakerOpens *prometheus.CounterVec
	scrapeErrors *prometheus.CounterVec // worker
	// promptTokens and cachedTokens count the usage workers report, by worker and policy, so the
	// prefix-cache hit rate each policy earns can be read off.
	promptTokens *prometheus.CounterVec
	cachedTokens *prometheus.CounterVec
	// pinErrors counts failed pin-store calls by model and operation (get, claim, list); a failed
	// get routes the request by consistent hashing instead.
	pinErrors *prometheus.CounterVec
	// discoveryErrors counts failed DNS resolutions of Config.Discovery by name.
	discoveryErrors *prometheus.CounterVec
	// cachePredictionError is cache_aware's error about what each chosen worker held, by model.
	cachePredictionError *prometheus.HistogramVec
	// cacheShared counts cache_aware inserts shared among replicas by model and direction.
	cacheShared *prometheus.CounterVec
	// kvBlocks is, by model and worker, the KV blocks kv_aware's index holds from the worker's
	// events.
	kvBlocks *prometheus.GaugeVec
	// kvEvents counts the blocks of the KV events kv_aware applied, by model, worker and event
	// (stored, removed; cleared counts AllBlocksCleared events, restarted and lost the times a
	// worker's index started over).
	kvEvents *prometheus.CounterVec
	// shareExchanges counts the exchanges of worker shares with the fleet by result.
	shareExchanges *prometheus.CounterVec
	// reserveTakes counts TakeReserve's attempts by result.
	reserveTakes *prometheus.CounterVec
	// prefillMarks counts the marks of interactive prefills told to and heard from the fleet, by
	// result.
	prefillMarks *prometheus.CounterVec
	// reserveLoans counts the loans of this replica's room to the fleet's reserve by result.
	reserveLoans *prometheus.CounterVec
	// roomCalls counts this replica's calls to the fleet for room by result.
	roomCalls *prometheus.CounterVec
	// prefillPiece is the pool's prefill piece now, read at scrape time.
	prefillPiece prometheus.GaugeFunc
	// paceShare is the share of the pace of pieces beside interactive decodes now.
	paceShare prometheus.GaugeFunc
	// decodePaces counts the waits of lower-class pieces beside interactive decodes
	// (AwaitDecodes).
	decodePaces prometheus.Counter
}

func newPoolMetrics(p *Pool) *poolMetrics {
	return &poolMetrics{
		pool: p,
		prefillPiece: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "usher_routing_prefill_piece_tokens",
			Help: "The size of the pieces a long standard or batch prompt goes to an engine in while interactive requests are present: configured, or learnt from the interactive prompts and shrunk while interactive requests miss their TTFT objective at the engine; 0: pieces off.",
		}, func() float64 { return float64(p.pieceTokens()) }),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_decisions_total",
			Help: "Routing decisions by model, policy and route; route \"none\" counts picks that found no eligible worker.",
		}, []string{"model", "policy", "route"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_requests_total",
			Help: "Requests released by worker and result (ok, failed: connect error or 5xx before the first byte).",
		}, []string{"worker", "result"}),
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_health_checks_total",
			Help: "Active health checks by worker and result (pass, fail).",
		}, []string{"worker", "result"}),
		breakerOpens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_circuit_opens_total",
			Help: "Times a worker's circuit breaker opened (or re-opened after a failed probe).",
		}, []string{"worker"}),
		scrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_scrape_errors_total",
			Help: "Failed reads of a worker's /metrics, by worker.",
		}, []string{"worker"}),
		promptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_prompt_tokens_total",
			Help: "Prompt tokens the workers reported, by worker and policy.",
		}, []string{"worker", "policy"}),
		cachedTokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_cached_tokens_total",
			Help: "Prompt tokens the workers served from their prefix cache (usage.prompt_tokens_details.cached_tokens), by worker and policy.",
		}, []string{"worker", "policy"}),
		pinErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_pin_errors_total",
			Help: "Failed pin-store calls by model and operation; a failed get routes by consistent hashing on the same key.",
		}, []string{"model", "op"}),
		discoveryErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_discovery_errors_total",
			Help: "Failed DNS resolutions of routing.discovery names; the workers found before stay.",
		}, []string{"name"}),
		cachePredictionError: newPredictionErrorHistogram(),
		cacheShared: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_cache_shared_inserts_total",
			Help: "cache_aware inserts shared with the other gateway replicas, by model and direction: sent, received (applied from another replica), dropped (over the batch bound or a failed publish).",
		}, []string{"model", "direction"}),
		kvBlocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "usher_routing_kv_blocks",
			Help: "KV-cache blocks each worker's engine holds according to its KV events (kv_aware), by model and worker.",
		}, []string{"model", "worker"}),
		kvEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_kv_events_total",
			Help: "KV events kv_aware applied, by model, worker and event: blocks stored, blocks removed, caches cleared; and the times it started a worker's index over: restarted (the publisher's sequence went back), lost (a gap no replay filled).",
		}, []string{"model", "worker", "event"}),
		shareExchanges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_share_exchanges_total",
			Help: "Exchanges of this replica's demand on the workers with the fleet (SyncShares), by result (ok, failed: each worker's share stays within its last grant and 1/n of its limit).",
		}, []string{"result"}),
		reserveTakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_reserve_takes_total",
			Help: "Interactive requests that found no room and asked the fleet's interactive reserve for some (TakeReserve), by result: taken, refused (no reserve left on the workers it may use), failed (the store failed, or the split is cut or rejoining).",
		}, []string{"result"}),
		prefillMarks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_prefill_marks_total",
			Help: "Marks of interactive prompts beginning and ending their prefill, told among the replicas so that lower-class pieces on a worker wait for every replica's interactive prefill there, by result: sent, failed (the store failed), dropped (the queue to send was full); received (another replica's beginning, counted), over (not counted: too many counted already), expired (another replica's mark whose end never came, no longer counted).",
		}, []string{"result"}),
		reserveLoans: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_reserve_loans_total",
			Help: "Requests of this replica's share lent to the fleet's interactive reserve of a worker for an interactive request another replica waited with (it ended one of its own lower-class requests there for it), by result: lent, refused (the reserve had room, another replica lent first, or nothing of this replica's own was in flight there), failed (the store failed, or the split is cut or rejoining), returned (taken back once the holds no longer needed it).",
		}, []string{"result"}),
		paceShare: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "usher_routing_decode_pace_share",
			Help: "The share of the pace a standard or batch prompt's pieces keep beside an interactive request decoding on their worker, 0 to 1: raised while interactive answers that decoded beside pieces miss their TPOT objective, lowered while they meet it.",
		}, func() float64 { return p.paceShare() }),
		decodePaces: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "usher_routing_decode_paces_total",
			Help: "Waits of a standard or batch prompt's pieces beside an interactive request decoding on their worker, so that the interactive answer's steps keep within its TPOT objective.",
		}),
		roomCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_routing_room_calls_total",
			Help: "Calls of this replica to the fleet's others for room for an interactive request that found none, none in the fleet's reserve and nothing of its own to preempt, by result: made, failed (the publish failed).",
		}, []string{"result"}),
	}
}

// register puts the metrics on reg; it fails if another pool's are there already.
func (m *poolMetrics) register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{m.decisions, m.outcomes, m.checks, m.breakerOpens, m.scrapeErrors, m.promptTokens, m.cachedTokens, m.pinErrors, m.discoveryErrors, m.cachePredictionError, m.cacheShared, m.kvBlocks, m.kvEvents, m.shareExchanges, m.reserveTakes, m.prefillMarks, m.reserveLoans, m.roomCalls, m.prefillPiece, m.paceShare, m.decodePaces, workerCollector{m.pool}} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// forget drops the series of a removed worker.
func (m *poolMetrics) forget(worker string) {
	m.outcomes.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.checks.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.breakerOpens.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.scrapeErrors.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.promptTokens.DeletePartialMatch(prometheus.Labels{"worker": worker})
	m.cachedTokens.DeletePartialMatch(prometheus.Labels{"worker": worker})
}

// decided counts a decision of ms's policy for model. Its children are cached in ms (a
// WithLabelValues validates and hashes its labels, about 600 instructions, at every pick).
func (m *poolMetrics) decided(ms *modelSet, model string, route Route) {
	ms.mu.RLock()
	c, ok := ms.decisions[route]
	ms.mu.RUnlock()
	if !ok {
		c = m.decisions.WithLabelValues(model, ms.policyName, string(route))
		ms.mu.Lock()
		if ms.decisions == nil {
			ms.decisions = make(map[Route]prometheus.Counter)
		}
		ms.decisions[route] = c
		ms.mu.Unlock()
	}
	c.Inc()
}

// workerSeries are a worker's children of the vectors every lease's release counts in, for one
// policy, created once instead of looked up by WithLabelValues at every release (see decided).
// Immutable once stored in Worker.series. A child is nil until it is first counted in, as its
// series did not exist before.
type workerSeries struct {
	policy         string
	outcomes       [2]prometheus.Counter // by outcomeResults
	prompt, cached prometheus.Counter
}

// outcomeResults are the result labels of poolMetrics.outcomes: ok, failed.
var outcomeResults = [2]string{"ok", "failed"}

// seriesOf returns w's series for policy, with the outcome child of failed and, when tokens is
// set, the token children. A worker whose models have different policies swaps its series
// between them (each swap costs what the look-ups cost before).
func (m *poolMetrics) seriesOf(w *Worker, policy string, failed, tokens bool) *workerSeries {
	result := 0
	if failed {
		result = 1
	}
	s := w.series.Load()
	if s != nil && s.policy == policy && s.outcomes[result] != nil && (!tokens || s.prompt != nil) {
		return s
	}
	n := &workerSeries{policy: policy}
	if s != nil && s.policy == policy {
		*n = *s
	}
	if n.outcomes[result] == nil {
		n.outcomes[result] = m.outcomes.WithLabelValues(w.spec.ID, outcomeResults[result])
	}
	if tokens && n.prompt == nil {
		n.prompt = m.promptTokens.WithLabelValues(w.spec.ID, policy)
		n.cached = m.cachedTokens.WithLabelValues(w.spec.ID, policy)
	}
	w.series.Store(n)
	return n
}

var (
	inFlightDesc = prometheus.NewDesc("usher_routing_worker_in_flight_requests",
		"Requests the gateway has in flight on the worker.", []string{"worker"}, nil)
	inFlightTokensDesc = prometheus.NewDesc("usher_routing_worker_in_flight_tokens",
		"Tokens (prompt + max output) of the requests in flight on the worker.", []string{"worker"}, nil)
	healthyDesc = prometheus.NewDesc("usher_routing_worker_healthy",
		"1 when the health checks let the worker take requests, else 0.", []string{"worker"}, nil)
	drainingDesc = prometheus.NewDesc("usher_routing_worker_draining",
		"1 while the worker is draining, else 0.", []string{"worker"}, nil)
	waitingDesc = prometheus.NewDesc("usher_routing_worker_reported_waiting",
		"Requests queued inside the worker at its last scrape.", []string{"worker"}, nil)
	kvUsageDesc = prometheus.NewDesc("usher_routing_worker_reported_kv_usage",
		"Fraction of the worker's KV cache in use at its last scrape.", []string{"worker"}, nil)
	cacheLimitDesc = prometheus.NewDesc("usher_routing_cache_limit_bytes",
		"Prompt bytes cache_aware counts as held by the worker: max_bytes_per_worker until the engine's reported cached tokens showed a smaller cache, then what it was found to keep.",
		[]string{"model", "worker"}, nil)
	limitDesc = prometheus.NewDesc("usher_routing_worker_concurrency_limit",
		"Requests the gateway keeps in flight on the worker at most, now; source: config, engine (its slots) or learned.",
		[]string{"worker", "source"}, nil)
	shareDesc = prometheus.NewDesc("usher_routing_worker_share",
		"Requests this replica may keep in flight on the worker now: its share of the worker's concurrency limit, split among the replicas by demand through Redis (only with a fleet's split).",
		[]string{"worker"}, nil)
	idleStepDesc = prometheus.NewDesc("usher_routing_worker_idle_step_seconds",
		"The decode step of one sequence alone on the worker, as its cost model learnt it from the median gaps between the events of its streams (before 32 of them, from its TPOTs): its idle TPOT, which the default TPOT objectives and the pace of pieces are relative to. Absent while the model has not learnt the worker's steps.",
		[]string{"worker"}, nil)
	tokenLimitDesc = prometheus.NewDesc("usher_routing_worker_token_limit",
		"Tokens (prompt + expected output) the gateway keeps in flight on the worker at most, now; source: config, or engine (its KV cache).",
		[]string{"worker", "source"}, nil)
)

// workerCollector reports the per-worker gauges from the workers' atomics at scrape time, so the
// pick path writes no gauge and removed workers disappear from the output.
type workerCollector struct{ p *Pool }

var _ prometheus.Collector = workerCollector{}

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- inFlightTokensDesc
	ch <- healthyDesc
	ch <- drainingDesc
	ch <- waitingDesc
	ch <- kvUsageDesc
	ch <- limitDesc
	ch <- tokenLimitDesc
	ch <- shareDesc
	ch <- cacheLimitDesc
	ch <- idleStepDesc
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.mu.Lock()
	workers := c.p.workers
	trees := map[string]*CacheAware{}
	for key, pol := range c.p.policies {
		if _, ok := trees[key.model]; ok && key.stage != StagePrefill {
			// Of a disaggregated model's trees, the prefill pool's is the one that matters.
			continue
		}
		switch p := pol.Policy.(type) {
		case *CacheAware:
			trees[key.model] = p
		case *KVAware:
			trees[key.model] = p.fallback
		}
	}
	c.p.mu.Unlock()
	for model, ca := range trees {
		for id, limit := range ca.Limits() {
			ch <- prometheus.MustNewConstMetric(cacheLimitDesc, prometheus.GaugeValue, float64(limit), model, id)
		}
	}
	for _, w := range workers {
		id := w.spec.ID
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(w.InFlight()), id)
		ch <- prometheus.MustNewConstMetric(inFlightTokensDesc, prometheus.GaugeValue, float64(w.InFlightTokens()), id)
		ch <- prometheus.MustNewConstMetric(healthyDesc, prometheus.GaugeValue, boolGauge(w.Healthy()), id)
		ch <- prometheus.MustNewConstMetric(drainingDesc, prometheus.GaugeValue, boolGauge(w.Draining()), id)
		ch <- prometheus.MustNewConstMetric(limitDesc, prometheus.GaugeValue, float64(w.MaxConcurrency()), id, string(w.LimitSource()))
		ch <- prometheus.MustNewConstMetric(tokenLimitDesc, prometheus.GaugeValue, float64(w.MaxTokensInFlight()), id, string(w.TokenLimitSource()))
		if n, shared := w.Share(); shared {
			ch <- prometheus.MustNewConstMetric(shareDesc, prometheus.GaugeValue, float64(n), id)
		}
		if load := w.Load(); !load.At.IsZero() {
			ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(load.Waiting), id)
			ch <- prometheus.MustNewConstMetric(kvUsageDesc, prometheus.GaugeValue, load.KVUsage, id)
		}
		if idle, ok := w.PredictIdle(1, 0); ok && idle.TPOT > 0 {
			ch <- prometheus.MustNewConstMetric(idleStepDesc, prometheus.GaugeValue, idle.TPOT.Seconds(), id)
		}
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
