package routing

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"
)

func init() {
	registerPolicy("kv_aware", func(env policyEnv) (Policy, error) {
		fallback, err := NewCacheAware(env.cfg.CacheAware, env.now)
		if err != nil {
			return nil, err
		}
		fallback.predictionError = env.metrics.cachePredictionError.WithLabelValues(env.model)
		fallback.scope = env.scope
		if env.prefixes != nil && !fallback.cfg.Local {
			fallback.share = newShare(env.prefixes, env)
		}
		k, err := NewKVAware(env.cfg.KVAware, fallback, env.logger)
		if err != nil {
			return nil, err
		}
		k.model, k.blocks, k.events, k.now = env.model, env.metrics.kvBlocks, env.metrics.kvEvents, env.now
		k.scope = env.scope
		if k.scope != CacheScopeGlobal {
			k.logger.Warn("kv_aware: the engines' KV events cannot tell one cache scope's blocks from another's; with routing.cache_scope other than global, requests are routed by cache_aware's scoped tree", "model", env.model, "cache_scope", k.scope)
		}
		return k, nil
	})
}

// Routes of the kv_aware policy; when no worker's events show Threshold of the prompt held, the
// routes are cache_aware's.
const (
	// RouteKVHit: the worker whose engine holds the longest run of the prompt's leading blocks
	// (at least CacheAwareConfig.Threshold of its tokens) took it, load being balanced or that
	// worker not overloaded.
	RouteKVHit Route = "kv_hit"
	// RouteKVRebalance: load is imbalanced and the longest holder is overloaded; the worker that
	// is not overloaded and holds the most of the prompt (at least Threshold) took it.
	RouteKVRebalance Route = "kv_rebalance"
)

// Defaults of KVAwareConfig.
const (
	DefaultKVEventsPort         = 5557 // vLLM's --kv-events-config endpoint "tcp://*:5557"
	DefaultKVReplayPort         = 5558 // vLLM's replay_endpoint in its examples
	DefaultKVMaxBlocksPerWorker = 262144
	DefaultKVTokenizePath       = "/tokenize"
	DefaultKVTokenizeTimeout    = 500 * time.Millisecond
	DefaultKVHolderWait         = 250 * time.Millisecond
)

// KVAwareConfig sets the kv_aware policy (`routing.models[m].kv_aware`); it also uses the
// model's cache_aware section, for its Threshold and balance tests and for the workers that
// publish no events.
type KVAwareConfig struct {
	// EventsPort is the port of each worker's KV-event publisher (vLLM's ZeroMQ PUB socket),
	// on the host of the worker's URL; default 5557.
	EventsPort int `yaml:"events_port"`
	// ReplayPort is the port of its replay socket (ROUTER), asked for the batches missed in a
	// gap of sequence numbers; default 5558. -1: none (a gap empties the worker's index).
	ReplayPort int `yaml:"replay_port"`
	// BlockSize is the engines' KV block size in tokens; 0 (default) takes it from their events.
	// When set, events of another size are dropped.
	BlockSize int `yaml:"block_size"`
	// MaxBlocksPerWorker bounds each worker's index (at most about 160 bytes a block); past it the
	// blocks stored first are forgotten first. Default 262144.
	MaxBlocksPerWorker int `yaml:"max_blocks_per_worker"`
	// TokenizePath is the engines' tokenizer endpoint (vLLM's and llama-server's
	// POST /tokenize), asked once per request; default /tokenize.
	TokenizePath string `yaml:"tokenize_path"`
	// TokenizeTimeout bounds that call; past it the request is routed as cache_aware would.
	// Default 500ms.
	TokenizeTimeout time.Duration `yaml:"tokenize_timeout"`
	// Threshold is the share of a prompt's tokens a worker's events must show held for the
	// prompt to go to that worker by its events. Default 0: one block is enough. The events are
	// what the engine holds, not a guess, so every held block is prefill saved; a threshold of
	// half the prompt (cache_aware's, SGLang's) sent conversations whose new turn outweighed
	// their history away from it: on the Mooncake conversation trace kv_aware reached 93-95% of
	// the one-shared-cache hit rate with it, 100% with one block.
	Threshold float64 `yaml:"threshold"`
	// HolderWait bounds how long a request waits for the worker whose events show it holding at
	// least half the prompt more than any worker with room now, when that worker is at its
	// limit (requests or tokens): the request is refused (it waits in the gateway for a slot)
	// until then, and after it goes to the best worker with room. Default 250ms; negative:
	// never wait.
	HolderWait time.Duration `yaml:"holder_wait"`
	// Endpoints overrides, per worker ID, where its events are read: "host:port" of the
	// publisher, and optionally the replay socket's after a comma ("host:5557,host:5558").
	Endpoints map[string]string `yaml:"endpoints"`
}

