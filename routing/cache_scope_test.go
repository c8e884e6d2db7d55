package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// probe is what a client sees of one routing decision: the worker and the route.
type probe struct {
	worker string
	route  Route
}

// pickAndRelease routes r on p and ends the lease at once, so every pick sees the same load.
func pickAndRelease(t *testing.T, p *Pool, r *Request) probe {
	t.Helper()
	l, err := p.Pick(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	l.Release(Outcome{})
	return probe{l.Worker.ID(), l.Route}
}

// secretPrompt is a victim's prompt with a code word in it, and guess is an attacker's probe of
// it: the same template, another code word.
func secretPrompt(word string) string {
	return strings.Repeat("You are the support bot of Acme. ", 10) + "The vault code is " + word + ". Never tell it."
}

// TestCacheAwareTenantsDoNotSeeEachOthersPrefixes is the prefix-cache oracle of issue 26: tenant
// A sends a prompt with a secret; tenant B probes with guesses. What B sees of every probe (the
// worker and the route) must be the same whatever A's secret was, so a right guess looks like a
// wrong one and B is never steered to A's worker by A's prefix. (That A sent something shows,
// as it may: a cold prompt goes to the worker mirroring the least, whoever filled the others.)
// In the tier and global scopes, the tenants that share do see each other's prefixes, as
// configured.
func TestCacheAwareTenantsDoNotSeeEachOthersPrefixes(t *testing.T) {
	guesses := []string{"4711", "0000", "9999", "1234"} // the first is right
	// probes replays the attack on a fresh pool, the victim's prompt with secret first.
	probes := func(t *testing.T, scope CacheScope, attacker Request, secret string) (victim probe, seen []probe) {
		p, _ := newTestPool(t, Config{Workers: testWorkers(4, "m"), Policy: "cache_aware", CacheScope: scope})
		victim = pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Tier: "pro", Prompt: secretPrompt(secret), Tokens: 1})
		for _, g := range guesses {
			r := attacker
			r.Model, r.Prompt, r.Tokens = "m", secretPrompt(g), 1
			seen = append(seen, pickAndRelease(t, p, &r))
		}
		return victim, seen
	}
	tests := []struct {
		name     string
		scope    CacheScope
		attacker Request
		shares   bool
	}{
		{"tenant scope, another tenant of the same tier", CacheScopeTenant, Request{Tenant: "mallory", Tier: "pro"}, false},
		{"tenant scope is the default", "", Request{Tenant: "mallory", Tier: "pro"}, false},
		{"tier scope, a tenant of another tier", CacheScopeTier, Request{Tenant: "mallory", Tier: "free"}, false},
		{"tier scope, a tenant of the same tier", CacheScopeTier, Request{Tenant: "mallory", Tier: "pro"}, true},
		{"global scope", CacheScopeGlobal, Request{Tenant: "mallory", Tier: "free"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			victim, with := probes(t, tt.scope, tt.attacker, guesses[0])
			_, without := probes(t, tt.scope, tt.attacker, "5822")
			if tt.shares {
				if with[0] != (probe{victim.worker, RouteCacheHit}) {
					t.Errorf("the right guess: got %+v, want a cache hit on the victim's worker %s (the scope shares)", with[0], victim.worker)
				}
				return
			}
			for i := range guesses {
				if with[i] != without[i] {
					t.Errorf("guess %d (%s): got %+v when it is the victim's secret, %+v when it is not: the attacker can tell", i, guesses[i], with[i], without[i])
				}
			}
			if with[0].route == RouteCacheHit || with[0].worker == victim.worker {
				t.Errorf("the right guess: got %+v, want no cache hit on the victim's worker %s", with[0], victim.worker)
			}
		})
	}
}

// TestCacheAwareOwnPrefixesStillHit: isolation costs a tenant nothing of its own reuse.
func TestCacheAwareOwnPrefixesStillHit(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(4, "m"), Policy: "cache_aware"})
	first := pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Prompt: secretPrompt("4711"), Tokens: 1})
	again := pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Prompt: secretPrompt("4711") + " And?", Tokens: 1})
	if again != (probe{first.worker, RouteCacheHit}) {
		t.Errorf("the tenant's own follow-up: got %+v, want a cache hit on %s", again, first.worker)
	}
}

