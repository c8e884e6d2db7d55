package routing

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
)

// WorkerSource says where a worker of the pool is declared.
type WorkerSource string

const (
	// SourceConfig: the config file (routing.workers), changed by a config reload only.
	SourceConfig WorkerSource = "config"
	// SourceDiscovery: a DNS name of routing.discovery, changed by the name's answers only.
	SourceDiscovery WorkerSource = "discovery"
	// SourceAdmin: added through the admin API or console; with a WorkerRegistry, on any replica.
	SourceAdmin WorkerSource = "admin"
)

// ErrReadOnlyWorker: the admin API was asked to change or remove a worker of the config file or
// of DNS discovery while the pool shares a WorkerRegistry (HTTP 409); change the file, or drain
// the worker.
var ErrReadOnlyWorker = errors.New("worker declared in the config file or found by discovery, read-only")

// WorkerRegistry keeps the workers added, changed and removed through the admin API, shared by
// every gateway replica and kept across restarts (in usher serve, a table of the SQL store).
// The config file's and discovery's workers are never in it. Implementations are safe for
// concurrent use.
type WorkerRegistry interface {
	// RegisteredWorkers returns every registered worker.
	RegisteredWorkers(ctx context.Context) ([]WorkerSpec, error)
	// CreateWorker registers spec; an error wrapping ErrWorkerExists when its ID is taken.
	CreateWorker(ctx context.Context, spec WorkerSpec) error
	// UpdateWorker replaces the registered worker spec.ID; ErrUnknownWorker when there is none.
	UpdateWorker(ctx context.Context, spec WorkerSpec) error
	// DeleteWorker removes the registered worker id; ErrUnknownWorker when there is none.
	DeleteWorker(ctx context.Context, id string) error
}

// WorkerAnnouncer carries "the registry changed" between replicas. *RedisStore implements it.
type WorkerAnnouncer interface {
	// AnnounceWorkers tells every replica (this one included) that the registry changed.
	AnnounceWorkers(ctx context.Context) error
	// WatchWorkers calls changed on every announcement until ctx ends, then returns.
	WatchWorkers(ctx context.Context, changed func())
}

// AddWorker adds a worker through the admin API. With a WorkerRegistry it is registered first
// (ErrWorkerExists when any replica has the ID), added here, and announced, so every replica adds
// it at once (or within Config.RegistrySync) and every restart finds it again; without one it is
// this replica's until it stops. Errors name the field ("worker.url: ...").
func (p *Pool) AddWorker(ctx context.Context, spec WorkerSpec) error {
	if errs := validateWorker("worker", spec); len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := checkWorkerHost(spec.URL, p.cfg.AllowLinkLocalWorkers); err != nil {
		return fmt.Errorf("worker.url: %w", err)
	}
	if p.registry == nil {
		return p.add(spec, SourceAdmin)
	}
	p.registryMu.Lock()
	defer p.registryMu.Unlock()
	if _, err := p.find(spec.ID); err == nil {
		return fmt.Errorf("worker %q: %w", spec.ID, ErrWorkerExists)
	}
	if err := p.registry.CreateWorker(ctx, spec); err != nil {
		return err
	}
	err := p.add(spec, SourceAdmin)
	p.announce(ctx)
	return err
}

// UpdateWorker changes a worker added through the admin API (a new URL, models or caps), on
// every replica as AddWorker adds; requests in flight finish on the old declaration (see
// Replace). Workers of the config file or discovery are refused with ErrReadOnlyWorker when a
// registry is shared.
func (p *Pool) UpdateWorker(ctx context.Context, spec WorkerSpec) error {
	if errs := validateWorker("worker", spec); len(errs) > 0 {
		return errors.Join(errs...)
	}
	if err := checkWorkerHost(spec.URL, p.cfg.AllowLinkLocalWorkers); err != nil {
		return fmt.Errorf("worker.url: %w", err)
	}
	if p.registry == nil {
		return p.replace(spec, SourceAdmin)
	}
	p.registryMu.Lock()
	defer p.registryMu.Unlock()
	if err := p.checkRegistered(spec.ID); err != nil {
		return err
	}
	if err := p.registry.UpdateWorker(ctx, spec); err != nil {
		return err
	}
	err := p.replace(spec, SourceAdmin)
	p.announce(ctx)
	return err
}