// SetDefaults fills the zero fields of c.
func (c *KVAwareConfig) SetDefaults() {
	if c.EventsPort == 0 {
		c.EventsPort = DefaultKVEventsPort
	}
	if c.ReplayPort == 0 {
		c.ReplayPort = DefaultKVReplayPort
	}
	if c.MaxBlocksPerWorker == 0 {
		c.MaxBlocksPerWorker = DefaultKVMaxBlocksPerWorker
	}
	if c.TokenizePath == "" {
		c.TokenizePath = DefaultKVTokenizePath
	}
	if c.TokenizeTimeout == 0 {
		c.TokenizeTimeout = DefaultKVTokenizeTimeout
	}
	if c.HolderWait == 0 {
		c.HolderWait = DefaultKVHolderWait
	}
}

func (c KVAwareConfig) validate(prefix string) []error {
	var errs []error
	if c.EventsPort < 1 || c.EventsPort > 65535 {
		errs = append(errs, fieldError(prefix, "events_port", "must be a port in 1..65535, got %d", c.EventsPort))
	}
	if c.ReplayPort != -1 && (c.ReplayPort < 1 || c.ReplayPort > 65535) {
		errs = append(errs, fieldError(prefix, "replay_port", "must be a port in 1..65535 or -1, got %d", c.ReplayPort))
	}
	if c.BlockSize < 0 {
		errs = append(errs, fieldError(prefix, "block_size", "must not be negative, got %d", c.BlockSize))
	}
	if c.MaxBlocksPerWorker < 1 {
		errs = append(errs, fieldError(prefix, "max_blocks_per_worker", "must be at least 1, got %d", c.MaxBlocksPerWorker))
	}
	if len(c.TokenizePath) == 0 || c.TokenizePath[0] != '/' {
		errs = append(errs, fieldError(prefix, "tokenize_path", "must start with /, got %q", c.TokenizePath))
	}
	if c.TokenizeTimeout < 0 {
		errs = append(errs, fieldError(prefix, "tokenize_timeout", "must not be negative, got %s", c.TokenizeTimeout))
	}
	if math.IsNaN(c.Threshold) || c.Threshold < 0 || c.Threshold > 1 {
		errs = append(errs, fieldError(prefix, "threshold", "must be in [0, 1], got %v", c.Threshold))
	}
	for _, id := range sortedKeys(c.Endpoints) {
		if _, _, err := splitKVEndpoints(c.Endpoints[id]); err != nil {
			errs = append(errs, fieldError(prefix, fmt.Sprintf("endpoints[%q]", id), "%v", err))
		}
	}
	return errs
}

// splitKVEndpoints reads "host:port[,host:port]" into the publisher's and the replay socket's
// ZeroMQ endpoints (replay "" for none).
func splitKVEndpoints(s string) (events, replay string, err error) {
	ev, rp, _ := bytes.Cut([]byte(s), []byte(","))
	for i, hp := range [][]byte{ev, rp} {
		if i == 1 && len(hp) == 0 {
			break
		}
		if _, port, err := net.SplitHostPort(string(hp)); err != nil || port == "" {
			return "", "", fmt.Errorf("want host:port[,host:port], got %q", s)
		}
	}
	events = "tcp://" + string(ev)
	if len(rp) > 0 {
		replay = "tcp://" + string(rp)
	}
	return events, replay, nil
}

