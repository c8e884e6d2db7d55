package routing

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"sync"
	"sync/atomic"
)

// CacheScope is whose prompts may share a prefix cache (Config.CacheScope): a prompt matches, and
// reuses, only prefixes its own scope put in a cache. The zero value is CacheScopeTenant, so a
// policy built without a scope isolates tenants.
type CacheScope string

// Cache scopes.
const (
	// CacheScopeTenant: each tenant's prompts match only its own prefixes.
	CacheScopeTenant CacheScope = "tenant"
	// CacheScopeTier: the tenants of one tier (the tier of the key each request came with)
	// share their prefixes.
	CacheScopeTier CacheScope = "tier"
	// CacheScopeGlobal: every prompt may match every other's prefixes.
	CacheScopeGlobal CacheScope = "global"
)

func (s CacheScope) valid() bool {
	return s == CacheScopeTenant || s == CacheScopeTier || s == CacheScopeGlobal
}

// namespace names the part of every prefix cache r may match: the tenant's or the tier's
// ("tenant:ID", "tier:NAME"), or "" when every request shares (CacheScopeGlobal). The kind's
// prefix keeps a tenant and a tier of the same name apart.
func (s CacheScope) namespace(r *Request) string {
	switch s {
	case CacheScopeGlobal:
		return ""
	case CacheScopeTier:
		return "tier:" + r.Tier
	}
	return "tenant:" + r.Tenant
}

// saltDerivation keys the salts of a deployment without Config.CacheSaltKey.
const saltDerivation = "usher cache_salt v1"

// IsolatesCache reports whether w's engine partitions its prefix cache by the cache_salt usher
// sends it: WorkerSpec.CacheSalt when set, else true unless the engine reported fixed slots
// (llama.cpp's server, which ignores the field: Worker.SlotEngine).
func (w *Worker) IsolatesCache() bool {
	if w.spec.CacheSalt != nil {
		return *w.spec.CacheSalt
	}
	return !w.SlotEngine()
}

// CacheSalt is the cache_salt to send with the lease's request: HMAC-SHA256 of its cache scope's
// namespace under Config.CacheSaltKey, 43 characters of unpadded base64url, the same on every
// replica for the same scope and key. "" when nothing is to be sent: every request shares
// (CacheScopeGlobal) or the worker's engine takes no salt (Worker.IsolatesCache). The tenant's
// own credentials never enter it. Costs a map look-up; one HMAC for a scope not seen lately.
func (l *Lease) CacheSalt() string {
	if l.namespace == "" || !l.Worker.IsolatesCache() {
		return ""
	}
	return l.pool.salts.of(l.namespace, l.pool.cfg.CacheSaltKey)
}

// maxSalts bounds the salts a pool remembers: a deployment with more scopes in use computes
// some again.
const maxSalts = 1 << 14

// saltCache remembers the salts of the scopes in use under one key, at most maxSalts; past that,
// or under another key, it starts afresh. The zero value is ready. Safe for concurrent use.
type saltCache struct {
	mu    sync.Mutex // guards key and salts
	key   string
	salts map[string]string
}

// of is namespace's salt under key (saltDerivation when empty).
func (c *saltCache) of(namespace, key string) string {
	c.mu.Lock()
	salt, ok := c.salts[namespace]
	ok = ok && c.key == key
	c.mu.Unlock()
	if ok {
		return salt
	}
	computedKey := key
	if key == "" {
		key = saltDerivation
	}
	mac := hmac.New(sha256.New, []byte(key))
	mac.Write([]byte(namespace))
	salt = base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	c.mu.Lock()
	if c.salts == nil || len(c.salts) >= maxSalts || c.key != computedKey {
		c.salts, c.key = make(map[string]string), computedKey
	}
	c.salts[namespace] = salt
	c.mu.Unlock()
	return salt
}

// OwnCached bounds cached, the prompt tokens of promptTokens that the lease's engine reported
// finding in its cache, by what the request's own cache scope can have put there, so that a
// client is never told of another scope's prefix. When every request shares a cache
// (CacheScopeGlobal), the engine isolates scopes by salt, or the worker has served no scope but
// this one since it joined the pool (a fleet of one tenant), the engine's count stands. Otherwise
// the engine's cache is shared by every scope sent to the worker (llama.cpp's slots), and only
// the prefix the policy's tree predicted this scope held there counts (cache_aware's prediction,
// scaled from bytes to tokens); a policy that keeps no tree knows nothing of the scope's own
// prefixes, and the bound is 0. Costs a few operations.
func (l *Lease) OwnCached(cached, promptTokens int) int {
	if l.namespace == "" || l.Worker.IsolatesCache() || l.Worker.scopes.only(l.namespace) {
		return cached
	}
	p := l.pred
	if p.worker == "" || p.prompt <= 0 || p.held <= 0 {
		return 0
	}
	return min(cached, int(int64(promptTokens)*int64(p.held)/int64(p.prompt)))
}

// scopeRecord remembers the one cache scope sent to a worker until a second one comes; then it
// says mixed for good (an engine keeps a prompt in its cache for as long as it likes). The zero
// value has seen none. Safe for concurrent use; noting costs an atomic load once mixed.
type scopeRecord struct {
	sole  atomic.Pointer[string]
	mixed atomic.Bool
}

// note records that a request of scope namespace ("" for the global scope: nothing) was sent.
func (s *scopeRecord) note(namespace string) {
	if namespace == "" || s.mixed.Load() {
		return
	}
	sole := s.sole.Load()
	if sole == nil {
		first := namespace // on the heap only here: once a worker, not at every request
		if s.sole.CompareAndSwap(nil, &first) {
			return
		}
		sole = s.sole.Load()
	}
	if *sole != namespace {
		s.mixed.Store(true)
	}
}

// only reports whether namespace is the one scope ever sent.
func (s *scopeRecord) only(namespace string) bool {
	sole := s.sole.Load()
	return !s.mixed.Load() && sole != nil && *sole == namespace
}