// RemoveWorker removes a worker added through the admin API, on every replica as AddWorker adds:
// each takes it out of its pool and lets its leases finish, and its pins are released (see
// Remove). Workers of the config file or discovery are refused with ErrReadOnlyWorker when a
// registry is shared (drain them instead); without one, any worker is removed here.
func (p *Pool) RemoveWorker(ctx context.Context, id string) error {
	if p.registry == nil {
		return p.Remove(id)
	}
	p.registryMu.Lock()
	defer p.registryMu.Unlock()
	if err := p.checkRegistered(id); err != nil {
		return err
	}
	if err := p.registry.DeleteWorker(ctx, id); err != nil {
		return err
	}
	err := p.Remove(id)
	p.announce(ctx)
	return err
}

// checkRegistered refuses a worker this pool does not have (ErrUnknownWorker) or that is not the
// admin API's (ErrReadOnlyWorker).
func (p *Pool) checkRegistered(id string) error {
	w, err := p.find(id)
	if err != nil {
		return err
	}
	if w.source != SourceAdmin {
		return fmt.Errorf("worker %q (%s): %w", id, w.source, ErrReadOnlyWorker)
	}
	return nil
}

// announce tells the other replicas; a failure is logged, and they follow at their next sync.
func (p *Pool) announce(ctx context.Context) {
	if p.announcer == nil {
		return
	}
	if err := p.announcer.AnnounceWorkers(ctx); err != nil {
		p.logger.Warn("worker change not announced; other replicas follow within registry_sync", "err", err)
	}
}

// SyncRegistry brings the pool in line with the WorkerRegistry: registered workers it lacks are
// added, changed ones replaced, and the admin API's workers no longer registered removed (their
// pins released, their leases finishing). A registered worker whose ID the config file or
// discovery declares stays theirs. When the registry cannot be read nothing changes. Run calls
// it every Config.RegistrySync and on every announcement; serve calls it once before serving, so
// a restarted replica has its registered workers on its first request. Without a registry it
// does nothing.
func (p *Pool) SyncRegistry(ctx context.Context) error {
	if p.registry == nil {
		return nil
	}
	p.registryMu.Lock()
	defer p.registryMu.Unlock()
	specs, err := p.registry.RegisteredWorkers(ctx)
	if err != nil {
		return fmt.Errorf("read the worker registry: %w", err)
	}
	for _, spec := range specs {
		w, err := p.find(spec.ID)
		switch {
		case err != nil:
			err = p.add(spec, SourceAdmin)
		case w.source != SourceAdmin:
			continue
		case !reflect.DeepEqual(w.spec, spec):
			err = p.replace(spec, SourceAdmin)
		}
		if err != nil {
			p.logger.Error("registered worker not applied", "worker", spec.ID, "err", err)
		}
	}
	p.mu.Lock()
	workers := p.workers
	p.mu.Unlock()
	for _, w := range workers {
		if w.source != SourceAdmin || slices.ContainsFunc(specs, func(s WorkerSpec) bool { return s.ID == w.spec.ID }) {
			continue
		}
		if err := p.Remove(w.spec.ID); err != nil && !errors.Is(err, ErrUnknownWorker) {
			p.logger.Error("unregistered worker not removed", "worker", w.spec.ID, "err", err)
		}
	}
	return nil
}

// startRegistry starts following the registry: a poll every Config.RegistrySync and, with an
// announcer, a sync on every announcement. p.mu must be held, Run running.
func (p *Pool) startRegistry(ctx context.Context) {
	if p.registry == nil {
		return
	}
	sync := func(ctx context.Context) {
		if err := p.SyncRegistry(ctx); err != nil && ctx.Err() == nil {
			p.logger.Warn("worker registry not read; the workers stay as they are", "err", err)
		}
	}
	p.running.Go(func() { every(ctx, p.cfg.RegistrySync, sync) })
	if p.announcer != nil {
		p.running.Go(func() { p.announcer.WatchWorkers(ctx, func() { sync(ctx) }) })
	}
}
