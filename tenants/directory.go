package tenants

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"
)

// ChangesChannel is the Redis pub/sub channel on which replicas announce changes to tenants and
// keys, so that the others reload at once instead of at their next poll.
const ChangesChannel = "usher:tenants:changes"

// DirectoryOptions are the dependencies of a Directory. Every field is optional.
type DirectoryOptions struct {
	// Redis, when set, carries change announcements between replicas (ChangesChannel).
	Redis redis.UniversalClient
	// JWT, when set, verifies credentials shaped like a JWT (see NewJWTVerifier).
	JWT *JWTVerifier
	// Logger receives reload and flush failures; default: discard.
	Logger *slog.Logger
	// Registerer receives the directory's metrics; default: none registered.
	Registerer prometheus.Registerer
	// Now is the clock; default time.Now.
	Now func() time.Time
	// PollInterval is how often the store's revision is read; default 500ms. It bounds how long a
	// revoked key keeps working on a replica that missed the Redis announcement (or has none).
	PollInterval time.Duration
	// FlushInterval is how often last-used times are written to the store; default 10s.
	FlushInterval time.Duration
	// MissLookups bounds, per second, the fruitless store lookups of well-formed stored keys
	// that are not in memory (a key created on another replica a moment ago is found, and not
	// counted); default 20, burst as many. A key id still unknown after a lookup is not looked up
	// again for a minute, so unknown keys cannot flood the store.
	MissLookups float64
	// TenantRemoved, when set, is called with the id of every stored tenant a reload finds
	// deleted (on every replica), so that what others keep per tenant (the gateway's queue
	// state and metric series) goes with it. It is called during the reload and must not call
	// Reload or Changed.
	TenantRemoved func(id string)
}

// Negative cache of key ids looked up in the store and not found there.
const (
	missTTL     = time.Minute
	maxMissedID = 10_000
)

// Directory is the in-memory view of tenants, tiers and credentials that one gateway
// authenticates against: the read-only tenants of the config file beside the tenants and keys
// of the Store. It is the Authenticator the gateway uses.
//
// Authenticate does no SQL and no I/O for a credential it knows: Run keeps the view fresh by
// polling the store's revision every PollInterval and reloading on announcements over Redis,
// and writes last-used times in batches. A well-formed stored key it does not know makes it
// reload from the store first, as does a verified JWT naming a tenant it does not know
// (rate-limited, and once per id a minute), so a key or tenant created on another replica works
// here on its first request, before any announcement arrives. Safe for
// concurrent use.
type Directory struct {
	// tiers is replaced as a whole by SetTiers; readers load it once per call.
	tiers atomic.Pointer[tierSet]
	// specs are the config file's tenants and their keys; never modified.
	specs     []TenantSpec
	configIDs map[string]Tenant
	store     *Store
	redis     redis.UniversalClient
	// jwt verifies JWTs; nil: none are accepted. Replaced as a whole by SetJWT.
	jwt     atomic.Pointer[JWTVerifier]
	logger  *slog.Logger
	now     func() time.Time
	poll    time.Duration
	flush   time.Duration
	removed func(id string) // DirectoryOptions.TenantRemoved; nil: none

	snap atomic.Pointer[snapshot]
	// reloadMu serialises reloads, so a slow one never overwrites a newer snapshot.
	reloadMu sync.Mutex

	missMu sync.Mutex // guards missed and missLimit
	// missed holds the key ids looked up in the store on a miss and not found, until when they
	// are not looked up again.
	missed    map[string]time.Time
	missLimit *rate.Limiter

	reloads                                               *prometheus.CounterVec
	reloadErrors, flushErrors, publishErrors, missLookups prometheus.Counter
}

// tierSet is the declared tiers and the config keys whose principals point at them; immutable.
type tierSet struct {
	byName map[string]*Tier
	list   []Tier
	// defaultTier is the tier of a new tenant that names none.
	defaultTier string
	static      map[[sha256.Size]byte]staticKey
}

