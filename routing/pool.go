package routing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Errors of Pick; callers branch on them with errors.Is.
var (
	// ErrUnknownModel: no worker of the pool serves the request's model (HTTP 404).
	ErrUnknownModel = errors.New("no worker serves this model")
	// ErrNoWorker: workers serve the model but none may take the request now (HTTP 503).
	ErrNoWorker = errors.New("no eligible worker")
	// ErrNoRoom: a worker the request may use takes requests (healthy, not draining, circuit
	// closed, not in Request.Exclude) but none has room for it now: it may get one once room
	// frees (see Pool.OnRoom). An error wrapping it wraps ErrNoWorker too.
	ErrNoRoom = errors.New("no room on the workers the request may use")
	// ErrUnknownWorker: no worker of that ID (for Pick: none of the request's model has the ID in
	// Request.TargetWorker, HTTP 400; for the lifecycle methods, HTTP 404).
	ErrUnknownWorker = errors.New("unknown worker")
)

// Options are the dependencies of a Pool; every zero field has a working default.
type Options struct {
	Logger     *slog.Logger          // default: discard
	Registerer prometheus.Registerer // default: a private registry nobody scrapes
	Client     *http.Client          // for health checks and scrapes; default: one that keeps no connection alive
	Now        func() time.Time      // default: time.Now
	// Rand is the randomness of the policies. The pool serialises access to it; the default, nil,
	// uses the runtime's lock-free generator.
	Rand rand.Source
	// Pins keeps the pins of sticky_session and manual: a RedisStore when several gateways
	// share the fleet. Default: a MemoryPinStore.
	Pins PinStore
	// Drains shares drain state among gateway replicas (a RedisStore); nil keeps it local.
	Drains DrainStore
	// Prefixes shares what cache_aware routes among gateway replicas (a RedisStore); nil keeps
	// each replica's tree its own.
	Prefixes PrefixFeed
	// Resolver resolves the names of Config.Discovery; default net.DefaultResolver.
	Resolver Resolver
	// Registry keeps the workers added, changed and removed through the admin API for every
	// replica and across restarts (see WorkerRegistry); nil: such changes are this replica's
	// alone and last until it stops.
	Registry WorkerRegistry
	// Announcer tells the other replicas at once that the Registry changed (a RedisStore); nil:
	// they see the change at their next Config.RegistrySync.
	Announcer WorkerAnnouncer
	// Shares splits each worker's concurrency limit among the replicas by their demand (a
	// RedisStore; see SyncShares, which the gateway calls); nil: this replica places up to each
	// worker's whole limit.
	Shares ShareStore
	// InteractiveReserve is the share of the workers' limits, in requests and in tokens, that
	// the fleet's split (Shares) keeps out of every replica's share and lends to a replica, one
	// interactive request at a time, when one finds no room there (TakeReserve): the queue's
	// queue.interactive_reserve kept whole across the fleet, sized over the workers of the same
	// models as the queue sizes its own (sizeFleetReserves). 0: none, the split divides each
	// whole limit. Without Shares it does nothing.
	InteractiveReserve float64
}

// Request is what a policy knows about the request it routes. Pick never modifies it; Prepare
// sets only Prepared. The protections a pick applies (the prefill budget, pieces, the workers an
// interactive request avoids) are the pool's, per pick, never the Request's (see choice).
type Request struct {
	Model        string
	Tenant       string
	Tier         string // the tier of the key the request came with, for CacheScopeTier
	SessionID    string // X-Session-ID
	RoutingKey   string // X-Usher-Routing-Key
	TargetWorker string // X-Usher-Target-Worker, already permitted by the gateway
	Prompt       string // the text the worker will prefill, for prefix-aware policies
	PromptTokens int    // estimate
	Tokens       int    // tokens the request holds in flight (prompt + max output)
	// Exclude lists worker IDs already tried for this request; a retry goes elsewhere.
	Exclude []string
	// Stage is the part of the request this pick places: StageWhole (the zero value) for a
	// model that is not disaggregated; StagePrefill or StageDecode, through PickStages, for one
	// that is (see Disaggregated). A whole request of a disaggregated model goes to a worker of
	// role both (with the vLLM protocol and none, to any of its workers).
	Stage Stage
	// Messages is a chat request's messages array as the client sent it (JSON), so kv_aware
	// has the engine apply its own chat template; nil for other requests. Never modified.
	Messages []byte
	// Interactive marks a request of the interactive class. While interactive requests are
	// present, a worker takes other requests only within ConcurrencyConfig.LowerPrefillTokens
	// of prompt being prefilled (the prefill budget), and their long prompts may go in pieces
	// (see Lease.PrefillPiece). (A worker prefilling an interactive prompt used to take no other
	// request until its first token: measured side by side, that rule moved neither the
	// interactive p99 nor batch's share beyond run-to-run noise, and was removed.)
	Interactive bool
	// Waiting is how many other requests for the model wait in the gateway's queue as this one
	// is placed (queue.Placer): the requests that work a placement adds to the pool delays.
	// cache_aware's predicted_ttft placement weighs it (see CacheAware).
	Waiting int
	// Prepared is what Pool.Prepare found for the request (its policy's I/O), which its picks
	// use instead of doing that I/O; the zero value: not prepared, which a pick routes as
	// though that I/O had failed. Only Prepare sets it.
	Prepared Prepared
}