// TestCacheAwareSharedTreeKeepsScopes: a prompt another replica routed is known only within its
// scope, so the shared tree is no oracle either.
func TestCacheAwareSharedTreeKeepsScopes(t *testing.T) {
	for _, tt := range []struct {
		scope  CacheScope
		shares bool
	}{{CacheScopeTenant, false}, {CacheScopeGlobal, true}} {
		t.Run(string(tt.scope), func(t *testing.T) {
			feed := &memFeed{}
			a, b := startScopedSharingPool(t, feed, tt.scope), startScopedSharingPool(t, feed, tt.scope)
			victim := pickAndRelease(t, a, &Request{Model: "m", Tenant: "acme", Prompt: secretPrompt("4711"), Tokens: 1})
			received := b.metrics.cacheShared.WithLabelValues("m", "received")
			deadline := time.Now().Add(10 * time.Second)
			for testutil.ToFloat64(received) < 1 {
				if time.Now().After(deadline) {
					t.Fatal("replica B never applied A's insert")
				}
				time.Sleep(5 * time.Millisecond)
			}
			own := pickAndRelease(t, b, &Request{Model: "m", Tenant: "acme", Prompt: secretPrompt("4711") + " And?", Tokens: 1})
			if own != (probe{victim.worker, RouteCacheHit}) {
				t.Errorf("the victim's own follow-up on B: got %+v, want a cache hit on %s", own, victim.worker)
			}
			guess := pickAndRelease(t, b, &Request{Model: "m", Tenant: "mallory", Prompt: secretPrompt("4711"), Tokens: 1})
			if hit := guess.route == RouteCacheHit; hit != tt.shares {
				t.Errorf("another tenant's right guess on B: got %+v, want a cache hit: %v", guess, tt.shares)
			}
		})
	}
}

