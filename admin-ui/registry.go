package adminui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// StoredWorkers is the fleet's worker registry in the tenants SQL store: routing's
// WorkerRegistry over tenants.Store, each worker's declaration kept as the admin API's JSON.
// usher serve passes it to the pool (routing.Options.Registry); the pool's AddWorker,
// UpdateWorker and RemoveWorker, which the admin API and console call, write through it.
type StoredWorkers struct {
	Store *tenants.Store
}

var _ routing.WorkerRegistry = StoredWorkers{}

// RegisteredWorkers implements routing.WorkerRegistry. A row that no longer decodes is skipped
// and named in the error only when nothing else is readable, so one bad row never empties the
// fleet.
func (r StoredWorkers) RegisteredWorkers(ctx context.Context) ([]routing.WorkerSpec, error) {
	rows, err := r.Store.Workers(ctx)
	if err != nil {
		return nil, err
	}
	specs := make([]routing.WorkerSpec, 0, len(rows))
	var bad error
	for _, row := range rows {
		var spec routing.WorkerSpec
		if err := json.Unmarshal(row.Spec, &spec); err != nil || spec.ID != row.ID {
			bad = fmt.Errorf("stored worker %q: unreadable declaration", row.ID)
			continue
		}
		specs = append(specs, spec)
	}
	if len(specs) == 0 && bad != nil {
		return nil, bad
	}
	return specs, nil
}

// CreateWorker implements routing.WorkerRegistry.
func (r StoredWorkers) CreateWorker(ctx context.Context, spec routing.WorkerSpec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	err = r.Store.CreateWorker(ctx, spec.ID, b)
	if errors.Is(err, tenants.ErrConflict) {
		return fmt.Errorf("worker %q: %w", spec.ID, routing.ErrWorkerExists)
	}
	return err
}

// UpdateWorker implements routing.WorkerRegistry.
func (r StoredWorkers) UpdateWorker(ctx context.Context, spec routing.WorkerSpec) error {
	b, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return registryError(spec.ID, r.Store.UpdateWorker(ctx, spec.ID, b))
}

// DeleteWorker implements routing.WorkerRegistry.
func (r StoredWorkers) DeleteWorker(ctx context.Context, id string) error {
	return registryError(id, r.Store.DeleteWorker(ctx, id))
}

func registryError(id string, err error) error {
	if errors.Is(err, tenants.ErrNotFound) {
		return fmt.Errorf("worker %q: %w", id, routing.ErrUnknownWorker)
	}
	return err
}