// Outcome is what the gateway learnt from one request to the worker of a Lease.
type Outcome struct {
	// Failed: a connect error, a hung worker or a broken answer; the worker is suspect.
	Failed bool
	// Suspect: the worker answered with a server error (a 5xx status) that the request itself
	// may have caused: engines answer 500 to some input they cannot take, on every worker. It
	// counts as a failed request everywhere but in the circuit breaker, which counts it only
	// once the gateway confirms it (Pool.ConfirmFailure), when another worker has served the
	// same request; so no tenant's requests alone can open a worker's circuit. The half-open
	// probe's suspect answer counts at once: the probe decides the circuit.
	Suspect          bool
	PromptTokens     int
	CachedTokens     int // usage.prompt_tokens_details.cached_tokens
	CompletionTokens int
	// CacheReported: the engine reported CachedTokens (prompt_tokens_details was in its usage);
	// only then does a count of 0 mean the engine held nothing of the prompt.
	CacheReported bool
	// TTFT is the time from sending a streamed request to its first event; 0 when not streamed
	// or not measured. It feeds the worker's learned concurrency limit and its cost model.
	TTFT time.Duration
	// Answered is the time from sending the request to the end of its answer; 0 when not
	// measured. With TTFT and CompletionTokens it teaches the cost model the time per output
	// token (of a whole answer too, less the model's own TTFT).
	Answered time.Duration
	// Handoff, for a decode stage's lease (Request.Stage), is the time from sending the decode
	// to its first event beyond a prefill that ran beside it (the gateway's measure, as TTFT
	// less that prefill's time): the KV transfer, the engine's queue and its first step. It
	// teaches the worker's hand-off model (see PredictHandoffIdle); 0 when not measured.
	Handoff time.Duration
	// LongestGap, for a streamed answer, is the longest time between two of its events after the
	// first: while it decoded, the longest engine step it waited through (a step that prefilled
	// another prompt beside its decode, as a chunking engine runs them). 0 when not streamed.
	// It bounds what the cost model says one step takes (see Pool.checkObjective).
	LongestGap time.Duration
	// MedianGap, for a streamed answer of several tokens, is the median time between two of its
	// events after the first: one decode step of the batch it ran in (steps that prefilled
	// another prompt beside it are the fewer). 0 when not measured. It teaches the cost model
	// the worker's idle step (see PredictIdle).
	MedianGap time.Duration
	// UsageEstimated: the engine reported no usage and the tokens above are the gateway's
	// estimate; they feed the cache counters but not the learned token limit.
	UsageEstimated bool
}

// Lease is one request placed on a worker. Pick already counted it in the worker's in-flight
// requests and tokens; Release uncounts it.
type Lease struct {
	Worker *Worker
	Route  Route
	stage  Stage // the stage of the request it was placed for (Request.Stage)

	pool     *Pool
	policy   string
	tokens   int64
	probe    bool // the half-open probe of the worker's circuit breaker
	released atomic.Bool
	// prefilling: the request's first token has not come back (see Request.Interactive);
	// cleared once by Prefilled or Release. interactive says which of the worker's counts it is
	// in: its interactive prefills, or lowerTokens of its other prompt tokens in prefill.
	prefilling  atomic.Bool
	interactive bool
	lowerTokens int64
	piece       int
	// decoding: an interactive request past its first token, counted in its worker's
	// interactiveDecodes until Release (see AwaitDecodes).
	decoding atomic.Bool
	// piecesAtDecode is the worker's piecesSent when the decode began; besidePieces whether
	// it had moved when the decode ended (see DecodedBesidePieces).
	piecesAtDecode atomic.Int64
	besidePieces   atomic.Bool
	// behindLower: an interactive request placed while the worker had lower-class prompt tokens
	// in prefill from this replica (see BehindLowerPrefill).
	behindLower bool
	// mark is the Seq of the interactive prefill's mark told to the fleet (see fleetPrefills);
	// 0: none was.
	mark uint64
	// budgeted: a lower-class request placed while interactive ones were present, whose prompt
	// counts against its worker's prefill budget until Prefilled (see YieldsPrefill).
	budgeted bool
	// learner, when not nil, is the policy that picked the worker and learns from the outcome
	// what it predicted (pred).
	learner outcomeLearner
	pred    prediction
	// namespace is the request's cache scope (CacheScope.namespace); "" when every request
	// shares the caches.
	namespace string
	// placed is the worker's load when the request was placed on it, coef its cost model's fit
	// then (see Predicted); prefillPrompt the prompt tokens it counts in the worker's
	// promptsInPrefill until its first token.
	placed        placement
	coef          costCoefficients
	prefillPrompt int64
	// decode: the lease is a decode stage's (Request.Stage), whose first event teaches its
	// worker's hand-off model; handoff is that model's fit when it was placed (see
	// PredictedHandoff), the zero value for other stages.
	decode  bool
	handoff handoffCoefficients
}