// startScopedSharingPool is startSharingPool with a cache scope.
func startScopedSharingPool(t *testing.T, feed PrefixFeed, scope CacheScope) *Pool {
	t.Helper()
	cfg := Config{Workers: testWorkers(3, "m"), Policy: "cache_aware", CacheScope: scope}
	cfg.Concurrency.Initial = DefaultMaxConcurrency
	p, err := NewPool(cfg, Options{Prefixes: feed})
	if err != nil {
		t.Fatal(err)
	}
	ca := p.snap.Load().models["m"].policy.(*CacheAware)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ca.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

// TestRadixScopeRootsLeaveWithTheirLastPrefix: a scope's root costs nothing once its prefixes are
// gone, so many tenants do not grow the tree beyond their entries.
func TestRadixScopeRootsLeaveWithTheirLastPrefix(t *testing.T) {
	tr := newRadixTree()
	for i := range 100 {
		treePutIn(tr, fmt.Sprintf("tenant:t%d", i), "w0", fmt.Sprintf("prompt %d", i), int64(i))
	}
	if len(tr.scopes) != 100 {
		t.Fatalf("got %d scopes, want 100", len(tr.scopes))
	}
	checkTree(t, tr)
	tr.evict(tr.slots["w0"], 0, 1000)
	if len(tr.scopes) != 0 || tr.nodes != 0 {
		t.Errorf("after evicting everything: %d scopes and %d nodes, want none", len(tr.scopes), tr.nodes)
	}
	if d := tr.descend(tr.scopeRoot("tenant:t1", false), "prompt 1"); d.matched() != 0 {
		t.Errorf("a scope without prefixes matched %d bytes, want 0", d.matched())
	}
	checkTree(t, tr)
}

func TestCacheScopeConfig(t *testing.T) {
	for _, tt := range []struct {
		scope   CacheScope
		want    CacheScope
		wantErr bool
	}{
		{"", CacheScopeTenant, false},
		{"tenant", CacheScopeTenant, false},
		{"tier", CacheScopeTier, false},
		{"global", CacheScopeGlobal, false},
		{"Tenant", "", true},
		{"none", "", true},
	} {
		cfg := Config{Workers: testWorkers(1, "m"), CacheScope: tt.scope}
		cfg.SetDefaults()
		err := cfg.Validate()
		switch {
		case tt.wantErr && (err == nil || !strings.Contains(err.Error(), "routing.cache_scope")):
			t.Errorf("cache_scope %q: got %v, want an error naming routing.cache_scope", tt.scope, err)
		case !tt.wantErr && (err != nil || cfg.CacheScope != tt.want):
			t.Errorf("cache_scope %q: got %q, %v; want %q", tt.scope, cfg.CacheScope, err, tt.want)
		}
	}
}

// TestCacheSalt: one salt per scope, never the tenant's ID in clear, keyed by the deployment's
// secret; none where everyone shares or the engine takes none.
func TestCacheSalt(t *testing.T) {
	off := false
	specs := testWorkers(2, "m")
	specs[1].CacheSalt = &off
	salt := func(scope CacheScope, key string, r Request, worker string) string {
		p, _ := newTestPool(t, Config{Workers: specs, CacheScope: scope, CacheSaltKey: key, Policy: "cache_aware"})
		r.Model, r.Tokens, r.TargetWorker = "m", 1, worker
		l, err := p.Pick(context.Background(), &r)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(Outcome{})
		return l.CacheSalt()
	}
	acme, acme2 := Request{Tenant: "acme", Tier: "pro"}, Request{Tenant: "acme", Tier: "free"}
	mallory := Request{Tenant: "mallory", Tier: "pro"}
	a := salt(CacheScopeTenant, "k1", acme, "w0")
	if len(a) != 43 || strings.Contains(a, "acme") {
		t.Errorf("salt %q: want 43 characters of base64url, not the tenant's ID", a)
	}
	for _, tt := range []struct {
		name string
		got  string
		same bool
	}{
		{"same tenant, another replica", salt(CacheScopeTenant, "k1", acme, "w0"), true},
		{"same tenant, another key of it", salt(CacheScopeTenant, "k1", acme2, "w0"), true},
		{"another tenant", salt(CacheScopeTenant, "k1", mallory, "w0"), false},
		{"another deployment's key", salt(CacheScopeTenant, "k2", acme, "w0"), false},
		{"no key: a fixed derivation", salt(CacheScopeTenant, "", acme, "w0"), false},
	} {
		if (tt.got == a) != tt.same || tt.got == "" {
			t.Errorf("%s: got %q against %q, want the same: %v", tt.name, tt.got, a, tt.same)
		}
	}
	if x, y := salt(CacheScopeTier, "k1", acme, "w0"), salt(CacheScopeTier, "k1", mallory, "w0"); x != y || x == "" || x == a {
		t.Errorf("tier scope: got %q and %q for two tenants of one tier, want one salt, not the tenant's", x, y)
	}
	if x := salt(CacheScopeGlobal, "k1", acme, "w0"); x != "" {
		t.Errorf("global scope: got salt %q, want none", x)
	}
	if x := salt(CacheScopeTenant, "k1", acme, "w1"); x != "" {
		t.Errorf("a worker with cache_salt false: got salt %q, want none", x)
	}
}

// TestOwnCached: the cached tokens a client is told never exceed what its own scope put in the
// engine's cache, as far as the gateway can know.
func TestOwnCached(t *testing.T) {
	off := false
	specs := testWorkers(2, "m")
	specs[1].CacheSalt = &off
	for _, tt := range []struct {
		name   string
		scope  CacheScope
		worker string
		prior  string // a prompt the same tenant sent to the worker before, "" for none
		want   int
	}{
		{"a salted engine's count stands", CacheScopeTenant, "w0", "", 90},
		{"an unsalted engine, nothing of the tenant's there", CacheScopeTenant, "w1", "", 0},
		{"an unsalted engine, half the prompt the tenant's", CacheScopeTenant, "w1", strings.Repeat("a", 200), 50},
		{"global scope: the engine's count stands", CacheScopeGlobal, "w1", "", 90},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newTestPool(t, Config{Workers: specs, CacheScope: tt.scope, Policy: "cache_aware"})
			prompt := strings.Repeat("a", 200) + strings.Repeat("b", 200)
			for _, w := range modelWorkers(t, p, "m") {
				if w.ID() != tt.worker {
					markDown(w)
				}
			}
			if tt.prior != "" {
				pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Prompt: tt.prior, Tokens: 1})
			}
			// Another tenant's whole prompt there changes nothing.
			pickAndRelease(t, p, &Request{Model: "m", Tenant: "mallory", Prompt: prompt, Tokens: 1})
			l, err := p.Pick(context.Background(), &Request{Model: "m", Tenant: "acme", Prompt: prompt, Tokens: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release(Outcome{})
			if got := l.OwnCached(90, 100); got != tt.want {
				t.Errorf("engine reported 90 of 100 cached: got %d, want %d", got, tt.want)
			}
		})
	}
}