// KVAware is the kv_aware policy: it routes a prompt to the worker whose engine holds the longest
// run of its leading KV blocks, as that engine's own KV-cache events tell (vLLM's format, over
// ZeroMQ), weighed against load as CacheAware weighs its tree's matches.
//
// Its Prepare does I/O, its Pick none: one POST to a worker's /tokenize per request (bounded by
// TokenizeTimeout; the ids are kept in Request.Prepared, so a retry does not ask again; the calls
// rotate over the workers that publish events), so the prompt's blocks are hashed from the
// engine's own token ids. A chat request's messages are sent as they came, for the engine to
// apply its chat template. That call costs about 0.3 ms for a 4 KB prompt on loopback
// (BenchmarkKVAwareTokenize). When no worker publishes events, the tokenizer fails or was not
// asked, or no worker's events show Threshold of the prompt held, the request goes to the
// wrapped CacheAware (whose tree then records it), so a fleet of engines without events routes
// as cache_aware. Pick returns nil, so that the request
// waits in the gateway for a slot, while the worker holding at least half the prompt more than
// any worker with room is at its limit, for at most HolderWait per prompt.
//
// Cache scopes: the events say which blocks of tokens an engine holds, not whose prompt put them
// there (vLLM's BlockStored carries no cache_salt; a salted block differs only in the engine's
// own hash, which usher cannot compute). Matching them would route one tenant's prompt by
// another's blocks and show it in the route and the worker chosen, the oracle CacheScope
// closes. So the events decide only in the global scope; in a tenant or tier scope every
// request goes to the fallback, whose tree keeps the scopes apart, and no /tokenize call is made.
//
// Each worker's events are read by one goroutine that Run owns: a ZeroMQ SUB socket to the
// worker's publisher; a gap in sequence numbers asks the replay socket for the batches missed,
// and empties the worker's index if it cannot; a number below the last one received (the
// publisher started over: a restarted engine) empties it too, and replays the new publisher's
// batches before that one. Indexes are per worker, each behind its own lock, so a Pick never
// waits for more than one batch being applied.
type KVAware struct {
	cfg      KVAwareConfig
	fallback *CacheAware
	logger   *slog.Logger
	client   *http.Client
	changed  chan struct{} // capacity 1: WorkersChanged asks Run to start subscribers
	// tokenizeTurn rotates the /tokenize calls over the workers that may take them.
	tokenizeTurn atomic.Uint64
	// blocks, when not nil, shows each worker's indexed blocks under the label model.
	blocks *prometheus.GaugeVec
	// events, when not nil, counts the events applied, by model, worker and event.
	events *prometheus.CounterVec
	model  string
	now    func() time.Time
	// scope is Config.CacheScope; the events decide only in CacheScopeGlobal (the zero value
	// isolates tenants).
	scope CacheScope

	mu      sync.Mutex // guards workers
	workers map[string]*kvWorker

	waitMu sync.Mutex // guards waits
	// waits holds when each prompt (by its last full block's key) was first refused to wait
	// for its holder (see KVAwareConfig.HolderWait); entries past the wait are swept.
	waits map[uint64]time.Time
}

var (
	_ Policy          = (*KVAware)(nil)
	_ outcomeLearner  = (*KVAware)(nil)
	_ workersObserver = (*KVAware)(nil)
	_ policyRunner    = (*KVAware)(nil)
	_ preparer        = (*KVAware)(nil)
)

