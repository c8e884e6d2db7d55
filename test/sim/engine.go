package sim

import (
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Options are an Engine's dependencies.
type Options struct {
	// Logger receives the engine's few log lines; nil discards them.
	Logger *slog.Logger
	// Now stamps responses ("created") and times the latency histograms; nil means time.Now.
	// Engine steps are always paced by the wall clock, scaled by Config.TimeScale.
	Now func() time.Time
}

// Engine is one simulated inference engine serving the OpenAI API over HTTP. All its methods
// are safe for concurrent use. New starts its scheduler goroutine; Close stops it.
type Engine struct {
	cfg     Config
	log     *slog.Logger
	now     func() time.Time
	metrics http.Handler
	stats   counters

	mu     sync.Mutex // guards sched and closed
	sched  *scheduler
	closed bool
	nextID uint64 // guarded by mu: arrival order of sequences

	wake      chan struct{} // capacity 1: the scheduler has something new to look at
	stop      chan struct{} // closed by Close
	loopDone  chan struct{} // closed when the scheduler goroutine returns
	closeOnce sync.Once

	// kv publishes the block pool's KV events; nil without Config.KVEvents.
	kv *kvPublisher

	// engineID names this engine in vLLM's kv_transfer_params (remote_engine_id), drawn at New
	// as vLLM draws a uuid4 when none is configured.
	engineID string
	// peers pulls KV from prefill workers (RoleDecode); no proxy, its idle connections closed
	// by Close.
	peers *http.Client
	// pullWaiters counts the pulls of this engine's held KV waiting for their room.
	pullWaiters atomic.Int64

	faultsMu sync.Mutex // guards faults, dice, arrived, dead, priorities and salts
	faults   Faults
	dice     *rand.Rand
	arrived  int           // completion requests since start or the last SetFaults
	dead     chan struct{} // closed when ExitAfter is reached; replaced by SetFaults
	isDead   bool
	// priorities counts completion requests by their "priority" field.
	priorities map[int]int64
	// salts counts completion requests by their "cache_salt" field.
	salts map[string]int64
}

var _ http.Handler = (*Engine)(nil)

// New validates cfg, fills its zero fields from DefaultConfig and starts the engine's scheduler
// goroutine. The caller must Close the Engine.
func New(cfg Config, opts Options) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: invalid config: %w", err)
	}
	cfg = cfg.withDefaults()
	e := &Engine{
		cfg:        cfg,
		log:        opts.Logger,
		now:        opts.Now,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		loopDone:   make(chan struct{}),
		faults:     cfg.Faults,
		dice:       rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0xbb67ae8584caa73b)),
		dead:       make(chan struct{}),
		priorities: make(map[int]int64),
		salts:      make(map[string]int64),
		engineID:   newTransferID(),
		peers:      &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second}},
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	reg := prometheus.NewRegistry()
	latency := e.registerMetrics(reg)
	e.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	e.sched = newScheduler(cfg, &e.stats, latency, e.now)
	if cfg.KVEvents != "" {
		events := newKVEventLog()
		kv, err := listenKVEvents(cfg.KVEvents, cfg.BlockSize, events)
		if err != nil {
			return nil, fmt.Errorf("sim: %w", err)
		}
		e.kv, e.sched.pool.events = kv, events
	}
	go e.run()
	return e, nil
}

// KVEventsAddrs returns the addresses (host:port) of the KV-event publisher and its replay
// socket; "" without Config.KVEvents.
func (e *Engine) KVEventsAddrs() (events, replay string) {
	if e.kv == nil {
		return "", ""
	}
	return e.kv.addrs()
}

// ResetPrefixCache empties the prefix cache, as vLLM's POST /reset_prefix_cache, and publishes
// AllBlocksCleared.
func (e *Engine) ResetPrefixCache() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sched.pool.reset()
}

// EngineID is the engine's name in vLLM's kv_transfer_params (remote_engine_id).
func (e *Engine) EngineID() string { return e.engineID }

// Config is the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Close stops the scheduler goroutine and ends every request in flight with an error (503, or
// an error event on a stream already started); later requests get 503. Close is idempotent and
// returns once the goroutine has stopped. It does not close the HTTP server serving e.
func (e *Engine) Close() {
	e.closeOnce.Do(func() {
		close(e.stop)
		<-e.loopDone
		e.mu.Lock()
		e.closed = true
		e.sched.failAll(errClosed)
		e.mu.Unlock()
		if e.kv != nil {
			e.kv.close()
		}
		e.peers.CloseIdleConnections()
	})
}

