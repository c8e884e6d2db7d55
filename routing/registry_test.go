package routing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// memoryRegistry is a WorkerRegistry in memory, shared by the pools of one test as the SQL store
// is shared by replicas.
type memoryRegistry struct {
	mu    sync.Mutex // guards specs
	specs map[string]WorkerSpec
}

func (r *memoryRegistry) RegisteredWorkers(context.Context) ([]WorkerSpec, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]WorkerSpec, 0, len(r.specs))
	for _, s := range r.specs {
		out = append(out, s)
	}
	return out, nil
}

func (r *memoryRegistry) CreateWorker(_ context.Context, spec WorkerSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.specs[spec.ID]; ok {
		return ErrWorkerExists
	}
	r.specs[spec.ID] = spec
	return nil
}

func (r *memoryRegistry) UpdateWorker(_ context.Context, spec WorkerSpec) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.specs[spec.ID]; !ok {
		return ErrUnknownWorker
	}
	r.specs[spec.ID] = spec
	return nil
}

func (r *memoryRegistry) DeleteWorker(_ context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.specs[id]; !ok {
		return ErrUnknownWorker
	}
	delete(r.specs, id)
	return nil
}

func sourcedIDs(p *Pool) []string {
	var ids []string
	for _, w := range p.Workers() {
		ids = append(ids, w.ID+"/"+string(w.Source))
	}
	slices.Sort(ids)
	return ids
}

// Two pools on one registry: what the admin API does on one, the other follows at its sync; the
// config's workers are read-only beside the registered ones.
func TestRegistrySharesAdminWorkers(t *testing.T) {
	ctx := context.Background()
	reg := &memoryRegistry{specs: map[string]WorkerSpec{}}
	pins := NewMemoryPinStore(time.Now, 0)
	newPool := func() *Pool {
		p, err := NewPool(Config{Policy: "round_robin", Workers: testWorkers(1, "m")}, Options{Registry: reg, Pins: pins})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b := newPool(), newPool()
	added := WorkerSpec{ID: "x", URL: "http://127.0.0.1:7", Models: []string{"m"}}
	if err := a.AddWorker(ctx, added); err != nil {
		t.Fatalf("AddWorker: %v", err)
	}
	if err := b.AddWorker(ctx, added); !errors.Is(err, ErrWorkerExists) {
		t.Fatalf("AddWorker of a registered id on the other pool: got %v, want ErrWorkerExists", err)
	}
	if err := b.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"w0/config", "x/admin"}
	for name, p := range map[string]*Pool{"a": a, "b": b} {
		if got := sourcedIDs(p); !slices.Equal(got, want) {
			t.Fatalf("pool %s workers: got %v, want %v", name, got, want)
		}
	}

	changed := added
	changed.URL, changed.Models = "http://127.0.0.1:8", []string{"m", "n"}
	if err := b.UpdateWorker(ctx, changed); err != nil {
		t.Fatalf("UpdateWorker: %v", err)
	}
	if err := a.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if w, _ := a.Worker("x"); w.URL != changed.URL || !a.Serves("n") {
		t.Fatalf("after the change on b, a has %+v (serves n: %v), want url %s and model n", w, a.Serves("n"), changed.URL)
	}

	for _, id := range []string{"w0"} {
		if err := a.RemoveWorker(ctx, id); !errors.Is(err, ErrReadOnlyWorker) {
			t.Fatalf("RemoveWorker(%s) of the config: got %v, want ErrReadOnlyWorker", id, err)
		}
		if err := a.UpdateWorker(ctx, WorkerSpec{ID: id, URL: "http://127.0.0.1:9", Models: []string{"m"}}); !errors.Is(err, ErrReadOnlyWorker) {
			t.Fatalf("UpdateWorker(%s) of the config: got %v, want ErrReadOnlyWorker", id, err)
		}
	}

	// Removing on a releases the pins to x in the shared pin store; b drops x at its sync.
	if err := pins.Set(ctx, PinKey{Model: "m", Tenant: "t", Key: "s"}, "x", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := a.RemoveWorker(ctx, "x"); err != nil {
		t.Fatalf("RemoveWorker: %v", err)
	}
	if got, _ := pins.List(ctx, PinFilter{Worker: "x"}); len(got) != 0 {
		t.Fatalf("pins to the removed worker: got %v, want none", got)
	}
	if err := b.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*Pool{"a": a, "b": b} {
		if got := sourcedIDs(p); !slices.Equal(got, []string{"w0/config"}) {
			t.Fatalf("pool %s after the removal: got %v, want only w0", name, got)
		}
	}
}

// A registered worker whose id the config declares stays the config's; a pool built after the
// changes (a restart) has the registered workers after one sync.
func TestRegistryAtStartAndConfigWins(t *testing.T) {
	ctx := context.Background()
	reg := &memoryRegistry{specs: map[string]WorkerSpec{
		"w0": {ID: "w0", URL: "http://127.0.0.1:99", Models: []string{"m"}},
		"r1": {ID: "r1", URL: "http://127.0.0.1:98", Models: []string{"m"}},
	}}
	p, err := NewPool(Config{Workers: testWorkers(1, "m")}, Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.SyncRegistry(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := sourcedIDs(p), []string{"r1/admin", "w0/config"}; !slices.Equal(got, want) {
		t.Fatalf("workers: got %v, want %v", got, want)
	}
	if w, _ := p.Worker("w0"); w.URL != "http://127.0.0.1:1" {
		t.Fatalf("w0's url: got %s, want the config's", w.URL)
	}
}

// Run follows the registry on its own: a worker registered elsewhere arrives within
// RegistrySync, and one deleted elsewhere leaves.
func TestRunFollowsTheRegistry(t *testing.T) {
	reg := &memoryRegistry{specs: map[string]WorkerSpec{}}
	p, err := NewPool(Config{Workers: testWorkers(1, "m"), RegistrySync: 10 * time.Millisecond}, Options{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for i := range 3 {
		id := fmt.Sprintf("r%d", i)
		if err := reg.CreateWorker(ctx, WorkerSpec{ID: id, URL: "http://127.0.0.1:1", Models: []string{"m"}}); err != nil {
			t.Fatal(err)
		}
		for changes := p.Changes(); !slices.Contains(sourcedIDs(p), id+"/admin"); changes = p.Changes() {
			<-changes
		}
		if err := reg.DeleteWorker(ctx, id); err != nil {
			t.Fatal(err)
		}
		for changes := p.Changes(); slices.Contains(sourcedIDs(p), id+"/admin"); changes = p.Changes() {
			<-changes
		}
	}
}
