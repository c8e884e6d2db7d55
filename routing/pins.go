package routing

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// PinKey names one pin: a session ID or routing key of a tenant, for one model.
type PinKey struct {
	Model  string `json:"model"`
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
}

// Pin is a key pinned to a worker, as listed by PinStore.List.
type Pin struct {
	PinKey
	Worker string        `json:"worker"`
	TTL    time.Duration `json:"ttl"` // time left; a pin's TTL slides on every use
}

// PinFilter selects pins; empty fields match every pin. After and Limit page through a large
// store: each page holds at most Limit pins, and the next one starts after the last pin of the
// page before.
type PinFilter struct {
	Model  string
	Tenant string
	Worker string
	// Key keeps only the pins of that session or routing key.
	Key string
	// After keeps only the pins ordered after it (by model, tenant and key).
	After *PinKey
	// Limit caps the pins listed, the first in order; 0 lists them all.
	Limit int
}

// matchKey reports whether f selects k, whatever its worker.
func (f PinFilter) matchKey(k PinKey) bool {
	return (f.Model == "" || f.Model == k.Model) && (f.Tenant == "" || f.Tenant == k.Tenant) &&
		(f.Key == "" || f.Key == k.Key) && (f.After == nil || comparePinKeys(k, *f.After) > 0)
}

func (f PinFilter) match(k PinKey, worker string) bool {
	return f.matchKey(k) && (f.Worker == "" || f.Worker == worker)
}

func comparePinKeys(a, b PinKey) int {
	return cmp.Or(cmp.Compare(a.Model, b.Model), cmp.Compare(a.Tenant, b.Tenant), cmp.Compare(a.Key, b.Key))
}

// firstPins keeps the Limit first of pins in order (all when Limit is 0), sorted.
func (f PinFilter) firstPins(pins []Pin) []Pin {
	sortPins(pins)
	if f.Limit > 0 && len(pins) > f.Limit {
		pins = pins[:f.Limit]
	}
	return pins
}

// PinStore keeps the pins of sticky sessions and routing keys where every gateway replica sees
// them. Implementations are safe for concurrent use; Get and Claim sit on the pick path of
// sticky_session and manual and should take one round trip.
type PinStore interface {
	// Get returns the worker k is pinned to ("" if none) and extends the pin's TTL to ttl.
	Get(ctx context.Context, k PinKey, ttl time.Duration) (string, error)
	// Claim pins k to worker if k is unpinned or pinned to expect, and returns the worker k is
	// pinned to afterwards: worker, or the pin another replica set first.
	Claim(ctx context.Context, k PinKey, expect, worker string, ttl time.Duration) (string, error)
	// Set pins k to worker whatever it was pinned to.
	Set(ctx context.Context, k PinKey, worker string, ttl time.Duration) error
	// Delete removes the pin of k, if any.
	Delete(ctx context.Context, k PinKey) error
	// List returns the pins f selects, ordered by model, tenant and key, at most f.Limit of
	// them. It reads the whole store, keeping in memory no more than a page of pins (Redis) or
	// the pins that match (memory): an admin operation, not for the pick path.
	List(ctx context.Context, f PinFilter) ([]Pin, error)
}

// MemoryPinStore is a PinStore in the gateway's memory, for a single gateway without Redis. Pins
// expire lazily: an expired pin is dropped when it is next read or listed, and all expired pins
// are swept whenever the store has doubled since the last sweep, so pins of sessions never seen
// again (one per new session ID) hold at most about twice the live pins' memory. A tenant holds
// at most maxPerTenant pins, every model's together: a new pin past it removes the tenant's least
// recently used one (see Config.MaxPinsPerTenant). Safe for concurrent use; the zero value is not
// usable, call NewMemoryPinStore.
type MemoryPinStore struct {
	now          func() time.Time
	maxPerTenant int

	mu      sync.Mutex // guards pins, tenants and sweepAt
	pins    map[PinKey]*memoryPin
	tenants map[string]*list.List // each tenant's pins (PinKey), most recently used first; none: no entry
	sweepAt int                   // the size at which the next new pin sweeps the expired ones
}

// minSweepAt is the smallest store size at which expired pins are swept.
const minSweepAt = 1024