// NewKVAware returns a kv_aware policy with cfg (defaults applied to zero fields) that routes
// what the events do not decide with fallback. Start its subscribers with Run; tell it the
// workers with WorkersChanged.
func NewKVAware(cfg KVAwareConfig, fallback *CacheAware, logger *slog.Logger) (*KVAware, error) {
	cfg.SetDefaults()
	if errs := cfg.validate("kv_aware"); len(errs) > 0 {
		return nil, errs[0]
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &KVAware{
		cfg:      cfg,
		fallback: fallback,
		logger:   logger,
		client:   &http.Client{Timeout: cfg.TokenizeTimeout},
		changed:  make(chan struct{}, 1),
		workers:  make(map[string]*kvWorker),
		now:      time.Now,
		waits:    make(map[uint64]time.Time),
	}, nil
}

// kvWorker is the event subscription and block index of one worker.
type kvWorker struct {
	id             string
	events, replay string // ZeroMQ endpoints; replay "" for none
	stop           chan struct{}
	started        bool // guarded by KVAware.mu

	// live: a batch has been received, so the index speaks for the engine.
	live atomic.Bool
	mu   sync.RWMutex // guards index
	idx  *kvIndex
}

// WorkersChanged implements workersObserver: it subscribes to the events of the workers new in
// workers and stops those of the workers gone, and passes the snapshot on to the fallback.
func (k *KVAware) WorkersChanged(workers []*Worker) {
	k.fallback.WorkersChanged(workers)
	k.mu.Lock()
	keep := make(map[string]bool, len(workers))
	for _, w := range workers {
		events, replay := k.endpointsOf(w)
		keep[w.ID()] = true
		if old := k.workers[w.ID()]; old != nil {
			if old.events == events && old.replay == replay {
				continue
			}
			close(old.stop)
		}
		k.workers[w.ID()] = &kvWorker{
			id: w.ID(), events: events, replay: replay, stop: make(chan struct{}),
			idx: newKVIndex(k.cfg.BlockSize, k.cfg.MaxBlocksPerWorker),
		}
	}
	for id, kw := range k.workers {
		if !keep[id] {
			close(kw.stop)
			delete(k.workers, id)
			if k.blocks != nil {
				k.blocks.DeleteLabelValues(k.model, id)
			}
			if k.events != nil {
				k.events.DeletePartialMatch(prometheus.Labels{"model": k.model, "worker": id})
			}
		}
	}
	k.mu.Unlock()
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *KVAware) endpointsOf(w *Worker) (events, replay string) {
	if s, ok := k.cfg.Endpoints[w.ID()]; ok {
		events, replay, _ = splitKVEndpoints(s) // validated
		return events, replay
	}
	host := w.URL().Hostname()
	events = "tcp://" + net.JoinHostPort(host, strconv.Itoa(k.cfg.EventsPort))
	if k.cfg.ReplayPort > 0 {
		replay = "tcp://" + net.JoinHostPort(host, strconv.Itoa(k.cfg.ReplayPort))
	}
	return events, replay
}

// Run runs the fallback's background work and one event subscriber per worker (started as
// WorkersChanged reports them, stopped when they leave) until ctx ends, and returns when all of
// them have stopped.
func (k *KVAware) Run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { k.fallback.Run(ctx) })
	for {
		k.mu.Lock()
		for _, kw := range k.workers {
			if !kw.started {
				kw.started = true
				wg.Go(func() { k.subscribe(ctx, kw) })
			}
		}
		k.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-k.changed:
		}
	}
}

// kvRedial bounds the wait before dialling a publisher again.
const (
	kvRedialMin = 250 * time.Millisecond
	kvRedialMax = 10 * time.Second
)

// subscribe reads kw's events until ctx ends or kw is stopped, dialling again (with backoff)
// whenever the publisher cannot be reached.
func (k *KVAware) subscribe(ctx context.Context, kw *kvWorker) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-kw.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	quiet := log.New(io.Discard, "", 0)
	// last is the last sequence number applied, live or replayed; live the last one received
	// live. The publisher numbers its batches in order, so a live number below live means it
	// started over (a restarted engine, whose cache is new), whatever number it started from.
	last, live := int64(-1), int64(-1)
	var batch kvBatch
	wait := kvRedialMin
	for ctx.Err() == nil {
		sub := zmq4.NewSub(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithAutomaticReconnect(true), zmq4.WithLogger(quiet))
		err := sub.Dial(kw.events)
		if err == nil {
			err = sub.SetOption(zmq4.OptionSubscribe, "")
		}
		if err == nil && kw.replay != "" {
			// What was published before the subscription took effect (all of it on the first
			// connection, the gap on a later one) is only on the replay socket.
			last = k.replay(ctx, kw, last, math.MaxInt64, &batch)
		}
		for err == nil {
			var msg zmq4.Msg
			if msg, err = sub.Recv(); err != nil {
				break
			}
			wait = kvRedialMin
			if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 || msg.Frames[1][0] >= 0x80 {
				k.logger.Warn("kv_aware: dropped a malformed event message", "worker", kw.id, "frames", len(msg.Frames))
				continue
			}
			seq := int64(binary.BigEndian.Uint64(msg.Frames[1]))
			switch {
			case seq < live:
				// The publisher started over: what the index holds is the old cache's. Start
				// over too, from the new publisher's first batch if its replay socket still
				// has the ones before this.
				k.logger.Info("kv_aware: the event sequence went back; the worker's index starts over", "worker", kw.id, "from", live, "to", seq)
				k.reset(kw)
				k.count(kw, "restarted")
				if seq > 0 {
					k.catchUp(ctx, kw, -1, seq, &batch)
				}
			case seq > last+1:
				// Filled up to seq-1, or the index started over: either way this message is
				// applied next and last becomes seq.
				k.catchUp(ctx, kw, last, seq, &batch)
			case seq <= last:
				live = max(live, seq)
				continue // already applied from the replay socket (or sent twice)
			}
			k.applyPayload(kw, msg.Frames[2], &batch)
			last, live = seq, seq
		}
		sub.Close()
		if ctx.Err() != nil {
			return
		}
		k.logger.Debug("kv_aware: event subscription lost", "worker", kw.id, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, kvRedialMax)
	}
}