// newTierSet builds the tiers and points the config keys of specs at them. Every tier a spec
// names must be declared.
func newTierSet(tiers []Tier, defaultTier string, specs []TenantSpec) (*tierSet, error) {
	ts := &tierSet{byName: map[string]*Tier{}, list: slices.Clone(tiers), defaultTier: defaultTier}
	for i := range ts.list {
		ts.byName[ts.list[i].Name] = &ts.list[i]
	}
	if _, ok := ts.byName[defaultTier]; !ok {
		return nil, fmt.Errorf("default_tier: names no tier in tiers: %q", defaultTier)
	}
	static, err := NewStatic(specs)
	if err != nil {
		return nil, err
	}
	ts.static = static.byHash
	for h, k := range ts.static {
		tier, ok := ts.byName[k.principal.Tier]
		if !ok {
			return nil, fmt.Errorf("tenant %q: tier %q is not declared", k.principal.TenantID, k.principal.Tier)
		}
		k.principal.TierSpec = tier
		ts.static[h] = k
	}
	return ts, nil
}

// snapshot is one immutable load of the store; only keyEntry's atomics change after it is built.
type snapshot struct {
	rev     int64
	tenants map[string]Tenant
	keys    map[string]*keyEntry
}

type keyEntry struct {
	APIKey
	hash [sha256.Size]byte
	// parents are the ids of the keys that minted this one, nearest first, separated by spaces
	// (Principal.KeyParents); set before the entry is published, never modified after.
	parents string
	// traced is true once parents is set.
	traced bool
	// lastUsed is the unix millisecond of the last successful use, written on the hot path;
	// flushed is the value last written to the store, touched only by the flusher.
	lastUsed, flushed atomic.Int64
}

var _ Authenticator = (*Directory)(nil)

