package tenants

import (
	"context"
	"crypto"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// fakeJWKS is an identity provider's key set in memory; the HTTP fetcher is tested in
// cmd/usher against a real server.
type fakeJWKS struct {
	mu      sync.Mutex // guards every field
	body    []byte
	maxAge  time.Duration
	err     error
	hang    bool // a fetch waits for its context to end
	fetches int
}

func (f *fakeJWKS) FetchJWKS(ctx context.Context, _ string) ([]byte, time.Duration, error) {
	f.mu.Lock()
	f.fetches++
	hang, body, maxAge, err := f.hang, f.body, f.maxAge, f.err
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, 0, ctx.Err()
	}
	return body, maxAge, err
}

func (f *fakeJWKS) set(t testing.TB, maxAge time.Duration, keys map[string]crypto.PublicKey) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.body, f.maxAge, f.err = jwksDocument(t, keys), maxAge, nil
}

func (f *fakeJWKS) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeJWKS) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fetches
}

// jwksDocument is a JWKS with the RSA keys given by kid.
func jwksDocument(t testing.TB, keys map[string]crypto.PublicKey) []byte {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	var set []map[string]string
	for kid, k := range keys {
		pub := k.(*rsa.PublicKey)
		set = append(set, map[string]string{"kty": "RSA", "kid": kid, "n": b64(pub.N.Bytes()), "e": b64(big.NewInt(int64(pub.E)).Bytes())})
	}
	// An encryption key of a type usher does not verify is skipped, not fatal.
	set = append(set, map[string]string{"kty": "oct", "kid": "enc", "k": "c2VjcmV0"})
	b, err := json.Marshal(map[string]any{"keys": set})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newURLVerifier(t *testing.T, f *fakeJWKS, clock *fakeClock) *JWTVerifier {
	t.Helper()
	c := JWTConfig{Algorithms: []string{"RS256"}, JWKSURL: "https://idp.example/jwks.json"}
	c.setDefaults()
	c.JWKSTimeout = 100 * time.Millisecond
	if errs := c.validate(); len(errs) > 0 {
		t.Fatal(errs)
	}
	v, err := NewJWTVerifierWith(c, JWTOptions{Now: clock.Now, Fetcher: f})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func tokenFor(t *testing.T, clock *fakeClock, key *rsa.PrivateKey, kid string) string {
	t.Helper()
	return sign(t, jwt.SigningMethodRS256, key, kid, jwt.MapClaims{"sub": "t1", "exp": clock.Now().Add(24 * time.Hour).Unix()})
}

// The key set rotates by kid: a token with a new kid fetches the set again at once, at most once
// per jwks_min_refresh; a withdrawn key verifies nothing more after the next refresh.
func TestJWKSURLRotatesByKeyID(t *testing.T) {
	k := keys(t)
	clock := newFakeClock()
	f := &fakeJWKS{}
	f.set(t, 0, map[string]crypto.PublicKey{"a": &k.rsa.PublicKey})
	v := newURLVerifier(t, f, clock)
	if f.count() != 1 {
		t.Fatalf("fetches at start: %d, want 1", f.count())
	}
	tokA := tokenFor(t, clock, k.rsa, "a")
	if _, err := v.verify(tokA); err != nil {
		t.Fatalf("token of key a: %v", err)
	}

	// The provider adds key b: a token signed with it fetches the set once (the last fetch being
	// older than jwks_min_refresh), then verifies.
	f.set(t, 0, map[string]crypto.PublicKey{"a": &k.rsa.PublicKey, "b": &k.otherRSA.PublicKey})
	clock.Advance(DefaultJWKSMinRefresh)
	tokB := tokenFor(t, clock, k.otherRSA, "b")
	if _, err := v.verify(tokB); err != nil {
		t.Fatalf("token of the new key b: %v", err)
	}
	if f.count() != 2 {
		t.Fatalf("fetches after the new kid: %d, want 2", f.count())
	}

	// Unknown key ids within jwks_min_refresh fetch nothing more, however many.
	for i := range 20 {
		if _, err := v.verify(tokenFor(t, clock, k.otherRSA, "made-up")); !errors.Is(err, errTokenSignature) {
			t.Fatalf("made-up kid %d: got %v, want a signature refusal", i, err)
		}
	}
	if f.count() != 2 {
		t.Fatalf("fetches after made-up kids: %d, want still 2", f.count())
	}

	// The provider withdraws key a: once the set is refreshed, a's tokens are refused.
	f.set(t, 0, map[string]crypto.PublicKey{"b": &k.otherRSA.PublicKey})
	clock.Advance(DefaultJWKSMinRefresh + time.Second)
	if _, err := v.verify(tokenFor(t, clock, k.rsa, "a2")); !errors.Is(err, errTokenSignature) {
		t.Fatalf("unknown kid after the bound: got %v, want a signature refusal", err)
	}
	if f.count() != 3 {
		t.Fatalf("fetches: %d, want 3", f.count())
	}
	if _, err := v.verify(tokA); !errors.Is(err, errTokenSignature) {
		t.Fatalf("token of the withdrawn key a: got %v, want a signature refusal", err)
	}
}

// A fetched set is used for its max-age, bounded to [jwks_min_refresh, jwks_max_refresh], then
// refreshed in the background while tokens are verified with the keys at hand.
func TestJWKSURLFollowsCacheControlWithinBounds(t *testing.T) {
	k := keys(t)
	for _, tc := range []struct {
		name          string
		maxAge, fresh time.Duration
	}{
		{"max-age used", 10 * time.Minute, 10 * time.Minute},
		{"max-age below the minimum", time.Second, DefaultJWKSMinRefresh},
		{"max-age above the maximum", 48 * time.Hour, DefaultJWKSMaxRefresh},
		{"no max-age", 0, DefaultJWKSMaxRefresh},
		{"no-store or no-cache", -1, DefaultJWKSMinRefresh},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newFakeClock()
			f := &fakeJWKS{}
			f.set(t, tc.maxAge, map[string]crypto.PublicKey{"a": &k.rsa.PublicKey})
			v := newURLVerifier(t, f, clock)
			tok := tokenFor(t, clock, k.rsa, "a")
			clock.Advance(tc.fresh - time.Second)
			if _, err := v.verify(tok); err != nil || f.count() != 1 {
				t.Fatalf("within the freshness: %v after %d fetches, want a pass on 1", err, f.count())
			}
			clock.Advance(2 * time.Second)
			if _, err := v.verify(tok); err != nil {
				t.Fatalf("when due: %v, want the keys at hand to verify", err)
			}
			waitUntil(t, "the background refresh", func() bool { return f.count() == 2 })
		})
	}
}

