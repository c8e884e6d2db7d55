package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// ErrWorkerExists: Add was given an ID the pool already has (HTTP 409). The other lifecycle
// methods fail with ErrUnknownWorker for an ID the pool does not have (HTTP 404).
var ErrWorkerExists = errors.New("worker already exists")

// WorkerState is the one-word state of a worker, most significant first.
type WorkerState string

const (
	StateDrained     WorkerState = "drained"      // draining and nothing in flight: safe to remove
	StateDraining    WorkerState = "draining"     // no new requests; in-flight ones finish
	StateUnhealthy   WorkerState = "unhealthy"    // failed its health checks; no new requests
	StateCircuitOpen WorkerState = "circuit_open" // its circuit breaker refuses requests
	StateHealthy     WorkerState = "healthy"      // takes requests
)

// WorkerStatus is a point-in-time view of one worker for the admin API and the console.
type WorkerStatus struct {
	ID              string      `json:"id"`
	URL             string      `json:"url"`
	Models          []string    `json:"models"`
	Role            Role        `json:"role"` // prefill, decode or both
	PriorityHandoff bool        `json:"priority_handoff"`
	CacheSalt       bool        `json:"cache_salt"` // the engine partitions its cache by salt
	State           WorkerState `json:"state"`
	InFlight        int64       `json:"in_flight"`
	InFlightTokens  int64       `json:"in_flight_tokens"`
	MaxConcurrency  int64       `json:"max_concurrency"`
	// LimitSource says whether MaxConcurrency is fixed by the config, reported by the engine
	// (its slots) or learned from its load and time to first token.
	LimitSource LimitSource `json:"limit_source"`
	// SlotEngine says the engine reported fixed slots (see Worker.SlotEngine).
	SlotEngine        bool  `json:"slot_engine"`
	MaxTokensInFlight int64 `json:"max_tokens_in_flight"`
	// TokenLimitSource says whether MaxTokensInFlight is the config's or sized from the KV cache
	// the engine states (engine).
	TokenLimitSource LimitSource `json:"token_limit_source"`
	// Load is what the worker last reported on /metrics; Load.At is zero if it never answered.
	Load LoadReport `json:"load"`
	// OthersInFlight estimates the requests on the worker this gateway did not send, e.g. other
	// replicas' (see Worker.OthersInFlight); 0 without a fresh reading.
	OthersInFlight int64 `json:"others_in_flight"`
	// Share is the most requests this replica may keep in flight on the worker: MaxConcurrency,
	// or, with a fleet's split (Shared, see ShareStore), this replica's share of it.
	Share  int64 `json:"share"`
	Shared bool  `json:"shared,omitempty"`
	// Reserve is the room this replica holds of the fleet's interactive reserve of the worker,
	// for its interactive requests only (see Pool.TakeReserve).
	Reserve int64 `json:"reserve,omitempty"`
	// PromptTokens and CachedTokens sum the usage of the worker's responses; their ratio is the
	// worker's prefix-cache hit rate as the gateway saw it.
	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`

	// Source says where the worker is declared: the config file, DNS discovery (both read-only
	// through the admin API when a WorkerRegistry is shared) or the admin API.
	Source WorkerSource `json:"source"`
}

// State is the worker's state now.
func (w *Worker) State() WorkerState {
	switch {
	case w.Draining() && w.InFlight() == 0:
		return StateDrained
	case w.Draining():
		return StateDraining
	case !w.Healthy():
		return StateUnhealthy
	case !w.breaker.admits():
		return StateCircuitOpen
	}
	return StateHealthy
}

func (w *Worker) status() WorkerStatus {
	st := WorkerStatus{
		ID:                w.spec.ID,
		URL:               w.spec.URL,
		Source:            w.source,
		Models:            slices.Clone(w.spec.Models),
		Role:              w.Role(),
		PriorityHandoff:   w.spec.PriorityHandoff,
		CacheSalt:         w.IsolatesCache(),
		State:             w.State(),
		InFlight:          w.InFlight(),
		InFlightTokens:    w.InFlightTokens(),
		MaxConcurrency:    w.limit.Load(),
		LimitSource:       w.LimitSource(),
		SlotEngine:        w.SlotEngine(),
		MaxTokensInFlight: w.tokenLimit.Load(),
		TokenLimitSource:  w.TokenLimitSource(),
		Load:              w.Load(),
		PromptTokens:      w.promptTokens.Load(),
		CachedTokens:      w.cachedTokens.Load(),
	}
	st.Share, st.Shared = w.Share()
	st.Reserve = w.reserve.Load()
	return st
}

// Workers returns the status of every worker, in the order they were added.
func (p *Pool) Workers() []WorkerStatus {
	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	out := make([]WorkerStatus, len(workers))
	now := p.now()
	for i, w := range workers {
		out[i] = w.status()
		out[i].OthersInFlight = w.OthersInFlight(now, p.cfg.Scrape.MaxAge)
	}
	return out
}

// Worker returns the status of the worker id, or an error wrapping ErrUnknownWorker.
func (p *Pool) Worker(id string) (WorkerStatus, error) {
	w, err := p.find(id)
	if err != nil {
		return WorkerStatus{}, err
	}
	st := w.status()
	st.OthersInFlight = w.OthersInFlight(p.now(), p.cfg.Scrape.MaxAge)
	return st, nil
}

// Add puts a new worker of this replica's own configuration in the pool (a config reload adds
// with it; workers added through the admin API go through AddWorker). It takes requests at once
// (like a worker of the config, it counts as healthy until its first health check, which starts
// at once if Run is running). Errors name the field ("worker.url: ...") or wrap ErrWorkerExists.
func (p *Pool) Add(spec WorkerSpec) error { return p.add(spec, SourceConfig) }

func (p *Pool) add(spec WorkerSpec, source WorkerSource) error {
	if errs := validateWorker("worker", spec); len(errs) > 0 {
		return errors.Join(errs...)
	}
	w, err := newWorker(spec, p.cfg, p.now)
	if err != nil {
		return err
	}
	w.source = source
	p.joinShares(w)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.indexOf(spec.ID) >= 0 {
		return fmt.Errorf("worker %q: %w", spec.ID, ErrWorkerExists)
	}
	prev := p.workers
	// A new slice: the metrics collector and Workers may still read the old one.
	p.workers = append(slices.Clip(p.workers), w)
	if err := p.publish(); err != nil {
		p.workers = prev
		return err
	}
	p.startWorker(w)
	p.logger.Info("worker added", "worker", spec.ID, "url", spec.URL, "models", spec.Models, "source", source)
	return nil
}

// Remove takes the worker id out of the pool and stops its background work; the sessions and
// keys pinned to it are unpinned (see Drain). Leases already on it stay valid and are released
// as usual; drain it first to let them finish before it goes.
func (p *Pool) Remove(id string) error {
	p.mu.Lock()
	err := p.removeLocked(id)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	p.releasePinsNow(id)
	return nil
}

// removeLocked is Remove with p.mu held.
func (p *Pool) removeLocked(id string) error {
	i := p.indexOf(id)
	if i < 0 {
		return fmt.Errorf("worker %q: %w", id, ErrUnknownWorker)
	}
	w := p.workers[i]
	p.workers = slices.Delete(slices.Clone(p.workers), i, i+1)
	if err := p.publish(); err != nil {
		return err
	}
	if w.stop != nil {
		w.stop()
	}
	p.metrics.forget(id)
	p.logger.Info("worker removed", "worker", id)
	return nil
}

// Replace swaps the worker spec.ID for one built from spec (a new URL, models or caps), as a
// config reload does for a static worker whose declaration changed. New requests go to the new
// worker at once; leases on the old one stay valid and finish there, so until they end the
// worker's caps are briefly exceeded by their number. The drain state carries over; health
// starts afresh (counting as healthy until the first check). Errors name the field
// ("worker.url: ...") or wrap ErrUnknownWorker. The worker is the configuration's from then on.
func (p *Pool) Replace(spec WorkerSpec) error { return p.replace(spec, SourceConfig) }

func (p *Pool) replace(spec WorkerSpec, source WorkerSource) error {
	if errs := validateWorker("worker", spec); len(errs) > 0 {
		return errors.Join(errs...)
	}
	w, err := newWorker(spec, p.cfg, p.now)
	if err != nil {
		return err
	}
	w.source = source
	p.joinShares(w)
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.indexOf(spec.ID)
	if i < 0 {
		return fmt.Errorf("worker %q: %w", spec.ID, ErrUnknownWorker)
	}
	old := p.workers[i]
	w.draining.Store(old.draining.Load())
	prev := p.workers
	p.workers = slices.Clone(p.workers)
	p.workers[i] = w
	if err := p.publish(); err != nil {
		p.workers = prev
		return err
	}
	if old.stop != nil {
		old.stop()
	}
	p.startWorker(w)
	p.logger.Info("worker replaced", "worker", spec.ID, "url", spec.URL, "models", spec.Models, "old_in_flight", old.InFlight())
	return nil
}

// Retire takes the worker id out of the pool gracefully: it takes no new requests from now on
// (on this replica only), the sessions and keys pinned to it are unpinned (see Drain), requests
// in flight finish, and Run removes it once nothing is in flight (within RetireSweep). Retiring a
// retiring worker does nothing. Unlike Drain it is not shared with other replicas: each replica
// retires the workers its own configuration or discovery dropped.
func (p *Pool) Retire(id string) error {
	w, err := p.find(id)
	if err != nil {
		return err
	}
	if !w.retiring.Swap(true) {
		p.changes.notify()
		p.logger.Info("worker retiring", "worker", id, "in_flight", w.InFlight())
		p.releasePinsNow(id)
	}
	return nil
}

// RetireSweep is how often Run removes the retiring workers that have nothing in flight.
const RetireSweep = 100 * time.Millisecond

// removeRetired removes every retiring worker with nothing in flight. Run calls it every
// RetireSweep.
func (p *Pool) removeRetired(context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	// removeLocked replaces p.workers with a new slice: the one ranged over stays as it was.
	for _, w := range p.workers {
		if w.retiring.Load() && w.InFlight() == 0 {
			if err := p.removeLocked(w.spec.ID); err != nil {
				p.logger.Error("retired worker not removed", "worker", w.spec.ID, "err", err)
			}
		}
	}
}

// DrainStore shares which workers are draining among gateway replicas, so a drain ordered on one
// reaches all. Implementations are safe for concurrent use.
type DrainStore interface {
	// SetDraining records whether the worker is draining.
	SetDraining(ctx context.Context, workerID string, draining bool) error
	// DrainingWorkers returns the IDs of the draining workers.
	DrainingWorkers(ctx context.Context) ([]string, error)
}

// Drain stops new requests to the worker id; requests in flight finish. Its state reads
// StateDrained once nothing is in flight. With a DrainStore (Options.Drains) the drain is
// recorded there first, and other replicas follow within Config.DrainSync; if the store fails,
// nothing changes and the error says so. Then the sessions and keys pinned to the worker are
// unpinned in the PinStore that every replica shares, so each is pinned anew, elsewhere, at its
// next request (if the PinStore fails, at their next request all the same). Draining a draining
// worker changes nothing but unpins again.
func (p *Pool) Drain(ctx context.Context, id string) error {
	if err := p.setDraining(ctx, id, true); err != nil {
		return err
	}
	p.releasePins(ctx, id)
	return nil
}

// Undrain lets the worker id take new requests again, on every replica as Drain does.
func (p *Pool) Undrain(ctx context.Context, id string) error { return p.setDraining(ctx, id, false) }

func (p *Pool) setDraining(ctx context.Context, id string, draining bool) error {
	w, err := p.find(id)
	if err != nil {
		return err
	}
	if p.drains != nil {
		if err := p.drains.SetDraining(ctx, id, draining); err != nil {
			return fmt.Errorf("worker %q: %w", id, err)
		}
	}
	p.applyDraining(w, draining, "admin")
	return nil
}

func (p *Pool) applyDraining(w *Worker, draining bool, source string) {
	if w.draining.Swap(draining) == draining {
		return
	}
	p.changes.notify()
	if draining {
		p.logger.Info("worker draining", "worker", w.spec.ID, "in_flight", w.InFlight(), "source", source)
	} else {
		p.logger.Info("worker undrained", "worker", w.spec.ID, "source", source)
	}
}

// syncDrains sets every worker's drain state from the DrainStore; when the store fails, the
// states stay as they are.
func (p *Pool) syncDrains(ctx context.Context) {
	ids, err := p.drains.DrainingWorkers(ctx)
	if err != nil {
		if ctx.Err() == nil {
			p.logger.Warn("drain state not shared", "err", err)
		}
		return
	}
	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	for _, w := range workers {
		p.applyDraining(w, slices.Contains(ids, w.spec.ID), "shared")
	}
}

func (p *Pool) find(id string) (*Worker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := p.indexOf(id); i >= 0 {
		return p.workers[i], nil
	}
	return nil, fmt.Errorf("worker %q: %w", id, ErrUnknownWorker)
}

// indexOf is the position of worker id in p.workers, or -1. p.mu must be held.
func (p *Pool) indexOf(id string) int {
	return slices.IndexFunc(p.workers, func(w *Worker) bool { return w.spec.ID == id })
}