type memoryPin struct {
	worker  string
	expires time.Time
	use     *list.Element // in the tenant's list
}

var _ PinStore = (*MemoryPinStore)(nil)

// NewMemoryPinStore returns an empty store reading time from now (time.Now if nil), holding at
// most maxPerTenant pins of a tenant (DefaultMaxPinsPerTenant if not positive).
func NewMemoryPinStore(now func() time.Time, maxPerTenant int) *MemoryPinStore {
	if now == nil {
		now = time.Now
	}
	if maxPerTenant <= 0 {
		maxPerTenant = DefaultMaxPinsPerTenant
	}
	return &MemoryPinStore{now: now, maxPerTenant: maxPerTenant, pins: make(map[PinKey]*memoryPin),
		tenants: make(map[string]*list.List), sweepAt: minSweepAt}
}

// putLocked pins k to worker until expires. A new pin sweeps the expired pins first when the
// store has grown to sweepAt (amortized O(1) per pin), and then removes its tenant's least
// recently used pins past maxPerTenant (O(1) each). s.mu must be held.
func (s *MemoryPinStore) putLocked(k PinKey, worker string, expires, now time.Time) {
	if p, ok := s.pins[k]; ok {
		p.worker, p.expires = worker, expires
		s.tenants[k.Tenant].MoveToFront(p.use)
		return
	}
	if len(s.pins) >= s.sweepAt {
		for k, p := range s.pins {
			if !now.Before(p.expires) {
				s.removeLocked(k)
			}
		}
		s.sweepAt = max(2*len(s.pins), minSweepAt)
	}
	uses := s.tenants[k.Tenant]
	if uses == nil {
		uses = list.New()
		s.tenants[k.Tenant] = uses
	}
	s.pins[k] = &memoryPin{worker: worker, expires: expires, use: uses.PushFront(k)}
	for uses.Len() > s.maxPerTenant {
		s.removeLocked(uses.Back().Value.(PinKey))
	}
}

// removeLocked removes the pin of k, if any. s.mu must be held.
func (s *MemoryPinStore) removeLocked(k PinKey) {
	p, ok := s.pins[k]
	if !ok {
		return
	}
	delete(s.pins, k)
	uses := s.tenants[k.Tenant]
	if uses.Remove(p.use); uses.Len() == 0 {
		delete(s.tenants, k.Tenant)
	}
}

// live returns the unexpired pin of k. s.mu must be held.
func (s *MemoryPinStore) live(k PinKey, now time.Time) (*memoryPin, bool) {
	p, ok := s.pins[k]
	if ok && !now.Before(p.expires) {
		s.removeLocked(k)
		return nil, false
	}
	return p, ok
}

// Get implements PinStore.
func (s *MemoryPinStore) Get(_ context.Context, k PinKey, ttl time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	p, ok := s.live(k, now)
	if !ok {
		return "", nil
	}
	p.expires = now.Add(ttl)
	s.tenants[k.Tenant].MoveToFront(p.use)
	return p.worker, nil
}

// Claim implements PinStore.
func (s *MemoryPinStore) Claim(_ context.Context, k PinKey, expect, worker string, ttl time.Duration) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if p, ok := s.live(k, now); ok && p.worker != expect {
		worker = p.worker
	}
	s.putLocked(k, worker, now.Add(ttl), now)
	return worker, nil
}

// Set implements PinStore.
func (s *MemoryPinStore) Set(_ context.Context, k PinKey, worker string, ttl time.Duration) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.live(k, now)
	s.putLocked(k, worker, now.Add(ttl), now)
	return nil
}

// Delete implements PinStore.
func (s *MemoryPinStore) Delete(_ context.Context, k PinKey) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(k)
	return nil
}

// List implements PinStore.
func (s *MemoryPinStore) List(_ context.Context, f PinFilter) ([]Pin, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []Pin
	for k := range s.pins {
		p, ok := s.live(k, now)
		if ok && f.match(k, p.worker) {
			out = append(out, Pin{PinKey: k, Worker: p.worker, TTL: p.expires.Sub(now)})
		}
	}
	return f.firstPins(out), nil
}