func (k *KVAware) applyPayload(kw *kvWorker, payload []byte, batch *kvBatch) {
	if err := decodeKVBatch(payload, batch); err != nil {
		k.logger.Warn("kv_aware: dropped an event batch", "worker", kw.id, "err", err)
		return
	}
	kw.mu.Lock()
	kw.idx.apply(batch)
	n := kw.idx.blocks()
	kw.mu.Unlock()
	kw.live.Store(true)
	k.showBlocks(kw, n)
	if k.events != nil {
		var stored, removed, cleared int
		for _, ev := range batch.events {
			switch {
			case ev.skip:
			case ev.kind == kvStored:
				stored += len(ev.hashes)
			case ev.kind == kvRemoved:
				removed += len(ev.hashes)
			case ev.kind == kvCleared:
				cleared++
			}
		}
		for event, n := range map[string]int{"stored": stored, "removed": removed, "cleared": cleared} {
			if n > 0 {
				k.events.WithLabelValues(k.model, kw.id, event).Add(float64(n))
			}
		}
	}
}

func (k *KVAware) reset(kw *kvWorker) {
	kw.mu.Lock()
	kw.idx.clear()
	kw.mu.Unlock()
	k.showBlocks(kw, 0)
}

// gone reports whether kw left the pool: its series were deleted and must not come back.
func (kw *kvWorker) gone() bool {
	select {
	case <-kw.stop:
		return true
	default:
		return false
	}
}

// count counts one event of kw that is not a block's: a publisher that started over
// ("restarted") or a gap no replay filled ("lost").
func (k *KVAware) count(kw *kvWorker, event string) {
	if kw.gone() {
		return
	}
	if k.events != nil {
		k.events.WithLabelValues(k.model, kw.id, event).Inc()
	}
}

func (k *KVAware) showBlocks(kw *kvWorker, n int) {
	if kw.gone() {
		return
	}
	if k.blocks != nil {
		k.blocks.WithLabelValues(k.model, kw.id).Set(float64(n))
	}
}

// kvReplayTimeout bounds one catch-up from a replay socket.
const kvReplayTimeout = 2 * time.Second

// catchUp asks kw's replay socket for the batches after last and before seq and applies them.
// If it cannot get all of them, it empties kw's index: what the engine holds is then unknown,
// and the events from seq on rebuild it. It returns the last sequence number applied.
func (k *KVAware) catchUp(ctx context.Context, kw *kvWorker, last, seq int64, batch *kvBatch) int64 {
	if kw.replay != "" {
		last = k.replay(ctx, kw, last, seq, batch)
	}
	if last < seq-1 {
		k.logger.Warn("kv_aware: missed events; the worker's index starts over", "worker", kw.id, "missed", seq-1-last)
		k.reset(kw)
		k.count(kw, "lost")
	}
	return seq - 1
}

