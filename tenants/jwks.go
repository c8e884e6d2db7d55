package tenants

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// JWKS by URL: the identity provider's key set (jwt.jwks_url), fetched and cached so that a
// token costs no I/O in the common case, and refreshed so that its key rotations reach usher:
//
//   - A fetched set is used for its Cache-Control max-age, bounded to [jwks_min_refresh,
//     jwks_max_refresh] (jwks_max_refresh when the answer says none, jwks_min_refresh when it
//     says no-store or no-cache). A token presented after that refreshes the set in the
//     background and is verified with the keys at hand meanwhile.
//   - A token whose key is not in the set (a new `kid` after a rotation) refreshes it at once and
//     waits for the answer, at most jwks_timeout; such refreshes happen at most once per
//     jwks_min_refresh, so tokens with made-up key ids cannot make usher hammer the provider.
//     Concurrent tokens share one fetch.
//   - When the provider cannot be reached, the keys last fetched stay in use; a token whose key
//     is unknown then gets 401 within jwks_timeout, never a hang.
//   - A refreshed set replaces the old one: a key the provider withdrew verifies nothing more,
//     and tokens it verified earlier are verified again.

// JWKSFetcher fetches a JSON Web Key Set: the document at url and how long it may be cached, as
// its answer says (0: not said; negative: not to be kept, as no-store and no-cache say). The
// HTTP fetcher lives with the wiring (package tenants does no HTTP); it must honour ctx.
type JWKSFetcher interface {
	FetchJWKS(ctx context.Context, url string) (body []byte, maxAge time.Duration, err error)
}

// Defaults of the JWKS URL settings.
const (
	DefaultJWKSMinRefresh = 30 * time.Second
	DefaultJWKSMaxRefresh = time.Hour
	DefaultJWKSTimeout    = 5 * time.Second
)

// errTokenKeyUnavailable: the token's key is not among the keys at hand and the key set could not
// be fetched.
var errTokenKeyUnavailable = fmt.Errorf("the token's signing key is unknown and the key set could not be fetched: %w", ErrUnauthenticated)

// jwksSource is the key set of one URL. Safe for concurrent use: keys are read with one atomic
// load; refreshes are serialised by mu.
type jwksSource struct {
	url                             string
	fetcher                         JWKSFetcher
	now                             func() time.Time
	minRefresh, maxRefresh, timeout time.Duration
	allowed                         func(alg string) bool
	// changed is called after a fetch that replaced the keys (the verifier forgets the tokens
	// it verified).
	changed func()
	log     *slog.Logger

	keys atomic.Pointer[map[string][]verificationKey] // by algorithm; nil before the first fetch
	// due is when the keys at hand are to be refreshed, in Unix nanoseconds; written under mu.
	due atomic.Int64

	mu          sync.Mutex    // guards the fields below
	lastAttempt time.Time     // the start of the last fetch
	inflight    chan struct{} // closed when the running fetch ends; nil when none runs
	lastErr     error         // the last fetch's error; nil after a success
}

// forAlgorithm returns the keys of alg at hand and, when they are due for a refresh, starts one
// in the background. Cost: two atomic loads and, once the set is due, a mutex.
func (s *jwksSource) forAlgorithm(alg string) []verificationKey {
	s.refreshIfDue()
	m := s.keys.Load()
	if m == nil {
		return nil
	}
	return (*m)[alg]
}

// refreshIfDue starts a background refresh when the keys at hand are due for one. Every JWT
// presented calls it, remembered ones too, so a withdrawn key stops verifying within
// jwks_max_refresh of its withdrawal even for a token verified before.
func (s *jwksSource) refreshIfDue() {
	if s.now().UnixNano() >= s.due.Load() {
		s.start(false)
	}
}

// refreshForUnknownKey fetches the set again for a token whose key is not at hand and waits for
// the answer, unless a fetch began less than minRefresh ago (then it only joins a fetch still
// running). It returns the error to refuse the token with when the last fetch failed.
func (s *jwksSource) refreshForUnknownKey() error {
	if done := s.start(true); done != nil {
		<-done
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lastErr != nil {
		return errTokenKeyUnavailable
	}
	return nil
}

// start begins a fetch unless one runs (whose end it then returns) or, for an unknown key
// (rateLimited), one began less than minRefresh ago (it returns nil). The fetch runs on its own
// goroutine, which ends within timeout.
func (s *jwksSource) start(rateLimited bool) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight != nil {
		return s.inflight
	}
	now := s.now()
	if rateLimited && !s.lastAttempt.IsZero() && now.Sub(s.lastAttempt) < s.minRefresh {
		return nil
	}
	if !rateLimited && now.UnixNano() < s.due.Load() {
		return nil
	}
	s.lastAttempt = now
	done := make(chan struct{})
	s.inflight = done
	go func() {
		defer close(done)
		s.fetch()
	}()
	return done
}

// fetch reads the set once and replaces the keys at hand with it; on failure the keys stay and
// the next refresh is due after minRefresh.
func (s *jwksSource) fetch() {
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	defer cancel()
	body, maxAge, err := s.fetcher.FetchJWKS(ctx, s.url)
	var m map[string][]verificationKey
	if err == nil {
		m, err = s.parse(body)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight = nil
	s.lastErr = err
	if err != nil {
		s.due.Store(s.now().Add(s.minRefresh).UnixNano())
		s.log.Warn("jwt: the key set could not be fetched; the keys fetched before stay in use", "url", s.url, "err", err)
		return
	}
	switch {
	case maxAge == 0:
		maxAge = s.maxRefresh
	case maxAge < 0:
		maxAge = s.minRefresh
	}
	s.due.Store(s.now().Add(min(max(maxAge, s.minRefresh), s.maxRefresh)).UnixNano())
	s.keys.Store(&m)
	s.changed()
}

// maxJWKSKeys bounds the keys taken from one set.
const maxJWKSKeys = 100

// parse reads a fetched set into keys by algorithm. Keys of algorithms not allowed, or not usable
// (a weak RSA key, an unsupported curve), are left out; a set with no usable key is an error.
func (s *jwksSource) parse(body []byte) (map[string][]verificationKey, error) {
	keys, err := readJWKS(body, true)
	if err != nil {
		return nil, fmt.Errorf("reading the key set: %w", err)
	}
	m := map[string][]verificationKey{}
	n := 0
	for _, k := range keys {
		alg, err := keyAlgorithm(k.key)
		if err != nil || !s.allowed(alg) || n == maxJWKSKeys {
			continue
		}
		m[alg] = append(m[alg], k)
		n++
	}
	if n == 0 {
		return nil, errors.New("the key set holds no key of an allowed algorithm")
	}
	return m, nil
}