// run is the scheduler loop, owned by New and stopped by Close. Each step is planned under the
// lock, waited out without it (so arrivals and cancellations land at once), then applied.
// Steps are paced against a running deadline, so timer overshoot is caught up and a scaled
// engine keeps its throughput.
func (e *Engine) run() {
	defer close(e.loopDone)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	// expire wakes an idle engine when its oldest held KV expires, so the blocks are freed
	// (and the gauges say so) without waiting for the next request.
	expire := time.NewTimer(time.Hour)
	expire.Stop()
	var due time.Time
	for {
		e.mu.Lock()
		plan := e.sched.schedule()
		next := e.sched.holds.next()
		e.mu.Unlock()
		if plan.empty() {
			due = time.Time{}
			if !next.IsZero() {
				expire.Reset(max(next.Sub(e.now()), time.Millisecond))
			}
			select {
			case <-e.wake:
			case <-expire.C:
			case <-e.stop:
				expire.Stop()
				return
			}
			expire.Stop()
			continue
		}
		now := time.Now()
		if due.IsZero() || now.Sub(due) > maxLag {
			due = now
		}
		due = due.Add(time.Duration(float64(plan.cost) * e.cfg.TimeScale))
		if wait := due.Sub(now); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-e.stop:
				timer.Stop()
				return
			}
		}
		e.mu.Lock()
		e.sched.apply(plan)
		e.mu.Unlock()
	}
}

// maxLag bounds how far behind its schedule the loop may run before it stops catching up.
const maxLag = 5 * time.Millisecond

func (e *Engine) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// submit queues a new sequence, its blocks salted with salt in ModeKV, whose first remote prompt
// tokens come from a prefill worker and whose KV is held under hold when it finishes (see
// sequence); it fails once the engine is closed.
func (e *Engine) submit(prompt []uint64, maxTokens, priority int, salt, hold string, remote int) (*sequence, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, errClosed
	}
	e.nextID++
	q := newSequence(e.nextID, prompt, maxTokens, priority)
	if salt != "" && e.cfg.Mode == ModeKV {
		q.salt = saltHash(salt)
	}
	q.hold, q.remote = hold, remote
	e.sched.add(q)
	e.poke()
	return q, nil
}

// cancel removes a sequence whose client went away, freeing its slot and blocks at once.
// noticeLate waits until the engine's next check (Config.CancelPoll, counted from arrived)
// for a whole answer whose client went away, or until the engine stops; no wait without
// CancelPoll. The sequence runs on meanwhile.
func (e *Engine) noticeLate(arrived time.Time) {
	poll := e.cfg.CancelPoll
	if poll <= 0 {
		return
	}
	t := time.NewTimer(poll - e.now().Sub(arrived)%poll)
	defer t.Stop()
	select {
	case <-t.C:
	case <-e.stop:
	}
}

func (e *Engine) cancel(q *sequence) {
	e.mu.Lock()
	removed := e.sched.cancel(q)
	e.mu.Unlock()
	if removed {
		e.stats.cancelled.Add(1)
		e.poke()
	}
}

