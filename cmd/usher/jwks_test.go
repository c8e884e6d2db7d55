package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
)

func TestCacheMaxAge(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"max-age=300", 300 * time.Second},
		{"public, max-age=60, must-revalidate", time.Minute},
		{`Max-Age="90"`, 90 * time.Second},
		{"max-age=-5", 0},
		{"max-age=nope", 0},
		{"max-age=99999999999999", 0},
		{"no-store, max-age=60", -1},
		{"max-age=60, no-cache", -1},
	} {
		if got := cacheMaxAge(tc.header); got != tc.want {
			t.Errorf("%q: got %v, want %v", tc.header, got, tc.want)
		}
	}
}

// The fetcher against a real server: the body and max-age of a 200, an error for anything
// else, a set too large or a redirect, and the context's deadline honoured.
func TestJWKSFetcher(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "max-age=120")
		w.Write([]byte(`{"keys":[]}`))
	})
	mux.HandleFunc("/gone", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	mux.HandleFunc("/huge", func(w http.ResponseWriter, _ *http.Request) { w.Write(bytes.Repeat([]byte(" "), maxJWKSBytes+1)) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/hang", func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	f := newJWKSFetcher()

	body, age, err := f.FetchJWKS(context.Background(), srv.URL+"/ok")
	if err != nil || string(body) != `{"keys":[]}` || age != 2*time.Minute {
		t.Fatalf("/ok: %q, %v, %v", body, age, err)
	}
	for _, path := range []string{"/gone", "/huge", "/moved"} {
		if _, _, err := f.FetchJWKS(context.Background(), srv.URL+path); err == nil {
			t.Errorf("%s: got no error", path)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := f.FetchJWKS(ctx, srv.URL+"/hang"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("/hang: got %v, want the context's deadline", err)
	}
}

type fakeJWTSetter struct{ set []*tenants.JWTVerifier }

func (f *fakeJWTSetter) SetJWT(v *tenants.JWTVerifier) { f.set = append(f.set, v) }

// A reload builds the JWT verifier again from the new jwt section (its files read again): a
// verifier that cannot be built leaves the running one in place.
func TestReloaderReloadsJWTKeys(t *testing.T) {
	start := Config{}
	start.Tenants.Tiers = []tenants.Tier{{Name: "pro"}}
	next := start
	next.Tenants.JWT = tenants.JWTConfig{Algorithms: []string{"HS256"}, HS256Secret: strings.Repeat("s", 32)}
	var logs bytes.Buffer
	setter := &fakeJWTSetter{}
	built := 0
	r := &reloader{running: start, pool: &fakePool{}, tiers: &fakeTiers{}, jwt: setter,
		logger: slog.New(slog.NewTextHandler(&logs, nil)),
		newJWT: func(c tenants.JWTConfig) (*tenants.JWTVerifier, error) {
			built++
			if c.HS256Secret == "" {
				return nil, errors.New("jwt.public_keys[0].pem_file: no such file")
			}
			return tenants.NewJWTVerifier(c, nil)
		}}
	r.apply(next)
	if built != 1 || len(setter.set) != 1 || setter.set[0] == nil {
		t.Fatalf("after a reload with keys: built %d, set %v", built, setter.set)
	}
	if strings.Contains(logs.String(), "sections=[tenants]") {
		t.Fatalf("the jwt section applied, yet logged as waiting for a restart:\n%s", logs.String())
	}
	r.apply(start)
	if len(setter.set) != 1 || !strings.Contains(logs.String(), "the JWT keys stay as they were") {
		t.Fatalf("a verifier that cannot be built: set %d times; log:\n%s", len(setter.set), logs.String())
	}
}
