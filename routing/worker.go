package routing

import (
	"context"
	"maps"
	"net/url"
	"slices"
	"sync/atomic"
	"time"
)

// healthState is the verdict of the active health checks on one worker.
type healthState int32

const (
	// healthUnknown: no check has finished yet. The worker routes like a healthy one so a fresh
	// pool serves at once; the first check decides without a threshold.
	healthUnknown healthState = iota
	// healthUp: the last HealthyThreshold checks (or the first one) passed.
	healthUp
	// healthDown: the last UnhealthyThreshold checks (or the first one) failed; no new requests.
	healthDown
)

// Worker is one inference server of the pool. Its identity (ID, URL, models, caps) never changes;
// its counters and states are read and written atomically, so every method is safe for
// concurrent use and costs a few atomic loads.
type Worker struct {
	spec   WorkerSpec   // immutable; Models and ModelAliases are the worker's own copies
	source WorkerSource // immutable once the worker is in the pool
	url    *url.URL     // immutable
	// authorization is the Authorization header value of the worker's key, nil without one;
	// immutable, and shared read-only by every request to the worker (see Authorize).
	authorization []string

	// limit is the most requests the pool keeps in flight on the worker now: fixed by the
	// config (fixed), or learned by learner (see ConcurrencyConfig).
	limit   atomic.Int64
	fixed   bool // immutable
	learner *learner
	// peak is the most requests in flight since the learner's last step: whether the limit was
	// binding.
	peak atomic.Int64
	// tokenLimit is the most tokens (each request's prompt plus expected output) the pool keeps
	// in flight on the worker now: fixed by the worker's max_tokens_in_flight (tokensFixed), or
	// sized by learner from the KV cache the engine states (see ConcurrencyConfig), never above
	// routing.max_tokens_in_flight.
	tokenLimit  atomic.Int64
	tokensFixed bool // immutable

	// share is, with a ShareStore, the most requests this replica may keep in flight on the
	// worker, its part of the fleet's split of limit (see Pool.SyncShares); noShare without one.
	share atomic.Int64
	// reserve and reserveTokens are the room this replica took from the fleet's interactive
	// reserve of the worker (Pool.TakeReserve), which only its interactive requests use;
	// reserveAt is when it last took some (unix ns). SyncShares gives back what they no longer
	// use (settleReserve); only calls under shares.mu write them.
	reserve, reserveTokens, reserveAt atomic.Int64
	// fleetReserve is the requests of the worker's limit the fleet keeps as its interactive
	// reserve (Options.InteractiveReserve), as SyncShares last sized it (sizeFleetReserves).
	fleetReserve atomic.Int64
	// lent is the requests of its share this replica lends the fleet's interactive reserve of
	// the worker, as the store recorded them (Pool.LendReserve): its own requests do not use
	// them. lentAt is when it last lent one (unix ns). Only calls under shares.mu write them.
	lent, lentAt atomic.Int64
	// reserveGroup names the workers whose reserves are sized together (sizeFleetReserves):
	// those of the same role and model set. Set at creation, as spec.
	reserveGroup string
	// lowerSenders is, with a ShareStore, how many replicas of the fleet send the worker
	// standard or batch prompts, this one included, as the last exchange of shares told (see
	// Pool.SyncShares); 0 without one, or before the first exchange. The prefill budget and the
	// pieces are divided among them beyond two (choice.prefillOn).
	lowerSenders atomic.Int64

	inFlight       atomic.Int64
	inFlightTokens atomic.Int64
	// interactivePrefills counts the interactive requests on the worker whose first token has
	// not come back (see Request.Interactive); prefill counts the prompt tokens the other classes
	// have in prefill there (see prefill_budget.go).
	interactivePrefills atomic.Int64
	// interactiveDecodes counts this replica's interactive requests on the worker past their
	// first token and not yet released (see AwaitDecodes).
	interactiveDecodes atomic.Int64
	// piecesSent counts the lower-class pieces this replica sent the worker (see
	// DecodedBesidePieces).
	piecesSent atomic.Int64
	// fleetPrefills counts the other replicas' interactive requests in prefill on the worker, as
	// their marks told (see fleetPrefills); 0 without PrefillMarks.
	fleetPrefills atomic.Int64
	// interactiveHolds counts the holds of the worker for interactive requests (see
	// HoldForInteractive).
	interactiveHolds atomic.Int64
	prefill          lowerPrefill
	health           atomic.Int32 // a healthState
	draining         atomic.Bool
	// retiring: the worker is leaving the pool (Retire) and takes no new requests whatever the
	// shared drain state says; the pool removes it once nothing is in flight.
	retiring atomic.Bool
	breaker  breaker
	load     loadSignal
	// slots is the engine's own slots as it reported them (llama-server's /props total_slots),
	// 0: none reported; beyond them the engine queues (see cost.go).
	slots atomic.Int64
	// promptsInPrefill sums the prompt tokens (estimates) of the leases on the worker whose first
	// token has not come back, of every class.
	promptsInPrefill atomic.Int64
	// stepAt is when the worker's engine last ended a step as usher saw it (unix ns on the cost
	// model's clock; 0: never): bytes of an answer came back, or a request found it idle and
	// began one (see prefilledSinceStep).
	stepAt atomic.Int64
	// cost is the worker's cost model, learnt from its answers (see cost.go).
	cost *costModel
	// handoff is the worker's hand-off model, learnt from the decode stages it served (see
	// handoff.go).
	handoff *handoffModel
	// scopes is the cache scopes sent to the worker: whether its engine's cache holds any
	// scope's prompts but one's (see Lease.OwnCached).
	scopes scopeRecord

	// Cumulative usage the gateway saw on the worker's responses (Outcome).
	promptTokens atomic.Int64
	cachedTokens atomic.Int64
	// series are the worker's metric children (poolMetrics.seriesOf); nil until its first release.
	series atomic.Pointer[workerSeries]

	// checkPasses and checkFailures count consecutive check results, and checkErr says why the
	// last check failed; only the worker's own health goroutine touches them.
	checkPasses, checkFailures int
	checkErr                   error

	// stop ends the worker's background goroutines; guarded by Pool.mu.
	stop context.CancelFunc
}