// Stats is a snapshot of an engine's counters, for tests.
type Stats struct {
	// Requests counts completion requests received (every POST, good or bad).
	Requests int64
	// Completed counts requests answered in full.
	Completed int64
	// Cancelled counts requests whose client went away while they waited, ran or sat in
	// AddedLatency (not hung ones: those count in Hung).
	Cancelled int64
	// Failed counts requests answered 500 by the ErrorRate fault.
	Failed int64
	// Hung counts requests held unanswered by the HangRate fault.
	Hung int64
	// BadRequests counts requests refused with a 4xx status.
	BadRequests int64
	// Running and Waiting are the sequences in the batch and in the queue now.
	Running, Waiting int
	// Receiving counts decode requests pulling their KV from a prefill worker now (RoleDecode);
	// /metrics counts them as waiting, as vLLM counts WAITING_FOR_REMOTE_KVS.
	Receiving int
	// PromptTokensComputed counts prompt tokens computed by engine steps: prefill work, cache
	// hits and pulled KV excluded, recomputation after preemption included.
	PromptTokensComputed int64
	// KVReceivedTokens counts prompt tokens whose KV was pulled from a prefill worker
	// (RoleDecode); they are part of CachedPromptTokens.
	KVReceivedTokens int64
	// KVTransferFailures counts decode requests refused because their KV could not be pulled.
	KVTransferFailures int64
	// HeldTransfers is the prefills whose KV is held for a decode worker now (RolePrefill), and
	// HeldExpired those freed without being pulled (expired, or pushed out past
	// MaxHeldTransfers).
	HeldTransfers int
	HeldExpired   int64
	// Peak is the most sequences held at once (running and waiting) since the engine started.
	Peak int
	// PromptTokens counts prompt tokens of admitted requests.
	PromptTokens int64
	// CachedPromptTokens counts those served from the prefix cache (the sum of usage's
	// cached_tokens).
	CachedPromptTokens int64
	// GeneratedTokens counts output tokens.
	GeneratedTokens int64
	// PrefixCacheQueries and PrefixCacheHits are the tokens looked up and found in the prefix
	// cache at every admission, re-admissions after preemption included (vLLM's counters).
	PrefixCacheQueries, PrefixCacheHits int64
	// Preemptions counts running sequences sent back to wait for lack of KV blocks.
	Preemptions int64
	// EvictedBlocks counts cached blocks whose content was dropped for reuse.
	EvictedBlocks int64
	// SequenceTime is the time sequences spent computing: the sum over steps of the step's cost
	// times the sequences it computed (slots busy, in slot mode), in the engine's time (before
	// TimeScale). LostSequenceTime is, of it, that of sequences cancelled while running: work
	// thrown away.
	SequenceTime, LostSequenceTime time.Duration
	// KVCacheUsage is the fraction of KV blocks held by running sequences.
	KVCacheUsage float64
	// Priorities counts well-formed completion requests by their "priority" field (0 when
	// absent), whatever the scheduling policy, so tests can see what a gateway forwarded.
	Priorities map[int]int64
	// CacheSalts counts them by their "cache_salt" field ("" when absent), in either mode.
	CacheSalts map[string]int64
}

// Stats returns the engine's counters. It is cheap and never blocks on the scheduler.
func (e *Engine) Stats() Stats {
	e.faultsMu.Lock()
	prio, salts := maps.Clone(e.priorities), maps.Clone(e.salts)
	e.faultsMu.Unlock()
	s := &e.stats
	return Stats{
		Requests:             s.requests.Load(),
		Completed:            s.completed.Load(),
		Cancelled:            s.cancelled.Load(),
		Failed:               s.failed.Load(),
		Hung:                 s.hung.Load(),
		BadRequests:          s.badRequests.Load(),
		Running:              int(s.running.Load()),
		Waiting:              int(s.waiting.Load()),
		Peak:                 int(s.peak.Load()),
		Receiving:            int(s.receiving.Load()),
		HeldTransfers:        int(s.held.Load()),
		HeldExpired:          s.heldExpired.Load(),
		KVTransferFailures:   s.transferFailed.Load(),
		KVReceivedTokens:     s.kvReceived.Load(),
		PromptTokensComputed: s.promptComputed.Load(),
		PromptTokens:         s.promptTokens.Load(),
		CachedPromptTokens:   s.cachedPromptTokens.Load(),
		GeneratedTokens:      s.generatedTokens.Load(),
		PrefixCacheQueries:   s.prefixQueries.Load(),
		PrefixCacheHits:      s.prefixHits.Load(),
		Preemptions:          s.preemptions.Load(),
		EvictedBlocks:        s.evictions.Load(),
		SequenceTime:         time.Duration(s.seqTime.Load()),
		LostSequenceTime:     time.Duration(s.lostSeqTime.Load()),
		KVCacheUsage:         s.kvUsage(),
		Priorities:           prio,
		CacheSalts:           salts,
	}
}

// SetFaults replaces the injected faults. It also restarts the ExitAfter count, and a dead
// engine comes back as a restarted process would (its prefix cache kept).
func (e *Engine) SetFaults(f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	e.faultsMu.Lock()
	defer e.faultsMu.Unlock()
	e.faults = f
	e.arrived = 0
	if e.isDead {
		e.isDead = false
		e.dead = make(chan struct{})
	}
	return nil
}

// Faults returns the faults in force.
func (e *Engine) Faults() Faults {
	e.faultsMu.Lock()
	defer e.faultsMu.Unlock()
	return e.faults
}

// Exited is closed when the engine dies of Faults.ExitAfter. usher sim exits the process then.
// After SetFaults revives the engine, call Exited again for the new life's channel.
func (e *Engine) Exited() <-chan struct{} {
	e.faultsMu.Lock()
	defer e.faultsMu.Unlock()
	return e.dead
}