// TestKVAwareEventsDecideOnlyInTheGlobalScope: another tenant's blocks in an engine's events do
// not draw a tenant's prompt (nor a kv_hit route) outside the global scope, and no /tokenize is
// asked for them.
func TestKVAwareEventsDecideOnlyInTheGlobalScope(t *testing.T) {
	const bs = 4
	prompt := seqTokens(1, 10*bs)
	var asked atomic.Int32
	tok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		asked.Add(1)
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": prompt})
	}))
	defer tok.Close()
	for _, tt := range []struct {
		scope     CacheScope
		wantRoute Route
		wantAsked int32
	}{{CacheScopeGlobal, RouteKVHit, 1}, {CacheScopeTenant, RouteCacheMiss, 0}, {CacheScopeTier, RouteCacheMiss, 0}} {
		t.Run(string(tt.scope), func(t *testing.T) {
			asked.Store(0)
			ws, k := kvFleet(t, 3, tok.URL)
			k.scope, k.fallback.scope = tt.scope, tt.scope
			kvHold(t, k, "w2", prompt, 8, bs) // what the victim's prompt left in w2's engine
			w, route := k.Pick(context.Background(), kvPrepared(k, &Request{Model: "m", Tenant: "mallory", Prompt: "the prompt"}, ws), ws)
			if route != tt.wantRoute || (route == RouteKVHit) != (w.ID() == "w2") {
				t.Errorf("got %s by %s, want route %s", w.ID(), route, tt.wantRoute)
			}
			if asked.Load() != tt.wantAsked {
				t.Errorf("/tokenize asked %d times, want %d", asked.Load(), tt.wantAsked)
			}
		})
	}
}

// TestPrefixHashKeysByScope: a tenant's prompts keep meeting on one worker; another tenant's copy
// of a prompt is not sent where the first tenant's is cached merely by being the same text, but
// in the global scope it is.
func TestPrefixHashKeysByScope(t *testing.T) {
	for _, tt := range []struct {
		scope CacheScope
		apart bool
	}{{CacheScopeTenant, true}, {CacheScopeGlobal, false}} {
		t.Run(string(tt.scope), func(t *testing.T) {
			p, _ := newTestPool(t, Config{Workers: testWorkers(8, "m"), Policy: "prefix_hash", CacheScope: tt.scope})
			apart := 0
			for i := range 20 {
				prompt := fmt.Sprintf("system prompt number %d, then a question", i)
				a := pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Prompt: prompt, Tokens: 1})
				again := pickAndRelease(t, p, &Request{Model: "m", Tenant: "acme", Prompt: prompt, Tokens: 1})
				b := pickAndRelease(t, p, &Request{Model: "m", Tenant: "mallory", Prompt: prompt, Tokens: 1})
				if a != again {
					t.Fatalf("prompt %d: one tenant's repeat went to %+v, then %+v", i, a, again)
				}
				if a.worker != b.worker {
					apart++
				}
			}
			if (apart > 0) != tt.apart {
				t.Errorf("two tenants' same prompt on different workers %d times of 20, want apart: %v", apart, tt.apart)
			}
		})
	}
}

// TestSlotEnginesAreNotTrustedToIsolate: llama.cpp's server (an engine that reports fixed slots)
// ignores cache_salt, so unless the worker's cache_salt says otherwise its cached_tokens are not
// taken as the scope's own.
func TestSlotEnginesAreNotTrustedToIsolate(t *testing.T) {
	on := true
	cfg := Config{}
	cfg.SetDefaults()
	for _, tt := range []struct {
		name  string
		salt  *bool
		slots int64
		want  bool
	}{
		{"continuous batching, unset", nil, 0, true},
		{"slot engine, unset", nil, 4, false},
		{"slot engine, cache_salt true", &on, 4, true},
	} {
		w, err := newWorker(WorkerSpec{ID: "w", URL: "http://127.0.0.1:1", Models: []string{"m"}, CacheSalt: tt.salt}, cfg, time.Now)
		if err != nil {
			t.Fatal(err)
		}
		w.learner.setSlots(tt.slots)
		if got := w.IsolatesCache(); got != tt.want {
			t.Errorf("%s: IsolatesCache %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestOwnCachedOnAWorkerOfOneScope: an engine without a salt that has served only one scope
// (a fleet of one tenant) holds only that scope's prompts, so its cached count stands even
// under a policy that keeps no tree; once another scope was sent there, it no longer does.
func TestOwnCachedOnAWorkerOfOneScope(t *testing.T) {
	off := false
	specs := testWorkers(1, "m")
	specs[0].CacheSalt = &off
	p, _ := newTestPool(t, Config{Workers: specs, Policy: "least_request"})
	cached := func(tenant string) int {
		t.Helper()
		l, err := p.Pick(context.Background(), &Request{Model: "m", Tenant: tenant, Prompt: "hello there", Tokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Release(Outcome{})
		return l.OwnCached(90, 100)
	}
	if got := cached("acme"); got != 90 {
		t.Errorf("the worker's only tenant: got %d cached, want the engine's 90", got)
	}
	if got := cached("mallory"); got != 0 {
		t.Errorf("a second tenant: got %d cached, want 0", got)
	}
	if got := cached("acme"); got != 0 {
		t.Errorf("the first tenant after a second came: got %d cached, want 0", got)
	}
}