func newWorker(spec WorkerSpec, cfg Config, now func() time.Time) (*Worker, error) {
	u, err := parseWorkerURL(spec.URL)
	if err != nil {
		return nil, err
	}
	spec.Models = slices.Clone(spec.Models)
	spec.ModelAliases = maps.Clone(spec.ModelAliases)
	if len(spec.ModelAliases) == 0 {
		// As a declaration stored as JSON reads back, so that an unchanged one compares equal.
		spec.ModelAliases = nil
	}
	w := &Worker{spec: spec, url: u, reserveGroup: reserveGroupOf(spec)}
	w.share.Store(noShare)
	if spec.APIKey != "" {
		w.authorization = []string{"Bearer " + spec.APIKey}
	}
	w.breaker = breaker{now: now, failuresToOpen: int64(cfg.Breaker.Failures), cooldown: cfg.Breaker.Cooldown}
	w.learner = newLearner(cfg.Concurrency, int64(cfg.MaxConcurrency), int64(cfg.MaxTokensInFlight))
	w.cost = newCostModel(now, cfg.Scrape.MaxAge, cfg.Concurrency.KVHold)
	w.handoff = newHandoffModel()
	if spec.MaxConcurrency > 0 {
		w.fixed = true
		w.limit.Store(int64(spec.MaxConcurrency))
	} else {
		w.limit.Store(w.learner.initial())
	}
	if spec.MaxTokensInFlight > 0 {
		w.tokensFixed = true
		w.tokenLimit.Store(int64(spec.MaxTokensInFlight))
	} else {
		w.tokenLimit.Store(w.learner.tokenLimit())
	}
	return w, nil
}

// ID is the worker's unique name.
func (w *Worker) ID() string { return w.spec.ID }

// interactivePrefilling is how many interactive requests are in prefill on the worker: this
// replica's and, with PrefillMarks, the other replicas' as their marks told. Cost: two atomic
// loads.
func (w *Worker) interactivePrefilling() int64 {
	return w.interactivePrefills.Load() + w.fleetPrefills.Load()
}

// URL is the worker's base URL; callers must not modify it.
func (w *Worker) URL() *url.URL { return w.url }

// Models are the models the worker serves; callers must not modify the slice.
func (w *Worker) Models() []string { return w.spec.Models }

// Role is the stages of a disaggregated model the worker serves (WorkerSpec.Role; "" is
// RoleBoth).
func (w *Worker) Role() Role {
	if w.spec.Role == "" {
		return RoleBoth
	}
	return w.spec.Role
}