// replay asks kw's replay socket for the batches after last and before seq, applies them in
// order, and returns the last sequence number applied. It stops at the end of what the socket
// has, at an error, or after kvReplayTimeout.
func (k *KVAware) replay(ctx context.Context, kw *kvWorker, last, seq int64, batch *kvBatch) int64 {
	ctx, cancel := context.WithTimeout(ctx, kvReplayTimeout)
	defer cancel()
	d := zmq4.NewDealer(ctx, zmq4.WithDialerMaxRetries(0), zmq4.WithLogger(log.New(io.Discard, "", 0)))
	defer d.Close()
	if err := d.Dial(kw.replay); err != nil {
		return last
	}
	start := make([]byte, 8)
	binary.BigEndian.PutUint64(start, uint64(last+1))
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start)); err != nil {
		return last
	}
	for last < seq-1 {
		msg, err := d.Recv()
		if err != nil || len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 || len(msg.Frames[2]) == 0 {
			return last // an error, or the end of what the publisher still has
		}
		s := int64(binary.BigEndian.Uint64(msg.Frames[1]))
		if s < 0 {
			return last
		}
		if s == last+1 {
			k.applyPayload(kw, msg.Frames[2], batch)
			last = s
		}
	}
	return last
}

// promptTokens returns r's prompt as the engines' token ids, asked of the /tokenize endpoint of
// one worker that publishes events, is healthy and admits requests: those below their
// concurrency limit first, taken in turn, so the tokenizing is spread over the fleet and spares a
// worker that is busy. nil when there is none or the call fails.
func (k *KVAware) promptTokens(ctx context.Context, r *Request, workers []*Worker, kws []*kvWorker) []uint64 {
	w := k.tokenizer(workers, kws)
	if w == nil {
		return nil
	}
	ids, err := k.tokenize(ctx, w, r)
	if err != nil {
		k.logger.Debug("kv_aware: tokenize failed", "worker", w.ID(), "err", err)
		return nil
	}
	return ids
}

// tokenizer returns the worker to ask for the next request's token ids (see promptTokens), or
// nil.
func (k *KVAware) tokenizer(workers []*Worker, kws []*kvWorker) *Worker {
	var free, busy []*Worker
	for i, w := range workers {
		if kws[i] == nil || !kws[i].live.Load() || !w.Healthy() || w.CircuitOpen() {
			continue
		}
		if w.InFlight() < w.MaxConcurrency() {
			free = append(free, w)
		} else {
			busy = append(busy, w)
		}
	}
	if len(free) == 0 {
		free = busy
	}
	if len(free) == 0 {
		return nil
	}
	return free[k.tokenizeTurn.Add(1)%uint64(len(free))]
}

// kvMaxTokenizeBody bounds a /tokenize answer.
const kvMaxTokenizeBody = 16 << 20

func (k *KVAware) tokenize(ctx context.Context, w *Worker, r *Request) ([]uint64, error) {
	var payload any
	if len(r.Messages) > 0 {
		// vLLM's TokenizeChatRequest: the engine renders the messages with its chat template,
		// as its /v1/chat/completions does, so the ids are those whose blocks it caches.
		payload = struct {
			Model               string          `json:"model"`
			Messages            json.RawMessage `json:"messages"`
			AddGenerationPrompt bool            `json:"add_generation_prompt"`
		}{w.EngineModel(r.Model), r.Messages, true}
	} else {
		payload = map[string]string{
			"model": w.EngineModel(r.Model),
			// vLLM reads prompt, llama-server content.
			"prompt":  r.Prompt,
			"content": r.Prompt,
		}
	}
	body, err := json.Marshal(payload)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, k.cfg.TokenizeTimeout)
	defer cancel()
	u := w.URL().JoinPath(k.cfg.TokenizePath)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	w.Authorize(req.Header)
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("tokenize: status %d", resp.StatusCode)
	}
	body, err = io.ReadAll(io.LimitReader(resp.Body, kvMaxTokenizeBody))
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	var out struct {
		Tokens json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	return parseTokenIDs(out.Tokens)
}