// arrival is the fault verdict for one completion request.
type arrival struct {
	abort   bool          // the engine is dead or dying: close the connection unanswered
	last    bool          // this request is the ExitAfter-th: the engine dies once it is answered
	fail    bool          // answer 500
	hang    bool          // never answer
	latency time.Duration // wait before the first byte
	dead    <-chan struct{}
}

// arrive counts a completion request and rolls its faults.
func (e *Engine) arrive(priority int, salt string) arrival {
	e.faultsMu.Lock()
	defer e.faultsMu.Unlock()
	e.priorities[priority]++
	e.salts[salt]++
	a := arrival{dead: e.dead, latency: e.faults.AddedLatency}
	if e.isDead {
		a.abort = true
		return a
	}
	e.arrived++
	if n := e.faults.ExitAfter; n > 0 {
		a.abort = e.arrived > n
		a.last = e.arrived == n
	}
	a.fail = e.faults.ErrorRate > 0 && e.dice.Float64() < e.faults.ErrorRate
	a.hang = !a.fail && e.faults.HangRate > 0 && e.dice.Float64() < e.faults.HangRate
	return a
}

// die ends the engine's life (Faults.ExitAfter): every request in flight loses its connection
// and Exited is closed.
func (e *Engine) die() {
	e.faultsMu.Lock()
	if e.isDead {
		e.faultsMu.Unlock()
		return
	}
	e.isDead = true
	close(e.dead)
	e.faultsMu.Unlock()
	e.log.Warn("sim: engine died after its exit-after requests")
	e.mu.Lock()
	e.sched.failAll(errDead)
	e.mu.Unlock()
}

func (e *Engine) isDeadNow() bool {
	e.faultsMu.Lock()
	defer e.faultsMu.Unlock()
	return e.isDead
}

// ServeHTTP is the engine's whole HTTP surface: the OpenAI endpoints, /health, /metrics,
// /tokenize and /reset_prefix_cache (as vLLM's) and, in ModeSlots, /props and /slots.
func (e *Engine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if e.isDeadNow() {
		panic(http.ErrAbortHandler)
	}
	if !e.authorized(r) {
		writeError(w, http.StatusUnauthorized, "authentication_error", "invalid_api_key", "missing or wrong API key")
		return
	}
	switch r.URL.Path {
	case "/v1/embeddings":
		e.onlyMethod(w, r, http.MethodPost, func() { e.serveEmbeddings(w, r) })
	case "/v1/chat/completions":
		e.onlyMethod(w, r, http.MethodPost, func() { e.serveCompletion(w, r, chatEndpoint) })
	case "/v1/completions":
		e.onlyMethod(w, r, http.MethodPost, func() { e.serveCompletion(w, r, textEndpoint) })
	case "/tokenize":
		e.onlyMethod(w, r, http.MethodPost, func() { e.serveTokenize(w, r) })
	case "/kv/pull":
		e.onlyMethod(w, r, http.MethodPost, func() { e.serveKVPull(w, r) })
	case "/reset_prefix_cache":
		e.onlyMethod(w, r, http.MethodPost, func() { e.ResetPrefixCache() })
	case "/v1/models":
		e.onlyMethod(w, r, http.MethodGet, func() { e.serveModels(w) })
	case "/health":
		e.onlyMethod(w, r, http.MethodGet, func() { e.serveHealth(w) })
	case "/metrics":
		e.onlyMethod(w, r, http.MethodGet, func() { e.metrics.ServeHTTP(w, r) })
	case "/props", "/slots":
		if e.cfg.Mode != ModeSlots {
			writeError(w, http.StatusNotFound, "invalid_request_error", "not_found",
				"no route for "+r.URL.Path+" (a kv-mode engine stands for vLLM, which has none)")
			return
		}
		serve := e.serveProps
		if r.URL.Path == "/slots" {
			serve = e.serveSlots
		}
		e.onlyMethod(w, r, http.MethodGet, func() { serve(w) })
	default:
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no route for "+r.URL.Path)
	}
}

func (e *Engine) onlyMethod(w http.ResponseWriter, r *http.Request, method string, serve func()) {
	if r.Method != method {
		w.Header().Set("Allow", method)
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	serve()
}

func (e *Engine) serveHealth(w http.ResponseWriter) {
	if e.Faults().Unhealthy {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if e.cfg.Mode == ModeSlots {
		// llama-server answers with a body; vLLM with none.
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = w.Write([]byte(`{"status":"ok"}`))
		return
	}
	w.WriteHeader(http.StatusOK)
}