// BehindLowerPrefill reports whether the lease is an interactive request's placed while its
// worker was prefilling a lower-class prompt or piece this replica sent: the step it waits for
// at the engine may be that prefill (see Pool.JudgedInteractive).
func (l *Lease) BehindLowerPrefill() bool { return l.behindLower }

// Stage is the stage of the request the lease was placed for (Request.Stage).
func (l *Lease) Stage() Stage { return l.stage }

// YieldsPrefill reports whether the lease is a standard or batch request placed while
// interactive requests were present: its prompt holds its worker's budget for lower-class
// prefill (ConcurrencyConfig.LowerPrefillTokens) until Prefilled is called, so whoever sends it
// should see its first token (ask for a stream) rather than call Prefilled only at its end; and
// it yields to interactive prompts in prefill on its worker (see AwaitInteractive).
func (l *Lease) YieldsPrefill() bool { return l.budgeted }

// Release ends the lease with the request's outcome: it uncounts the in-flight request and
// tokens and feeds health and metrics. Call it exactly once; later calls do nothing. Safe for
// concurrent use.
func (l *Lease) Release(o Outcome) {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	w, p := l.Worker, l.pool
	held := o.Suspect && !l.probe // the breaker waits for ConfirmFailure
	o.Failed = o.Failed || o.Suspect
	w.release(l.tokens)
	l.endPrefill()
	l.endDecode()
	if l.piece == 0 {
		// A prompt sent in pieces waited between them for interactive prompts: its times are
		// usher's, not the engine's.
		var handoff *handoffCoefficients
		if l.decode {
			handoff = &l.handoff
		}
		w.cost.observeStage(l.placed, w.placementNow(w.inFlight.Load()).running, o, handoff)
	}
	if l.decode && !o.Failed && !o.UsageEstimated {
		w.handoff.observe(l.placed.running, o.PromptTokens, o.Handoff)
	}
	defer p.roomOn(w)
	if o.TTFT > 0 && !w.fixed {
		w.learner.observeTTFT(o.TTFT)
	}
	if !w.tokensFixed {
		w.learner.observeUsage(l.tokens, o)
	}
	tokens := o.PromptTokens > 0 || o.CachedTokens > 0
	series := p.metrics.seriesOf(w, l.policy, o.Failed, tokens)
	if o.Failed {
		series.outcomes[1].Inc()
	} else {
		series.outcomes[0].Inc()
	}
	if l.learner != nil {
		l.learner.learn(l.pred, o)
	}
	if tokens {
		w.promptTokens.Add(int64(o.PromptTokens))
		w.cachedTokens.Add(int64(o.CachedTokens))
		series.prompt.Add(float64(o.PromptTokens))
		series.cached.Add(float64(o.CachedTokens))
	}
	if !held {
		p.breakerDone(w, o.Failed, l.probe)
	}
}

// ConfirmFailure counts, in w's circuit breaker, a request w answered with a suspect server error
// (Outcome.Suspect) that another worker has since served: the error was w's, not the request's.
// Call it at most once per such answer. Safe for concurrent use.
func (p *Pool) ConfirmFailure(w *Worker) { p.breakerDone(w, true, false) }

// breakerDone records one request's end in w's circuit breaker, and tells of a change.
func (p *Pool) breakerDone(w *Worker, failed, probe bool) {
	switch w.breaker.done(failed, probe) {
	case breakerOpened:
		p.changes.notify()
		p.metrics.breakerOpens.WithLabelValues(w.spec.ID).Inc()
		p.logger.Warn("worker circuit open", "worker", w.spec.ID, "consecutive_failures", w.breaker.failures.Load(), "cooldown", p.cfg.Breaker.Cooldown)
	case breakerClosed:
		p.changes.notify()
		p.logger.Info("worker circuit closed", "worker", w.spec.ID)
	}
}

// Tokens is what the request counts in its worker's tokens in flight (Request.Tokens) until the
// lease is released.
func (l *Lease) Tokens() int64 { return l.tokens }