func sortPins(pins []Pin) {
	slices.SortFunc(pins, func(a, b Pin) int { return comparePinKeys(a.PinKey, b.PinKey) })
}

// ErrWorkerDraining: Pin was asked to pin a key to a draining or retiring worker, which takes no
// new requests: the pin would only move at the key's next request.
var ErrWorkerDraining = errors.New("the worker is draining and takes no new sessions; undrain it or pin to another worker")

// ErrPinsIgnored: Pin was asked to pin a key of a model whose policy routes without pins: the
// pin would be stored and listed, and never followed.
var ErrPinsIgnored = errors.New("the model's routing policy does not follow pins; route it by sticky_session or manual to pin sessions and keys")

// pinFollower is a policy that routes by the pins Pool.Pin sets (sticky_session, manual).
type pinFollower interface{ followsPins() }

func (*StickySession) followsPins() {}
func (*Manual) followsPins()        {}

// Pin pins key (a session ID or routing key) of tenant to workerID for model, replacing any pin
// it had, for ttl (0: the model's PinConfig.TTL). Errors wrap ErrUnknownModel or ErrUnknownWorker
// when the model has no such worker, ErrWorkerDraining when the worker drains or retires, or come
// from the pin store.
func (p *Pool) Pin(ctx context.Context, model, tenant, key, workerID string, ttl time.Duration) error {
	ms := p.snap.Load().models[model]
	if ms == nil {
		return fmt.Errorf("model %q: %w", model, ErrUnknownModel)
	}
	if _, ok := ms.policy.(pinFollower); !ok {
		return fmt.Errorf("model %q is routed by %s: %w", model, ms.policyName, ErrPinsIgnored)
	}
	w := ms.byID[workerID]
	if w == nil {
		return fmt.Errorf("worker %q for model %q: %w", workerID, model, ErrUnknownWorker)
	}
	if w.Draining() {
		return fmt.Errorf("worker %q: %w", workerID, ErrWorkerDraining)
	}
	if key == "" {
		return errors.New("pin: key must not be empty")
	}
	if ttl <= 0 {
		ttl = p.pinTTL(model)
	}
	return p.pins.Set(ctx, PinKey{Model: model, Tenant: tenant, Key: key}, workerID, ttl)
}

// Unpin removes the pin of key of tenant for model, if any.
func (p *Pool) Unpin(ctx context.Context, model, tenant, key string) error {
	return p.pins.Delete(ctx, PinKey{Model: model, Tenant: tenant, Key: key})
}

// Pins lists the pins f selects (by model, tenant or worker), ordered by model, tenant and key.
func (p *Pool) Pins(ctx context.Context, f PinFilter) ([]Pin, error) {
	return p.pins.List(ctx, f)
}

// pinReleaseTimeout bounds releasing a worker's pins in Remove and Retire, which take no context.
const pinReleaseTimeout = 5 * time.Second

// releasePins deletes every pin to the worker id, so that each session or key pinned to it is
// pinned anew, elsewhere, at its next request. Drain, Retire and Remove call it: a pick would
// move such a pin at its next request anyway, but releasing it at once keeps listings true (no
// pin shown on a worker that will not serve it) and an undrained worker from getting back
// sessions that moved. A failure of the store is logged, and the pins left move at their next
// request; a pin set while it runs may stay. Cost: one List of the store and one Delete per pin.
func (p *Pool) releasePins(ctx context.Context, id string) {
	pins, err := p.pins.List(ctx, PinFilter{Worker: id})
	for i := 0; err == nil && i < len(pins); i++ {
		err = p.pins.Delete(ctx, pins[i].PinKey)
	}
	if err != nil {
		p.logger.Warn("pins of a worker not released; they move at their next request", "worker", id, "err", err)
	}
}

// releasePinsNow is releasePins bounded by pinReleaseTimeout.
func (p *Pool) releasePinsNow(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), pinReleaseTimeout)
	defer cancel()
	p.releasePins(ctx, id)
}

func (p *Pool) pinTTL(model string) time.Duration {
	if mc, ok := p.cfg.Models[model]; ok {
		return mc.Pins.TTL
	}
	var pc PinConfig
	pc.setDefaults()
	return pc.TTL
}