// parseTokenIDs reads a JSON array of token ids (unsigned integers), valid JSON already, by
// hand: encoding/json's reflection took half of a /tokenize call's time for 1024 ids.
func parseTokenIDs(raw []byte) ([]uint64, error) {
	i := 0
	ws := func() {
		for i < len(raw) && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	ws()
	if i >= len(raw) || raw[i] != '[' {
		return nil, errors.New("tokenize: tokens is not an array")
	}
	i++
	ids := make([]uint64, 0, len(raw)/4)
	for {
		ws()
		if i < len(raw) && raw[i] == ']' && len(ids) == 0 {
			return ids, nil
		}
		start := i
		var v uint64
		for ; i < len(raw) && raw[i] >= '0' && raw[i] <= '9'; i++ {
			d := uint64(raw[i] - '0')
			if v > (math.MaxUint64-d)/10 {
				return nil, errors.New("tokenize: a token id overflows 64 bits")
			}
			v = 10*v + d
		}
		if i == start {
			return nil, errors.New("tokenize: a token id is not an unsigned integer")
		}
		ids = append(ids, v)
		ws()
		switch {
		case i < len(raw) && raw[i] == ',':
			i++
		case i < len(raw) && raw[i] == ']':
			return ids, nil
		default:
			return nil, errors.New("tokenize: a token id is not an unsigned integer")
		}
	}
}

// Pick implements Policy; see KVAware for what it costs.
func (k *KVAware) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	w, route, _ := k.pickLearning(ctx, r, workers)
	return w, route
}

// pickLearning implements outcomeLearner: the fallback's picks learn as cache_aware's do; the
// event-driven picks predict nothing (the events already are the engine's truth). It routes by
// the token ids r.Prepared holds: without them, as cache_aware.
func (k *KVAware) pickLearning(ctx context.Context, r choice, workers []*Worker) (*Worker, Route, prediction) {
	if k.scope != CacheScopeGlobal {
		return k.fallback.pickLearning(ctx, r, workers)
	}
	kws, anyLive := k.kvWorkers(workers)
	if !anyLive {
		return k.fallback.pickLearning(ctx, r, workers)
	}
	w, route, wait := k.pickByEvents(r, workers, kws, r.Prepared.tokens)
	switch {
	case wait:
		return nil, "", prediction{}
	case w != nil:
		return w, route, prediction{}
	}
	return k.fallback.pickLearning(ctx, r, workers)
}

// prepare implements preparer: it asks for r's token ids (see promptTokens) before r waits, once
// per request (Prepared keeps them for its retries), so that its picks do no I/O.
func (k *KVAware) prepare(ctx context.Context, r choice, workers []*Worker) Prepared {
	found := r.Prepared
	if k.scope != CacheScopeGlobal || found.tokenized {
		return found
	}
	if kws, anyLive := k.kvWorkers(workers); anyLive {
		found.tokens, found.tokenized = k.promptTokens(ctx, r.Request, workers, kws), true
	}
	return found
}

// kvWorkers returns the event state of each of workers (nil for one without), and whether any
// of them publishes events now.
func (k *KVAware) kvWorkers(workers []*Worker) (kws []*kvWorker, anyLive bool) {
	kws = make([]*kvWorker, len(workers))
	k.mu.Lock()
	defer k.mu.Unlock()
	for i, w := range workers {
		kws[i] = k.workers[w.ID()]
		anyLive = anyLive || kws[i] != nil && kws[i].live.Load()
	}
	return kws, anyLive
}

// learn implements outcomeLearner: the fallback learns from its own picks (an event-driven pick
// predicted nothing, so it learns nothing).
func (k *KVAware) learn(p prediction, o Outcome) { k.fallback.learn(p, o) }