// PieceLoad is the load of a lease's worker as one piece of the lease's prompt met it when it was
// sent (Lease.PieceSent), for Lease.PieceAnswered.
type PieceLoad struct{ placed placement }

// PieceSent is the load of the lease's worker as a piece of its prompt goes to the engine now:
// the other requests in flight there and the other prompts in prefill. Costs what a pick's
// prediction costs.
func (l *Lease) PieceSent() PieceLoad {
	w := l.Worker
	w.piecesSent.Add(1)
	pl := w.placementNow(w.inFlight.Load() - 1)
	if l.prefilling.Load() {
		pl.prefilling = max(pl.prefilling-float64(l.prefillPrompt), 0)
	}
	return PieceLoad{pl}
}

// PieceAnswered teaches the worker's cost model the answer to one piece of the lease's prompt,
// sent at load (PieceSent): o's TTFT is from sending the piece to its answer, its token counts
// the engine's usage for the piece (what it had cached of it: the pieces before). A piece is a
// request of its own to the engine, so its time is the engine's, while the lease's whole time
// holds the waits between its pieces and teaches nothing (see Release). Lower-class prompts sent
// in pieces are most of an engine's work beside a flood, so without them a model would learn
// from the interactive answers alone. Safe for concurrent use.
func (l *Lease) PieceAnswered(load PieceLoad, o Outcome) {
	w := l.Worker
	w.cost.observeStage(load.placed, w.placementNow(w.inFlight.Load()-1).running, o, nil)
}

// Heard tells the pool that bytes of the lease's answer came from its worker: an engine sends
// its sequences' tokens as each step ends, so this marks the end of one, which the cost model
// reads (see prefilledSinceStep). A clock read and an atomic load, a store at most every 100 µs:
// call it at every read from the worker. Safe for concurrent use, and after Release.
func (l *Lease) Heard() { l.Worker.stepEnded(l.Worker.cost.now().UnixNano()) }

// PrefillPiece is the size, in estimated prompt tokens, of the pieces in which the request's
// prompt should reach the engine: 0 to send it whole. An engine runs in steps and does not stop
// one: an interactive prompt that arrives waits for the step in progress, so a long lower-class
// prompt prefilled in one step delays it by that whole prefill. Sent in pieces, each one its own
// request that the engine's prefix cache keeps, the prompt holds each step only for a piece, and
// between pieces the request yields to interactive prompts (see AwaitInteractive); but an engine
// runs a step of few tokens less efficiently than one of many, so pieces cost throughput.
//
// So it is above zero for a standard or batch request picked while interactive requests are
// present, whose prompt is longer than a piece and a half (ConcurrencyConfig.PrefillPieceTokens,
// or the learnt size), on every worker. The lease counts one piece against the worker's
// lower-class prefill budget.
func (l *Lease) PrefillPiece() int { return l.piece }

// PrefillWhole tells the pool that the request's prompt, of promptTokens, goes to the engine
// whole after all, although PrefillPiece said pieces (the gateway could not cut it: token ids,
// content parts): it counts against its worker's prefill budget whole from now on, so the
// requests placed next see what the engine really prefills. Call it before the request is sent,
// from the goroutine that sends it; it does nothing for a lease whose prompt was not to go in
// pieces or whose prefill has ended.
func (l *Lease) PrefillWhole(promptTokens int) {
	if l.piece <= 0 || l.interactive || !l.prefilling.Load() {
		return
	}
	if extra := int64(max(promptTokens, 1)) - l.lowerTokens; extra > 0 {
		l.Worker.prefill.start(extra)
		l.lowerTokens += extra
	}
	l.piece = 0
}