// NewDirectory builds the directory from cfg (after SetDefaults and Validate) and, when store is
// not nil, loads the store once. Call Run to keep it fresh.
func NewDirectory(ctx context.Context, cfg Config, store *Store, opts DirectoryOptions) (*Directory, error) {
	d := &Directory{
		specs: cfg.Tenants, configIDs: map[string]Tenant{}, store: store, redis: opts.Redis,
		logger: opts.Logger, now: opts.Now, poll: opts.PollInterval, flush: opts.FlushInterval, removed: opts.TenantRemoved,
	}
	d.jwt.Store(opts.JWT)
	if d.logger == nil {
		d.logger = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	if d.poll <= 0 {
		d.poll = 500 * time.Millisecond
	}
	if d.flush <= 0 {
		d.flush = 10 * time.Second
	}
	if opts.MissLookups <= 0 {
		opts.MissLookups = 20
	}
	d.missed = map[string]time.Time{}
	d.missLimit = rate.NewLimiter(rate.Limit(opts.MissLookups), int(math.Ceil(opts.MissLookups)))
	ts, err := newTierSet(cfg.Tiers, cfg.DefaultTier, cfg.Tenants)
	if err != nil {
		return nil, err
	}
	d.tiers.Store(ts)
	loaded := d.now()
	for _, t := range cfg.Tenants {
		d.configIDs[t.ID] = Tenant{ID: t.ID, Name: t.Name, Tier: t.Tier, Status: StatusActive, Created: loaded, ReadOnly: true}
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: "usher_tenants_" + name, Help: help})
		if opts.Registerer != nil {
			opts.Registerer.MustRegister(c)
		}
		return c
	}
	d.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "usher_tenants_directory_reloads_total",
		Help: "Reloads of tenants and keys from the store, by kind: incremental (the rows changed) or full."}, []string{"kind"})
	if opts.Registerer != nil {
		opts.Registerer.MustRegister(d.reloads)
	}
	d.reloadErrors = counter("directory_reload_errors_total", "Failed reads of the store; the previous view stays in use.")
	d.flushErrors = counter("key_last_used_flush_errors_total", "Failed batch writes of API keys' last-used times.")
	d.missLookups = counter("directory_miss_lookups_total", "Store lookups for well-formed stored keys not in memory.")
	d.publishErrors = counter("directory_publish_errors_total", "Failed change announcements over Redis; replicas still see the change at their next poll.")
	d.snap.Store(&snapshot{rev: -1, tenants: map[string]Tenant{}, keys: map[string]*keyEntry{}})
	if store != nil {
		if err := d.Reload(ctx); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Authenticate returns the principal of credential, deciding by its shape: `usk_...` is a
// stored key, three base64url segments starting `eyJ` are a JWT, anything else is a config key.
// Cost for a key: one SHA-256 and two map lookups, no I/O, no allocation.
func (d *Directory) Authenticate(ctx context.Context, credential string) (Principal, error) {
	if err := checkShape(credential); err != nil {
		return Principal{}, err
	}
	switch {
	case looksLikeStoredKey(credential):
		return d.authenticateStoredKey(ctx, credential)
	case looksLikeJWT(credential):
		v := d.jwt.Load()
		if v == nil {
			return Principal{}, errUnknownCredential
		}
		return v.authenticate(ctx, credential, d)
	}
	h := sum256(credential)
	k, ok := d.tiers.Load().static[h]
	if !ok || subtle.ConstantTimeCompare(h[:], k.hash[:]) != 1 {
		return Principal{}, errUnknownCredential
	}
	return k.principal, nil
}

var (
	errRevokedKey      = fmt.Errorf("revoked api key: %w", ErrUnauthenticated)
	errExpiredKey      = fmt.Errorf("expired api key: %w", ErrUnauthenticated)
	errSuspendedTenant = fmt.Errorf("tenant suspended: %w", ErrUnauthenticated)
	errUnknownTenant   = fmt.Errorf("unknown tenant: %w", ErrUnauthenticated)
	errUndeclaredTier  = fmt.Errorf("tenant's tier not declared in the config: %w", ErrUnauthenticated)
)

func (d *Directory) authenticateStoredKey(ctx context.Context, credential string) (Principal, error) {
	id, secret, ok := parseStoredKey(credential)
	if !ok {
		return Principal{}, errMalformedCredential
	}
	snap := d.snap.Load()
	k, found := snap.keys[id]
	h := sum256(secret)
	if !found && d.lookUpMiss(ctx, "key:"+id, func(s *snapshot) bool { _, ok := s.keys[id]; return ok }) {
		snap = d.snap.Load()
		k, found = snap.keys[id]
	}
	if !found {
		return Principal{}, errUnknownCredential
	}
	if subtle.ConstantTimeCompare(h[:], k.hash[:]) != 1 {
		return Principal{}, errUnknownCredential
	}
	if !k.Revoked.IsZero() {
		return Principal{}, errRevokedKey
	}
	now := d.now()
	if !k.Expires.IsZero() && !now.Before(k.Expires) {
		return Principal{}, errExpiredKey
	}
	t, ok := snap.tenants[k.TenantID]
	if !ok {
		return Principal{}, errUnknownTenant
	}
	p, err := d.principal(t)
	if err != nil {
		return Principal{}, err
	}
	if err := d.capTier(&p, k.Tier); err != nil {
		return Principal{}, err
	}
	p.KeyID, p.Expires, p.ManageKeys, p.KeyParents = k.ID, k.Expires, k.ManageKeys, k.parents
	// Only move the shared cache line when the stored value would change.
	if ms := now.UnixMilli(); ms-k.lastUsed.Load() >= 1000 {
		k.lastUsed.Store(ms)
	}
	return p, nil
}

// lookUpMiss reloads from the store for an object unknown in memory (miss names it: "key:<id>",
// "tenant:<id>"; found tells whether a snapshot holds it), unless it was looked up and not found
// within missTTL or fruitless lookups are over their rate. Each lookup takes a token of the rate
// before it reads, so concurrent misses never exceed it, and gives it back when it finds the
// object (creations are bounded by the admin API). Concurrent lookups share reloads: Reload is
// serialised and reads one revision row when nothing changed. It reports whether it reloaded.
func (d *Directory) lookUpMiss(ctx context.Context, miss string, found func(*snapshot) bool) bool {
	if d.store == nil {
		return false
	}
	now := d.now()
	d.missMu.Lock()
	until, seen := d.missed[miss]
	var token *rate.Reservation
	if !seen || !now.Before(until) {
		token = d.missLimit.ReserveN(now, 1)
		if !token.OK() || token.DelayFrom(now) > 0 {
			token.CancelAt(now)
			token = nil
		}
	}
	d.missMu.Unlock()
	if token == nil {
		return false
	}
	d.missLookups.Inc()
	if err := d.Reload(ctx); err != nil {
		d.logger.Warn("reload for an unknown api key", "err", err)
		return false
	}
	d.missMu.Lock()
	defer d.missMu.Unlock()
	if found(d.snap.Load()) {
		token.CancelAt(now)
		return true
	}
	if len(d.missed) >= maxMissedID {
		clear(d.missed)
	}
	d.missed[miss] = now.Add(missTTL)
	return true
}

// principal is the principal of an active tenant.
func (d *Directory) principal(t Tenant) (Principal, error) {
	if t.Status != StatusActive {
		return Principal{}, errSuspendedTenant
	}
	tier, ok := d.tiers.Load().byName[t.Tier]
	if !ok {
		// A stored tenant whose tier left the config file: refuse rather than guess limits.
		return Principal{}, errUndeclaredTier
	}
	return Principal{TenantID: t.ID, TenantName: t.Name, Tier: t.Tier, TierSpec: tier}, nil
}

// errKeyTierAbove refuses a key minted at a tier that is not within its tenant's (minted before
// tiers were compared by what they grant, or the tenant's tier changed since): it may run
// neither at its own tier, which grants more than the tenant's, nor at the tenant's, which
// grants more than the key was given.
var errKeyTierAbove = fmt.Errorf("the key's tier grants more than its tenant's; mint a new key: %w", ErrUnauthenticated)

// capTier lowers p to tier cap when the credential names one: p runs at cap when cap is within
// its tenant's tier, at the tenant's tier when that is within cap, and is refused when neither
// is. An empty cap changes nothing.
func (d *Directory) capTier(p *Principal, cap string) error {
	if cap == "" {
		return nil
	}
	spec, ok := d.Tier(cap)
	if !ok {
		return errUndeclaredTier
	}
	p.TierCapped = true
	switch {
	case spec == p.TierSpec:
	case spec.Within(p.TierSpec):
		p.lowerTo(spec)
	case !p.TierSpec.Within(spec):
		return errKeyTierAbove
	}
	return nil
}

// Tenant returns a tenant by id, from the config file or the store (as last loaded).
func (d *Directory) Tenant(id string) (Tenant, bool) {
	if t, ok := d.configIDs[id]; ok {
		return t, true
	}
	t, ok := d.snap.Load().tenants[id]
	return t, ok
}

// IsConfigTenant reports whether id is a read-only tenant of the config file.
func (d *Directory) IsConfigTenant(id string) bool {
	_, ok := d.configIDs[id]
	return ok
}

// ConfigTenants returns the read-only tenants of the config file, ordered by id.
func (d *Directory) ConfigTenants() []Tenant {
	out := make([]Tenant, 0, len(d.configIDs))
	for _, t := range d.configIDs {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Tier returns the tier named name; shared, never modified.
func (d *Directory) Tier(name string) (*Tier, bool) {
	t, ok := d.tiers.Load().byName[name]
	return t, ok
}

// Tiers returns the declared tiers, highest first; shared, never modified.
func (d *Directory) Tiers() []Tier { return d.tiers.Load().list }

// DefaultTier is the tier of a new tenant that names none.
func (d *Directory) DefaultTier() string { return d.tiers.Load().defaultTier }

// SetTiers replaces the declared tiers and the default tier, as a config reload does: requests
// authenticated from then on carry the new tiers (rates, classes, weights, deadlines, models);
// requests already admitted keep the tier they started with. tiers must have passed
// Config.Validate (after SetDefaults). The change is refused, and the old tiers stay, when a
// tenant of the config file or defaultTier names a tier no longer declared. Stored tenants whose
// tier disappears are refused at authentication until it is declared again. Safe for concurrent
// use with Authenticate.
func (d *Directory) SetTiers(tiers []Tier, defaultTier string) error {
	ts, err := newTierSet(tiers, defaultTier, d.specs)
	if err != nil {
		return err
	}
	d.tiers.Store(ts)
	return nil
}

// atOrBelow reports whether tier lower may stand in for tier upper: both are declared and lower
// grants nothing upper does not (Tier.Within).
func (d *Directory) atOrBelow(lower, upper string) bool {
	ts := d.tiers.Load()
	l, ok1 := ts.byName[lower]
	u, ok2 := ts.byName[upper]
	return ok1 && ok2 && l.Within(u)
}

// maxIncrementalChanges bounds the changes a reload applies row by row; more, and it reads
// everything at once.
const maxIncrementalChanges = 256

// Reload reads the store now when its revision changed since the last load: only the tenants
// and keys changed since (from the store's changes log), or everything when the log no longer
// covers them. Safe to call from any goroutine; Run calls it every PollInterval and on every
// announcement.
func (d *Directory) Reload(ctx context.Context) error {
	if d.store == nil {
		return nil
	}
	d.reloadMu.Lock()
	defer d.reloadMu.Unlock()
	old := d.snap.Load()
	// The revision is read before the rows: a change landing in between leaves rev behind the
	// rows, so the next poll loads again; it never hides a change.
	rev, err := d.store.Revision(ctx)
	if err != nil {
		d.reloadErrors.Inc()
		return err
	}
	if rev == old.rev {
		return nil
	}
	next, err := d.loadChanges(ctx, old, rev)
	kind := "incremental"
	if next == nil && err == nil {
		next, err = d.loadAll(ctx, old, rev)
		kind = "full"
	}
	if err != nil {
		d.reloadErrors.Inc()
		return err
	}
	d.snap.Store(next)
	d.reloads.WithLabelValues(kind).Inc()
	if d.removed != nil { // one pass over the tenants, on the reloads that changed something
		for id := range old.tenants {
			if _, ok := next.tenants[id]; !ok {
				d.removed(id)
			}
		}
	}
	return nil
}

// loadAll reads every stored tenant and key.
func (d *Directory) loadAll(ctx context.Context, old *snapshot, rev int64) (*snapshot, error) {
	tenants, err := d.store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	keys, err := d.store.Keys(ctx, "")
	if err != nil {
		return nil, err
	}
	next := &snapshot{rev: rev, tenants: make(map[string]Tenant, len(tenants)), keys: make(map[string]*keyEntry, len(keys))}
	for _, t := range tenants {
		next.tenants[t.ID] = t
	}
	for _, k := range keys {
		if e := d.keyEntry(k, old); e != nil {
			next.keys[k.ID] = e
		}
	}
	next.traceParents()
	return next, nil
}

// maxKeyGenerations bounds the parents traced for one key.
const maxKeyGenerations = 32

// traceParents sets the parents of the keys new in s (those minted by a key and not traced
// yet), from the keys s holds. A parent's own Parent never changes, so traced entries stay
// right.
func (s *snapshot) traceParents() {
	for _, e := range s.keys {
		if e.Parent == "" || e.traced {
			continue
		}
		parents := []string{e.Parent}
		for p, ok := s.keys[e.Parent]; ok && p.Parent != "" && len(parents) < maxKeyGenerations; p, ok = s.keys[p.Parent] {
			if slices.Contains(parents, p.Parent) || p.Parent == e.ID {
				break
			}
			parents = append(parents, p.Parent)
		}
		e.parents, e.traced = strings.Join(parents, " "), true
	}
}

// loadChanges applies the changes between old and rev to a copy of old, reading only the rows
// they name. It returns nil, nil when the changes log does not hold them all (or they are too
// many): the caller then reads everything.
func (d *Directory) loadChanges(ctx context.Context, old *snapshot, rev int64) (*snapshot, error) {
	if old.rev < 0 || rev < old.rev || rev-old.rev > maxIncrementalChanges {
		return nil, nil
	}
	changes, err := d.store.Changes(ctx, old.rev, rev)
	if err != nil {
		return nil, err
	}
	if int64(len(changes)) != rev-old.rev {
		return nil, nil
	}
	next := &snapshot{rev: rev, tenants: maps.Clone(old.tenants), keys: maps.Clone(old.keys)}
	for _, c := range changes {
		if c.KeyID != "" {
			k, err := d.store.Key(ctx, c.KeyID)
			switch {
			case errors.Is(err, ErrNotFound):
				delete(next.keys, c.KeyID)
			case err != nil:
				return nil, err
			default:
				if e := d.keyEntry(k, old); e != nil {
					next.keys[k.ID] = e
				}
			}
			continue
		}
		t, err := d.store.Tenant(ctx, c.TenantID)
		switch {
		case errors.Is(err, ErrNotFound): // deleted, with its keys
			delete(next.tenants, c.TenantID)
			maps.DeleteFunc(next.keys, func(_ string, e *keyEntry) bool { return e.TenantID == c.TenantID })
		case err != nil:
			return nil, err
		default:
			next.tenants[t.ID] = t
		}
	}
	next.traceParents()
	return next, nil
}

// keyEntry builds the in-memory entry of k, keeping the last-used times old knew; nil when the
// stored hash is malformed.
func (d *Directory) keyEntry(k APIKey, old *snapshot) *keyEntry {
	e := &keyEntry{APIKey: k}
	if _, err := hex.Decode(e.hash[:], []byte(k.secretHash)); err != nil {
		d.logger.Error("api key with a malformed hash in the store; it cannot authenticate", "key_id", k.ID)
		return nil
	}
	e.lastUsed.Store(k.LastUsed.UnixMilli())
	e.flushed.Store(k.LastUsed.UnixMilli())
	if prev, ok := old.keys[k.ID]; ok {
		e.lastUsed.Store(max(e.lastUsed.Load(), prev.lastUsed.Load()))
		e.flushed.Store(max(e.flushed.Load(), prev.flushed.Load()))
	}
	return e
}

// Changed makes a change just written to the store effective: this replica reloads at once and
// the others are told over Redis (when configured). Failures are logged and counted, not
// returned: the change is stored, and every replica sees it at its next poll.
func (d *Directory) Changed(ctx context.Context) {
	d.reloadLogged(ctx)
	if d.redis != nil {
		if err := d.redis.Publish(ctx, ChangesChannel, "changed").Err(); err != nil {
			d.publishErrors.Inc()
			d.logger.Warn("announce tenant change over redis", "err", err)
		}
	}
}

// Run keeps the directory fresh until ctx ends: it polls the store's revision, listens for
// announcements on Redis, and writes last-used times in batches (a last batch on the way out).
// It returns nil when ctx ends. Without a store it only waits for ctx. Run once per Directory.
func (d *Directory) Run(ctx context.Context) error {
	if d.store == nil {
		<-ctx.Done()
		return nil
	}
	var announcements <-chan *redis.Message
	if d.redis != nil {
		ps := d.redis.Subscribe(ctx, ChangesChannel)
		defer ps.Close()
		announcements = ps.Channel()
	}
	poll := time.NewTicker(d.poll)
	defer poll.Stop()
	flush := time.NewTicker(d.flush)
	defer flush.Stop()
	for {
		select {
		case <-ctx.Done():
			stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			d.FlushLastUsed(stop)
			cancel()
			return nil
		case <-announcements:
			d.reloadLogged(ctx)
		case <-poll.C:
			d.reloadLogged(ctx)
		case <-flush.C:
			d.FlushLastUsed(ctx)
		}
	}
}

func (d *Directory) reloadLogged(ctx context.Context) {
	if err := d.Reload(ctx); err != nil && !errors.Is(err, context.Canceled) {
		d.logger.Warn("reload tenants and keys; keeping the previous view", "err", err)
	}
}

// FlushLastUsed writes the last-used times recorded since the previous flush in one transaction.
func (d *Directory) FlushLastUsed(ctx context.Context) {
	if d.store == nil {
		return
	}
	used := map[string]time.Time{}
	var entries []*keyEntry
	for id, e := range d.snap.Load().keys {
		if u := e.lastUsed.Load(); u > e.flushed.Load() {
			used[id] = time.UnixMilli(u)
			entries = append(entries, e)
		}
	}
	if len(used) == 0 {
		return
	}
	if err := d.store.TouchKeys(ctx, used); err != nil {
		d.flushErrors.Inc()
		d.logger.Warn("write api keys' last-used times", "keys", len(used), "err", err)
		return
	}
	for _, e := range entries {
		e.flushed.Store(used[e.ID].UnixMilli())
	}
}

// SetJWT replaces the JWT verifier (a reload of the keys, SIGHUP); nil accepts no JWT from then
// on. Requests being verified finish with the verifier they began with.
func (d *Directory) SetJWT(v *JWTVerifier) { d.jwt.Store(v) }
