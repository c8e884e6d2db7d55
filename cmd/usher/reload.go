package main

import (
	"errors"
	"log/slog"
	"reflect"
	"slices"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// tierSetter is the part of the tenant directory a reload changes.
type tierSetter interface {
	SetTiers(tiers []tenants.Tier, defaultTier string) error
}

// jwtSetter is the part of the tenant directory a reload of the JWT keys changes.
type jwtSetter interface {
	SetJWT(v *tenants.JWTVerifier)
}

// workerPool is the part of the worker pool a reload changes.
type workerPool interface {
	Add(spec routing.WorkerSpec) error
	Replace(spec routing.WorkerSpec) error
	Retire(id string) error
}

var (
	_ tierSetter = (*tenants.Directory)(nil)
	_ jwtSetter  = (*tenants.Directory)(nil)
	_ workerPool = (*routing.Pool)(nil)
)

// reloader applies a new configuration file to a running gateway (SIGHUP). Three things change
// without a restart and without dropping a request: the tiers (tiers, default_tier), the JWT
// verification (jwt: its PEM and JWKS files read again, its JWKS URL fetched again) and the
// static workers (routing.workers): a new worker is added, a changed one replaced (its requests
// in flight finish on the old declaration), a removed one retired (no new requests, removed
// once its requests in flight end). Workers added through the admin API or by discovery are not
// the file's and are left alone. Changes to any other setting are logged and wait for a
// restart. It is used by serve's goroutine only.
type reloader struct {
	running Config // the configuration in effect, reloaded parts included
	pool    workerPool
	tiers   tierSetter
	logger  *slog.Logger
	// jwt and newJWT, when set, reload the JWT keys: newJWT builds the verifier of a jwt
	// section.
	jwt    jwtSetter
	newJWT func(tenants.JWTConfig) (*tenants.JWTVerifier, error)
}

// apply applies next, which has passed Validate. When the new tiers are refused nothing
// changes; a worker the pool refuses is logged and the others still apply.
func (r *reloader) apply(next Config) {
	if err := r.tiers.SetTiers(next.Tenants.Tiers, next.Tenants.DefaultTier); err != nil {
		r.logger.Error("config reload refused, the running configuration stays", "err", err)
		return
	}
	r.running.Tenants.Tiers, r.running.Tenants.DefaultTier = next.Tenants.Tiers, next.Tenants.DefaultTier
	if r.jwt != nil {
		if v, err := r.newJWT(next.Tenants.JWT); err != nil {
			r.logger.Error("config reload: the JWT keys stay as they were", "err", err)
		} else {
			r.jwt.SetJWT(v)
			r.running.Tenants.JWT = next.Tenants.JWT
		}
	}
	var added, replaced, retired int
	old := r.running.Routing.Workers
	// applied becomes the static workers in effect: a worker the pool refused keeps its old
	// declaration (or stays undeclared), so the next reload tries again.
	var applied []routing.WorkerSpec
	for _, spec := range next.Routing.Workers {
		i := slices.IndexFunc(old, func(o routing.WorkerSpec) bool { return o.ID == spec.ID })
		switch {
		case i < 0:
			err := r.pool.Add(spec)
			if errors.Is(err, routing.ErrWorkerExists) {
				// Still retiring after an earlier reload removed it, or added at run time:
				// the file declares it now.
				err = r.pool.Replace(spec)
			}
			if err != nil {
				r.logger.Error("config reload: worker not added", "worker", spec.ID, "err", err)
				continue
			}
			added++
		case !reflect.DeepEqual(old[i], spec):
			err := r.pool.Replace(spec)
			if errors.Is(err, routing.ErrUnknownWorker) {
				// Removed through the admin API since: the file declares it.
				err = r.pool.Add(spec)
			}
			if err != nil {
				r.logger.Error("config reload: worker not replaced", "worker", spec.ID, "err", err)
				applied = append(applied, old[i])
				continue
			}
			replaced++
		}
		applied = append(applied, spec)
	}
	for _, spec := range old {
		if slices.ContainsFunc(next.Routing.Workers, func(n routing.WorkerSpec) bool { return n.ID == spec.ID }) {
			continue
		}
		err := r.pool.Retire(spec.ID)
		switch {
		case errors.Is(err, routing.ErrUnknownWorker):
			// Already gone (removed through the admin API).
		case err != nil:
			r.logger.Error("config reload: worker not retired", "worker", spec.ID, "err", err)
			applied = append(applied, spec)
		default:
			retired++
		}
	}
	r.running.Routing.Workers = applied
	if stale := restartNeeded(r.running, next); len(stale) > 0 {
		r.logger.Warn("config reload: these settings changed but take effect only at restart", "sections", stale)
	}
	r.logger.Info("config reloaded", "tiers", len(next.Tenants.Tiers),
		"workers_added", added, "workers_replaced", replaced, "workers_retired", retired)
}

// restartNeeded names the sections in which next differs from running, beyond what a reload
// applies.
func restartNeeded(running, next Config) []string {
	var out []string
	for _, s := range []struct {
		name string
		a, b any
	}{
		{"server", running.Server, next.Server},
		{"routing", withoutWorkers(running.Routing), withoutWorkers(next.Routing)},
		{"queue", running.Queue, next.Queue},
		{"tenants", running.Tenants, next.Tenants},
		{"redis", running.Redis, next.Redis},
		{"log", running.Log, next.Log},
	} {
		if !reflect.DeepEqual(s.a, s.b) {
			out = append(out, s.name)
		}
	}
	return out
}

func withoutWorkers(c routing.Config) routing.Config {
	c.Workers = nil
	return c
}