// When the provider is down, a token whose key is unknown is refused with 401 within
// jwks_timeout, not held; the keys fetched before keep verifying.
func TestJWKSURLDownRefusesUnknownKeys(t *testing.T) {
	k := keys(t)
	clock := newFakeClock()
	f := &fakeJWKS{}
	f.set(t, 0, map[string]crypto.PublicKey{"a": &k.rsa.PublicKey})
	v := newURLVerifier(t, f, clock)
	f.mu.Lock()
	f.hang = true
	f.mu.Unlock()
	clock.Advance(DefaultJWKSMinRefresh + time.Second)
	if _, err := v.verify(tokenFor(t, clock, k.otherRSA, "b")); !errors.Is(err, errTokenKeyUnavailable) || !errors.Is(err, ErrUnauthenticated) {
		t.Fatalf("unknown kid with the provider hanging: got %v, want errTokenKeyUnavailable", err)
	}
	// Right after, the refusal is at once: no fetch within jwks_min_refresh.
	n := f.count()
	if _, err := v.verify(tokenFor(t, clock, k.otherRSA, "b")); !errors.Is(err, errTokenKeyUnavailable) || f.count() != n {
		t.Fatalf("again: got %v after %d fetches, want the same refusal without a fetch", err, f.count()-n)
	}
	if _, err := v.verify(tokenFor(t, clock, k.rsa, "a")); err != nil {
		t.Fatalf("a token of a key fetched before: %v", err)
	}

	// A provider down at start does not stop the verifier from being built.
	down := &fakeJWKS{}
	down.fail(errors.New("connection refused"))
	v = newURLVerifier(t, down, clock)
	if _, err := v.verify(tokenFor(t, clock, k.rsa, "a")); !errors.Is(err, errTokenKeyUnavailable) {
		t.Fatalf("provider down since start: got %v, want errTokenKeyUnavailable", err)
	}
	down.set(t, 0, map[string]crypto.PublicKey{"a": &k.rsa.PublicKey})
	clock.Advance(DefaultJWKSMinRefresh + time.Second)
	if _, err := v.verify(tokenFor(t, clock, k.rsa, "a")); err != nil {
		t.Fatalf("once the provider is back: %v", err)
	}
}

func TestJWKSURLConfig(t *testing.T) {
	for _, tc := range []struct {
		c    JWTConfig
		want string
	}{
		{JWTConfig{Algorithms: []string{"RS256"}, JWKSURL: "ftp://idp/jwks"}, "jwt.jwks_url"},
		{JWTConfig{Algorithms: []string{"RS256"}, JWKSURL: "https://idp/jwks", JWKSMinRefresh: time.Hour, JWKSMaxRefresh: time.Minute}, "jwt.jwks_max_refresh"},
		{JWTConfig{Algorithms: []string{"RS256"}, JWKSURL: "https://idp/jwks", JWKSTimeout: -time.Second}, "jwt.jwks_timeout"},
	} {
		tc.c.setDefaults()
		errs := errors.Join(tc.c.validate()...)
		if errs == nil || !strings.Contains(errs.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error naming %s", tc.c, errs, tc.want)
		}
	}
	c := JWTConfig{Algorithms: []string{"RS256"}, JWKSURL: "https://idp/jwks"}
	c.setDefaults()
	if _, err := NewJWTVerifier(c, nil); err == nil {
		t.Fatal("a JWKS URL without a fetcher: got no error")
	}
}

// waitUntil polls cond for up to 5 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