// AwaitInteractive waits until no interactive prompt is being prefilled on the lease's worker,
// or ctx ends (its error then). A lower-class request placed while interactive requests were
// present (YieldsPrefill) calls it before each piece of its prompt and before the request
// itself, so an interactive prompt shares its engine step with no lower-class prefill.
func (l *Lease) AwaitInteractive(ctx context.Context) error {
	if l.Worker.interactivePrefilling() == 0 {
		// The common case, for every lower-class request: no lock, and no waiter left on
		// the broadcast for the next interactive first token to wake.
		return nil
	}
	for {
		ended := l.pool.interactivePrefilled.Wait()
		if l.Worker.interactivePrefilling() == 0 {
			return nil
		}
		select {
		case <-ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Prefilled tells the pool that the engine has prefilled the request: its first token came back.
// From then on an interactive request no longer holds the other classes off its worker (see
// Request.Interactive). Safe to call more than once, and after Release.
func (l *Lease) Prefilled() {
	if l.endPrefill() {
		l.startDecode()
		l.pool.roomOn(l.Worker)
	}
}

// endPrefill clears the lease's interactive prefill, once; it reports whether it did.
func (l *Lease) endPrefill() bool {
	if !l.prefilling.CompareAndSwap(true, false) {
		return false
	}
	l.Worker.promptsInPrefill.Add(-l.prefillPrompt)
	if l.interactive {
		l.Worker.interactivePrefills.Add(-1)
		l.pool.interactivePrefilled.notify()
		if l.mark != 0 {
			l.pool.marks.ended(l.Worker, l.mark)
		}
	} else {
		l.Worker.prefill.done(l.lowerTokens)
	}
	return true
}

// modelSet is one model's workers and policy. It is immutable: membership changes build a new one
// that keeps the same policy. A disaggregated model's set holds its workers of role both (for
// whole requests) and the sets of its two stages (see splitStages).
type modelSet struct {
	policyName string
	policy     Policy
	workers    []*Worker          // in configuration order
	byID       map[string]*Worker // the same workers

	// prefill and decode are the stages' sets of a disaggregated model, with their own
	// policies; nil for a model that is not. protocol is its hand-off.
	prefill, decode *modelSet
	protocol        Protocol

	mu        sync.RWMutex                 // guards decisions
	decisions map[Route]prometheus.Counter // the children of poolMetrics.decisions (see decided)
}

// snapshot is everything Pick reads, replaced as a whole on every membership change.
type snapshot struct {
	models map[string]*modelSet // only models with at least one worker
	names  []string             // sorted keys of models
}

// Pool is the set of workers and the per-model policies. All methods are safe for concurrent use.
type Pool struct {
	cfg      Config
	logger   *slog.Logger
	client   *http.Client
	now      func() time.Time
	rand     randSource
	pins     PinStore
	drains   DrainStore     // nil: drain state is local
	prefixes PrefixFeed     // nil: cache_aware trees are per replica
	shares   *shares        // nil: no fleet split of the workers' limits
	marks    *fleetPrefills // nil: interactive prefills are counted per replica
	resolver Resolver
	metrics  *poolMetrics
	salts    saltCache
	// reserveShare is Options.InteractiveReserve with a ShareStore, else 0.
	reserveShare float64

	// registry and announcer share the admin API's workers (nil: local); see registry.go.
	registry  WorkerRegistry
	announcer WorkerAnnouncer
	// registryMu serialises the registry's syncs and the admin API's changes, so a sync that read
	// the registry before a change never undoes it.
	registryMu sync.Mutex

	snap atomic.Pointer[snapshot]
	// changes wakes the waiters of Changes; interactivePrefilled those of AwaitInteractive;
	// interactiveDecoded those of AwaitDecodes.
	changes, interactivePrefilled, interactiveDecoded broadcast
	// loans is told when a replica lent the fleet's reserve room (LoanMade).
	loans broadcast
	// room is told of the moments room may appear for a model's requests (see OnRoom).
	room atomic.Pointer[func(model string)]
	// lastInteractive is when an interactive request was last routed (unix ns; 0: never), and
	// interactiveGap the mean gap between them lately (ns; 0: none yet): see presence.go.
	lastInteractive, interactiveGap atomic.Int64
	// interactivePrompt is a moving average of the prompt tokens of the interactive requests
	// routed (estimates, as Request.PromptTokens), for the learnt prefill piece; 0: none yet.
	interactivePrompt atomic.Int64
	// pieceLogShare is the logarithm of the share of the objective's slack the learnt prefill
	// piece is (math.Float64bits; 0: the whole slack): see JudgedInteractive.
	pieceLogShare atomic.Uint64
	// paceShareBits is the share of the pace of pieces beside interactive decodes, as
	// math.Float64bits, in [0, 1] (see JudgedDecode); 0 at the start.
	paceShareBits atomic.Uint64

	mu       sync.Mutex            // guards everything below, and serialises writers of snap
	workers  []*Worker             // all workers, in the order they were added
	policies map[policyKey]*policy // by model and stage; a model keeps its policies while it has no workers
	runCtx   context.Context       // set by Run; nil before
	stopped  bool                  // Run's ctx ended: no goroutine starts any more
	running  sync.WaitGroup        // goroutines started under runCtx (per worker and per policy)
}

type policy struct {
	name string
	Policy
}

// policyKey names the policy of one model's stage (StageWhole: the model's own).
type policyKey struct {
	model string
	stage Stage
}

// NewPool builds a pool from cfg (defaults applied to a copy, then validated). Health checks
// start with Run; until its first check a worker counts as healthy.
func NewPool(cfg Config, opts Options) (*Pool, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pool{
		cfg:      cfg,
		logger:   opts.Logger,
		client:   opts.Client,
		now:      opts.Now,
		rand:     runtimeRand{},
		policies: make(map[policyKey]*policy),
	}
	if p.logger == nil {
		p.logger = slog.New(slog.DiscardHandler)
	}
	if p.client == nil {
		// Health checks and scrapes keep no connection open between them: an idle keep-alive
		// connection holds one of an engine's HTTP threads (llama-server has n_parallel + 4),
		// which the engine's own clients then wait for.
		p.client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
	}
	if p.now == nil {
		p.now = time.Now
	}
	if opts.Rand != nil {
		p.rand = &lockedRand{src: opts.Rand}
	}
	p.drains = opts.Drains
	p.registry, p.announcer = opts.Registry, opts.Announcer
	p.prefixes = opts.Prefixes
	p.resolver = opts.Resolver
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if opts.Shares != nil {
		p.shares = &shares{store: opts.Shares, fleet: map[string]*workerFleet{}, started: p.now()}
		p.shares.calls, _ = opts.Shares.(RoomCalls)
		p.reserveShare = min(max(opts.InteractiveReserve, 0), 1)
		if f, ok := opts.Shares.(PrefillMarks); ok {
			p.marks = newFleetPrefills(p, f)
		}
	}
	p.pins = opts.Pins
	if p.pins == nil {
		p.pins = NewMemoryPinStore(p.now, cfg.MaxPinsPerTenant)
	}
	p.metrics = newPoolMetrics(p)
	for _, spec := range cfg.Workers {
		w, err := newWorker(spec, cfg, p.now)
		if err != nil {
			return nil, fmt.Errorf("worker %q: %w", spec.ID, err)
		}
		w.source = SourceConfig
		p.joinShares(w)
		p.workers = append(p.workers, w)
	}
	for name := range cfg.Models {
		if _, err := p.policyFor(name, StageWhole); err != nil {
			return nil, err
		}
	}
	if err := p.publish(); err != nil {
		return nil, err
	}
	reg := opts.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if err := p.metrics.register(reg); err != nil {
		return nil, fmt.Errorf("register routing metrics: %w", err)
	}
	return p, nil
}

// policyFor returns the policy of model's stage, building it on first use: the model's policy
// for StageWhole, the disaggregation's prefill or decode policy for the others, each with the
// model's parameters. p.mu must be held (or p not yet shared).
func (p *Pool) policyFor(model string, stage Stage) (*policy, error) {
	key := policyKey{model, stage}
	if pol, ok := p.policies[key]; ok {
		return pol, nil
	}
	mc, ok := p.cfg.Models[model]
	if !ok {
		mc.SetDefaults()
	}
	if mc.Policy == "" {
		mc.Policy = p.cfg.Policy
	}
	field := "policy"
	switch stage {
	case StagePrefill:
		mc.Policy, field = p.disaggregation(model).PrefillPolicy, "disaggregation.prefill_policy"
	case StageDecode:
		mc.Policy, field = p.disaggregation(model).DecodePolicy, "disaggregation.decode_policy"
	}
	impl, err := newPolicy(mc.Policy, p.policyEnv(model, mc))
	if err != nil {
		return nil, fmt.Errorf("routing.models[%q].%s: %w", model, field, err)
	}
	pol := &policy{name: mc.Policy, Policy: impl}
	p.policies[key] = pol
	p.startPolicy(pol)
	return pol, nil
}

func (p *Pool) policyEnv(model string, mc ModelConfig) policyEnv {
	return policyEnv{model: model, cfg: mc, now: p.now, rand: p.rand, logger: p.logger, maxAge: p.cfg.Scrape.MaxAge, pins: p.pins, prefixes: p.prefixes, metrics: p.metrics, scope: p.cfg.CacheScope}
}

// publish builds a new snapshot from p.workers, tells the policies that keep per-worker state,
// and then makes it visible to Pick. p.mu must be held (or p not yet shared).
func (p *Pool) publish() error {
	s := &snapshot{models: make(map[string]*modelSet)}
	for _, w := range p.workers {
		for _, m := range w.spec.Models {
			ms := s.models[m]
			if ms == nil {
				pol, err := p.policyFor(m, StageWhole)
				if err != nil {
					return err
				}
				ms = &modelSet{policyName: pol.name, policy: pol.Policy, byID: make(map[string]*Worker)}
				s.models[m] = ms
				s.names = append(s.names, m)
			}
			ms.workers = append(ms.workers, w)
			ms.byID[w.spec.ID] = w
		}
	}
	sort.Strings(s.names)
	for model, ms := range s.models {
		if err := p.splitStages(model, ms); err != nil {
			return err
		}
	}
	for key, pol := range p.policies {
		if o, ok := pol.Policy.(workersObserver); ok {
			var ws []*Worker
			if ms := s.models[key.model]; ms != nil {
				if set := ms.stageSet(key.stage); set != nil {
					ws = set.workers
				}
			}
			o.WorkersChanged(ws)
		}
	}
	p.snap.Store(s)
	p.changes.notify()
	return nil
}

// Models returns the sorted names of the models at least one worker serves. The slice is shared:
// callers must not modify it.
func (p *Pool) Models() []string { return p.snap.Load().names }

// Serves reports whether at least one worker serves model.
func (p *Pool) Serves(model string) bool { return p.snap.Load().models[model] != nil }

// Ready reports whether at least one worker is healthy and not draining.
func (p *Pool) Ready() bool {
	for _, ms := range p.snap.Load().models {
		for _, w := range ms.allWorkers() {
			if w.Healthy() && !w.Draining() {
				return true
			}
		}
	}
	return false
}

// every calls fn at once and then every interval until ctx ends; it is the loop of each
// background goroutine of the pool and its policies.
func every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		fn(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxAcquireAttempts bounds how often Pick asks the policy again after losing the race for a
// worker's last slot to a concurrent Pick.
const maxAcquireAttempts = 3

// Pick chooses a worker for r with its model's policy (or the worker r.TargetWorker names) and
// counts the request in flight there. Errors wrap ErrUnknownModel, ErrUnknownWorker or
// ErrNoWorker; ErrNoRoom too when a worker r may use takes requests but is full, so r may get
// it once room frees.
//
// Pick never modifies r, takes no lock and does no I/O: the policy works only from what Prepare
// found (r.Prepared). A request not prepared is routed as though its policy's I/O had failed:
// sticky_session and manual hash its key onto the workers, as when the pin store is down (no
// pin is read, made or moved), and kv_aware routes it as cache_aware, as when /tokenize fails.
// It is not refused: a missed Prepare costs the route its quality (the pin, the engine's
// cache), never the request, and a caller whose policy does no I/O (most) needs no Prepare at
// all. Safe for concurrent use, but not with a Prepare of r.
func (p *Pool) Pick(ctx context.Context, r *Request) (*Lease, error) {
	ms := p.snap.Load().models[r.Model]
	if ms == nil {
		return nil, fmt.Errorf("model %q: %w", r.Model, ErrUnknownModel)
	}
	all := ms
	if ms = ms.stageSet(r.Stage); ms == nil {
		return nil, fmt.Errorf("model %q is not disaggregated, no %s stage: %w", r.Model, r.Stage, ErrNoWorker)
	}
	c := choice{Request: r, Prepared: r.Prepared}
	if r.Stage != StageDecode {
		// A decode worker prefills nothing: the prefill protections are the prefill pool's.
		p.protect(&c, ms.workers)
	}
	target := r.TargetWorker
	if target != "" && r.Stage != StageWhole && ms.byID[target] == nil && (all.prefill.byID[target] != nil || all.decode.byID[target] != nil) {
		// The target serves the model's other stage: this one picks by policy.
		target = ""
	}
	if target != "" {
		w := ms.byID[target]
		if w == nil {
			return nil, fmt.Errorf("worker %q for model %q: %w", r.TargetWorker, r.Model, ErrUnknownWorker)
		}
		if c.Eligible(w) {
			if ok, probe := w.tryAcquire(int64(r.Tokens), r.Interactive); ok {
				return p.lease(ms, w, RouteTarget, &c, probe), nil
			}
		}
		p.metrics.decided(ms, r.Model, "none")
		return nil, fmt.Errorf("target worker %q: %w", target, noWorker(r, w))
	}
	lp, _ := ms.policy.(outcomeLearner)
	for attempt := 1; ; attempt++ {
		var w *Worker
		var route Route
		var pred prediction
		if lp != nil {
			w, route, pred = lp.pickLearning(ctx, c, ms.workers)
		} else {
			w, route = ms.policy.Pick(ctx, c, ms.workers)
		}
		if w == nil && c.spread {
			// Every worker that could take it has an interactive prompt in prefill: any will do.
			c.spread = false
			attempt--
			continue
		}
		if w == nil {
			p.metrics.decided(ms, r.Model, "none")
			return nil, fmt.Errorf("model %q: %w", r.Model, noWorker(r, ms.workers...))
		}
		if ok, probe := w.tryAcquire(int64(r.Tokens), r.Interactive); ok {
			l := p.lease(ms, w, route, &c, probe)
			if lp != nil {
				l.learner, l.pred = lp, pred
			}
			return l, nil
		}
		if attempt == maxAcquireAttempts {
			p.metrics.decided(ms, r.Model, "none")
			return nil, fmt.Errorf("model %q: workers at capacity: %w", r.Model, noWorker(r, ms.workers...))
		}
		// Lost the race for w's last slot to a concurrent Pick: ask again without it.
		c.full = append(slices.Clip(c.full), w.spec.ID)
	}
}

// errNoRoom is the error of a request refused while a worker it may use is only full.
var errNoRoom = fmt.Errorf("%w: %w", ErrNoRoom, ErrNoWorker)

// noWorker is the error for r refused by workers: errNoRoom when r may get one of them by
// waiting (see Request.mayWaitFor), else ErrNoWorker. Costs a few atomic loads per worker.
func noWorker(r *Request, workers ...*Worker) error {
	if slices.ContainsFunc(workers, r.mayWaitFor) {
		return errNoRoom
	}
	return ErrNoWorker
}

// OnRoom sets fn to be told, with a model's name, each time room may have appeared for the
// requests of that model that Pick refused with ErrNoRoom, other than by a change Changes tells
// of: a lease released on a worker of the model, a prefill ended there. The gateway has the
// model's queue place its requests again. fn runs on the goroutine that released the lease, so it
// must not block; nil stops the calls. Safe for concurrent use.
func (p *Pool) OnRoom(fn func(model string)) {
	if fn == nil {
		p.room.Store(nil)
		return
	}
	p.room.Store(&fn)
}

// roomOn tells OnRoom's function of room on w, for each of w's models.
func (p *Pool) roomOn(w *Worker) {
	if fn := p.room.Load(); fn != nil {
		for _, m := range w.Models() {
			(*fn)(m)
		}
	}
}

// lease places c's request on w, which tryAcquire already counted it on: it counts the request's
// prefill (interactive, or the lower classes' budget, whole or one piece) and notes an
// interactive one for the protections of the picks that follow.
func (p *Pool) lease(ms *modelSet, w *Worker, route Route, c *choice, probe bool) *Lease {
	r := c.Request
	p.metrics.decided(ms, r.Model, route)
	_, piece := c.prefillOn(w)
	l := &Lease{Worker: w, Route: route, stage: r.Stage, pool: p, policy: ms.policyName, tokens: int64(r.Tokens), probe: probe,
		interactive: r.Interactive, lowerTokens: prefillTokens(r.PromptTokens, piece), piece: piece, namespace: p.cfg.CacheScope.namespace(r),
		budgeted: c.prefillBudget > 0}
	// The load it was placed at: the worker's in-flight requests but this one.
	l.placed, l.coef = w.placementNow(w.inFlight.Load()-1), w.cost.coefficients()
	w.scopes.note(l.namespace)
	if r.Stage == StageDecode {
		// Its prompt is prefilled elsewhere: the lease holds no prefill here.
		l.decode, l.handoff = true, w.handoff.coefficients()
		return l
	}
	l.prefillPrompt = int64(min(max(r.PromptTokens, 0), maxCostTokens))
	now := p.now()
	if l.placed.running == 0 && l.placed.queued == 0 {
		// An idle engine begins a step with the request as it comes.
		w.stepEnded(now.UnixNano())
	}
	w.cost.arrivals.add(now, float64(l.prefillPrompt))
	w.promptsInPrefill.Add(l.prefillPrompt)
	l.prefilling.Store(true)
	if r.Interactive {
		l.behindLower = w.prefill.tokens.Load() > 0
		p.noteInteractive(now.UnixNano())
		p.observeInteractivePrompt(r.PromptTokens)
		w.interactivePrefills.Add(1)
		if p.marks != nil {
			l.mark = p.marks.began(w)
		}
	} else {
		w.prefill.start(l.lowerTokens)
	}
	return l
}

// Run runs the pool's background work until ctx ends, and returns when all of its goroutines have
// stopped: per worker, the active health checks and the scrape of its /metrics; per policy that
// has background work (see policyRunner), that work; with a DrainStore, following the drain state
// other replicas set; the removal of retired workers (Retire); per Config.Discovery entry, its DNS
// resolution; with a WorkerRegistry, following the workers added, changed and removed through
// the admin API on any replica (see SyncRegistry); with PrefillMarks, telling the fleet of this
// replica's interactive prefills and counting the others' (fleet_prefills.go). Workers added
// later get theirs at once. Call Run once.
func (p *Pool) Run(ctx context.Context) {
	p.mu.Lock()
	if p.runCtx != nil {
		p.mu.Unlock()
		panic("routing: Pool.Run called twice")
	}
	p.runCtx = ctx
	for _, w := range p.workers {
		p.startWorker(w)
	}
	for _, pol := range p.policies {
		p.startPolicy(pol)
	}
	if p.drains != nil {
		p.running.Go(func() { every(ctx, p.cfg.DrainSync, p.syncDrains) })
	}
	if p.marks != nil {
		p.running.Go(func() { p.marks.run(ctx) })
	}
	p.running.Go(func() { every(ctx, RetireSweep, p.removeRetired) })
	p.startRegistry(ctx)
	p.startDiscovery(ctx)
	p.mu.Unlock()

	<-ctx.Done()
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
	p.running.Wait()
}