// PriorityHandoff reports whether the worker schedules by vLLM's `priority` field.
func (w *Worker) PriorityHandoff() bool { return w.spec.PriorityHandoff }

// MaxConcurrency is the most requests the pool keeps in flight on the worker now: its configured
// max_concurrency, or the limit learned from its engine (see ConcurrencyConfig). One atomic load.
func (w *Worker) MaxConcurrency() int64 { return w.limit.Load() }

// LimitSource says whether MaxConcurrency is fixed by the config, reported by the engine or
// learned.
func (w *Worker) LimitSource() LimitSource {
	if w.fixed {
		return LimitConfig
	}
	return w.learner.source()
}

// SlotEngine reports whether the worker's engine said it runs a fixed number of slots
// (llama.cpp's server answering /props with total_slots), whether or not the config fixes the
// worker's limit. Such an engine notices a client that went away only between tokens of a
// stream, not while it computes a whole answer.
func (w *Worker) SlotEngine() bool { return w.learner.source() == LimitEngine }

// MaxTokensInFlight is the most tokens the pool keeps in flight on the worker now: its configured
// max_tokens_in_flight, or the size the learner gives it from the engine's KV cache (see
// ConcurrencyConfig). One atomic load.
func (w *Worker) MaxTokensInFlight() int64 { return w.tokenLimit.Load() }

// TokenLimitSource says whether MaxTokensInFlight is the config's (the worker's own value, or
// routing.max_tokens_in_flight when the engine states no KV cache size) or sized from the
// engine's KV cache (LimitEngine).
func (w *Worker) TokenLimitSource() LimitSource {
	if !w.tokensFixed && w.learner.statedKVTokens() > 0 {
		return LimitEngine
	}
	return LimitConfig
}

// InFlight is the number of leases on the worker not yet released.
func (w *Worker) InFlight() int64 { return w.inFlight.Load() }

// InFlightTokens is the sum of Request.Tokens of the leases on the worker not yet released.
func (w *Worker) InFlightTokens() int64 { return w.inFlightTokens.Load() }

// Healthy reports whether the health checks let the worker take requests (a worker not yet
// checked counts as healthy).
func (w *Worker) Healthy() bool { return healthState(w.health.Load()) != healthDown }

// Draining reports whether the worker takes no new requests while its in-flight ones finish:
// drained by an operator (on any replica) or retiring from the pool.
func (w *Worker) Draining() bool { return w.draining.Load() || w.retiring.Load() }

// CircuitOpen reports whether the worker's circuit breaker refuses requests now (open, or
// half-open with its probe in flight).
func (w *Worker) CircuitOpen() bool { return !w.breaker.admits() }

// takesRequests reports whether w takes requests at all: healthy, not draining, circuit closed.
// Whether it has room is another matter (see Request.Eligible).
func (w *Worker) takesRequests() bool {
	return w.Healthy() && !w.Draining() && w.breaker.admits()
}

// tryAcquire counts one more request of tokens in flight unless the worker is at its request cap
// (its limit, or this replica's share of it, and for an interactive request the room this
// replica holds of the fleet's reserve) or its circuit refuses it. probe says the request is the
// half-open probe of the circuit.
func (w *Worker) tryAcquire(tokens int64, interactive bool) (ok, probe bool) {
	probe, ok = w.breaker.acquire()
	if !ok {
		return false, false
	}
	for {
		n := w.inFlight.Load()
		if n >= w.capacityFor(interactive) {
			if probe {
				w.breaker.probing.Store(false)
			}
			return false, false
		}
		if w.inFlight.CompareAndSwap(n, n+1) {
			// A share lowered between the check and the count (SyncShares lowers it, then
			// reads the requests in flight as what it holds) must not be overrun: counted
			// first, checked again, the request is either within the share or seen by
			// SyncShares.
			if n+1 > w.capacityFor(interactive) {
				w.inFlight.Add(-1)
				if probe {
					w.breaker.probing.Store(false)
				}
				return false, false
			}
			w.inFlightTokens.Add(tokens)
			if n+1 > w.peak.Load() {
				w.peak.Store(n + 1)
			}
			return true, probe
		}
	}
}

func (w *Worker) release(tokens int64) {
	w.inFlight.Add(-1)
	w.inFlightTokens.Add(-tokens)
}
