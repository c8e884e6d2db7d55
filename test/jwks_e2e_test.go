package test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/sim"
)

// jwksServer is an identity provider's key set over real HTTP: the keys it publishes change when
// the test rotates them, and it can hang like a provider that is down behind a load balancer.
type jwksServer struct {
	srv *httptest.Server

	mu   sync.Mutex // guards keys and hang
	keys map[string]*rsa.PublicKey
	hang bool
}

func startJWKSServer(t *testing.T) *jwksServer {
	t.Helper()
	s := &jwksServer{}
	stop := make(chan struct{})
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		hang, keys := s.hang, s.keys
		s.mu.Unlock()
		if hang {
			select {
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		b64 := base64.RawURLEncoding.EncodeToString
		var set []map[string]string
		for kid, k := range keys {
			set = append(set, map[string]string{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
				"n": b64(k.N.Bytes()), "e": b64(big.NewInt(int64(k.E)).Bytes())})
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "public, max-age=3600")
		_ = json.NewEncoder(w).Encode(map[string]any{"keys": set})
	}))
	t.Cleanup(func() { close(stop); s.srv.Close() })
	return s
}

func (s *jwksServer) publish(keys map[string]*rsa.PublicKey, hang bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys, s.hang = keys, hang
}

// JWT keys from a JWKS URL through the real binary: a token of a new kid is verified once the
// provider publishes it, a withdrawn key's tokens (remembered ones too) are refused, a provider
// that hangs gets a 401 within jwt.jwks_timeout instead of a held request, and SIGHUP reloads
// the keys (here from the URL to a PEM file).
func TestJWKSURLRotationAndReload(t *testing.T) {
	var privs [4]*rsa.PrivateKey
	for i := range privs {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		privs[i] = k
	}
	token := func(k *rsa.PrivateKey, kid string) string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, jwt.MapClaims{"sub": "acme", "exp": time.Now().Add(time.Hour).Unix()})
		tok.Header["kid"] = kid
		s, err := tok.SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	idp := startJWKSServer(t)
	idp.publish(map[string]*rsa.PublicKey{"a": &privs[0].PublicKey}, false)

	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = "m", 0.01
	engine, err := sim.New(cfg, sim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	worker := httptest.NewServer(engine)
	t.Cleanup(worker.Close)
	t.Cleanup(engine.Close)

	der, err := x509.MarshalPKIXPublicKey(&privs[3].PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pemKey := strings.ReplaceAll(string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), "\n", `\n`)
	config := func(jwtSection string) func(string) string {
		return func(listen string) string {
			return fmt.Sprintf(`server: {listen: %q}
routing:
  workers:
    - {id: w1, url: %q, models: [m]}
tenants:
  - id: acme
    keys: [{name: k, sha256: %s}]
jwt:
  algorithms: [RS256]
%slog: {level: debug}
`, listen, worker.URL, tenants.HashKey("sk-acme-unused"), jwtSection)
		}
	}
	urlSection := fmt.Sprintf("  jwks_url: %q\n  jwks_min_refresh: 200ms\n  jwks_timeout: 500ms\n", idp.srv.URL)
	gw := startServe(t, "usher serve", config(urlSection))
	client := &http.Client{Timeout: 10 * time.Second}
	chat := func(tok string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, gw.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("the request was held: %v", err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	tokA := token(privs[0], "a")
	if status, body := chat(tokA); status != http.StatusOK {
		t.Fatalf("token of the published key a: %d %s", status, body)
	}

	// Rotation: the provider publishes b and withdraws a.
	idp.publish(map[string]*rsa.PublicKey{"b": &privs[1].PublicKey}, false)
	tokB := token(privs[1], "b")
	eventually(t, 10*time.Second, "a token of the new key b is accepted", func() bool {
		status, _ := chat(tokB)
		return status == http.StatusOK
	})
	if status, body := chat(tokA); status != http.StatusUnauthorized {
		t.Fatalf("the remembered token of the withdrawn key a: %d %s, want 401", status, body)
	}

	// The provider hangs: a token of an unknown key is refused, not held.
	idp.publish(map[string]*rsa.PublicKey{"b": &privs[1].PublicKey}, true)
	tokC := token(privs[2], "c")
	eventually(t, 10*time.Second, "a 401 saying the key set could not be fetched", func() bool {
		status, body := chat(tokC)
		return status == http.StatusUnauthorized && strings.Contains(body, "could not be fetched")
	})
	if status, body := chat(tokB); status != http.StatusOK {
		t.Fatalf("a token of the key fetched before, the provider hanging: %d %s", status, body)
	}

	// SIGHUP: the keys now come from a PEM in the file; the URL's keys are gone.
	gw.writeConfig(config(fmt.Sprintf("  public_keys: [{kid: d, pem: \"%s\"}]\n", pemKey))(strings.TrimPrefix(gw.url, "http://")))
	gw.signal(syscall.SIGHUP)
	tokD := token(privs[3], "d")
	eventually(t, 10*time.Second, "the reloaded PEM key verifies", func() bool {
		status, _ := chat(tokD)
		return status == http.StatusOK
	})
	if status, body := chat(tokB); status != http.StatusUnauthorized {
		t.Fatalf("a token of the URL's key after the reload: %d %s, want 401", status, body)
	}
}