// pickByEvents chooses among the eligible workers whose events show at least KVAwareConfig.Threshold
// of the prompt's tokens held (one block when it is 0); nil when none does. It reports wait
// instead when a worker at its limit holds at least half the prompt more than that choice (see
// KVAwareConfig.HolderWait): the request is better off waiting for a slot there than computing
// that half again elsewhere.
func (k *KVAware) pickByEvents(r choice, workers []*Worker, kws []*kvWorker, tokens []uint64) (w *Worker, route Route, wait bool) {
	if len(tokens) == 0 {
		return nil, "", false
	}
	need := max(int64(math.Ceil(k.cfg.Threshold*float64(len(tokens)))), 1)
	type held struct {
		candidate
		tokens int64
	}
	best, light := held{candidate: candidate{i: -1}}, held{candidate: candidate{i: -1}}
	minLoad, maxLoad := int64(math.MaxInt64), int64(-1)
	var holders []held
	// full: the holder of the most among the workers at their limit that may take the request
	// once a slot frees there.
	full := held{candidate: candidate{i: -1}}
	// The prompt's block keys, hashed once for all the workers of one block size (keysOf).
	var hasher kvHasher
	var keys []uint64
	keysOf := 0
	for i, w := range workers {
		eligible := r.Eligible(w)
		if !eligible && !r.mayWaitFor(w) {
			continue
		}
		load := w.InFlight()
		if eligible {
			minLoad, maxLoad = min(minLoad, load), max(maxLoad, load)
		}
		kw := kws[i]
		if kw == nil || !kw.live.Load() {
			continue
		}
		kw.mu.RLock()
		if bs := kw.idx.blockSize; bs != keysOf {
			keys, keysOf = hasher.blockKeys(keys[:0], tokens, bs), bs
		}
		n := int64(kw.idx.matchKeys(keys) * keysOf)
		kw.mu.RUnlock()
		h := held{candidate: candidate{i: i, load: load, tokens: w.InFlightTokens()}, tokens: n}
		switch {
		case !eligible:
			if n > full.tokens {
				full = h
			}
		case n >= need:
			holders = append(holders, h)
		}
	}
	imbalanced := k.fallback.overloaded(maxLoad, minLoad)
	better := func(a, b held) bool { // more of the prompt held, then lighter
		if a.tokens != b.tokens {
			return a.tokens > b.tokens
		}
		return a.lighter(b.candidate)
	}
	for _, h := range holders {
		if best.i < 0 || better(h, best) {
			best = h
		}
		if !k.fallback.overloaded(h.load, minLoad) && (light.i < 0 || better(h, light)) {
			light = h
		}
	}
	chosen, route := best, RouteKVHit
	switch {
	case len(holders) == 0:
		chosen, route = held{candidate: candidate{i: -1}}, ""
	case !imbalanced || light.i == best.i:
	case light.i >= 0:
		chosen, route = light, RouteKVRebalance
	default:
		chosen, route = held{candidate: candidate{i: -1}}, "" // every holder is overloaded: the fallback balances
	}
	if len(keys) > 0 {
		// A worker that would be overloaded among the eligible ones is not waited for.
		worth := full.i >= 0 && full.tokens >= need && 2*(full.tokens-chosen.tokens) >= int64(len(tokens)) &&
			(minLoad == math.MaxInt64 || !k.fallback.overloaded(full.load, minLoad))
		if k.waitFor(keys[len(keys)-1], worth) {
			return nil, "", true
		}
	}
	if chosen.i < 0 {
		return nil, "", false
	}
	return workers[chosen.i], route, false
}

// kvMaxWaits is the number of waiting prompts past which waitFor sweeps out those whose wait
// is over.
const kvMaxWaits = 256

// waitFor reports whether the prompt whose last full block has key should wait for its holder:
// when worth it and its first wait began less than HolderWait ago. A prompt that no longer
// waits is forgotten, so the next request of the same prompt has its own wait. Safe for
// concurrent use; one lock, and a sweep of the waiting prompts now and then.
func (k *KVAware) waitFor(key uint64, worth bool) bool {
	if k.cfg.HolderWait < 0 {
		return false
	}
	k.waitMu.Lock()
	defer k.waitMu.Unlock()
	since, waiting := k.waits[key]
	if !worth {
		if waiting {
			delete(k.waits, key)
		}
		return false
	}
	now := k.now()
	if !waiting {
		if len(k.waits) >= kvMaxWaits {
			for p, t := range k.waits {
				if now.Sub(t) >= k.cfg.HolderWait {
					delete(k.waits, p)
				}
			}
		}
		k.waits[key] = now
		return true
	}
	return now.Sub(since) < k.cfg.HolderWait
}

// HeldBlocks returns the blocks the events say worker id holds and whether it publishes
// events at all, for tests and metrics. Safe for concurrent use.
func (k *KVAware) HeldBlocks(id string) (blocks int, live bool) {
	k.mu.Lock()
	kw := k.workers[id]
	k.mu.Unlock()
	if kw == nil {
		return 0, false
	}
	kw.mu.RLock()
	defer kw.mu.RUnlock()
	return kw.idx.blocks(), kw.live.Load()
}
