package tenants

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const testHS256Secret = "0123456789abcdef0123456789abcdef-test"

type jwtKeys struct {
	rsa      *rsa.PrivateKey
	ec       *ecdsa.PrivateKey
	ed       ed25519.PrivateKey
	otherRSA *rsa.PrivateKey
}

var (
	testKeysOnce sync.Once
	testKeys     jwtKeys
)

// keys are generated once per test binary: RSA generation is slow.
func keys(t testing.TB) jwtKeys {
	t.Helper()
	testKeysOnce.Do(func() {
		var err error
		if testKeys.rsa, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if testKeys.otherRSA, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			panic(err)
		}
		if testKeys.ec, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			panic(err)
		}
		if _, testKeys.ed, err = ed25519.GenerateKey(rand.Reader); err != nil {
			panic(err)
		}
	})
	return testKeys
}

func publicPEM(t testing.TB, pub any) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

func sign(t testing.TB, method jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(method, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// jwtFixture is a directory whose JWT config accepts every supported algorithm, with
// issuer "https://idp.example" and audience "usher".
func jwtFixture(t testing.TB) (*directoryFixture, jwtKeys) {
	t.Helper()
	k := keys(t)
	clock := newFakeClock()
	jc := JWTConfig{
		Algorithms:  []string{"HS256", "RS256", "ES256", "EdDSA"},
		HS256Secret: testHS256Secret,
		PublicKeys:  []JWTKey{{ID: "rsa1", PEM: publicPEM(t, &k.rsa.PublicKey)}, {PEM: publicPEM(t, k.ed.Public())}},
		Issuer:      "https://idp.example",
		Audience:    "usher",
	}
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	writeJWKS(t, jwks, &k.ec.PublicKey)
	jc.JWKSFile = jwks
	jc.setDefaults()
	if errs := jc.validate(); len(errs) > 0 {
		t.Fatalf("jwt config: %v", errs)
	}
	v, err := NewJWTVerifier(jc, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	f := newDirectoryFixture(t, openSQLite(t), DirectoryOptions{JWT: v})
	f.clock = clock
	f.dir.now = clock.Now
	return f, k
}

func writeJWKS(t testing.TB, path string, ec *ecdsa.PublicKey) {
	t.Helper()
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	raw, err := ec.Bytes() // 0x04 || X || Y
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]any{"keys": []map[string]string{{"kty": "EC", "crv": "P-256", "kid": "ec1", "x": b64(raw[1:33]), "y": b64(raw[33:])}}}
	b, _ := json.Marshal(set)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestJWTAuthenticate(t *testing.T) {
	f, k := jwtFixture(t)
	ctx := context.Background()
	now := f.clock.Now()
	claims := func(extra map[string]any) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "acme", "iss": "https://idp.example", "aud": "usher", "exp": now.Add(time.Hour).Unix()}
		for name, v := range extra {
			if v == nil {
				delete(c, name)
			} else {
				c[name] = v
			}
		}
		return c
	}
	accepted := []struct {
		name, token, tier, keyID string
	}{
		{"HS256", sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", claims(nil)), "pro", "jwt"},
		{"RS256 with kid", sign(t, jwt.SigningMethodRS256, k.rsa, "rsa1", claims(nil)), "pro", "jwt:rsa1"},
		{"RS256 without kid", sign(t, jwt.SigningMethodRS256, k.rsa, "", claims(nil)), "pro", "jwt"},
		{"ES256 from the JWKS file", sign(t, jwt.SigningMethodES256, k.ec, "ec1", claims(nil)), "pro", "jwt:ec1"},
		{"EdDSA", sign(t, jwt.SigningMethodEdDSA, k.ed, "", claims(nil)), "pro", "jwt"},
		{"tier claim lowers", sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", claims(map[string]any{"tier": "free"})), "free", "jwt"},
		{"tier claim equal", sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", claims(map[string]any{"tier": "pro"})), "pro", "jwt"},
		{"config tenant", sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", claims(map[string]any{"sub": "cfg"})), "pro", "jwt"},
	}
	for _, tt := range accepted {
		t.Run(tt.name, func(t *testing.T) {
			p, err := f.dir.Authenticate(ctx, tt.token)
			if err != nil {
				t.Fatalf("got %v, want accepted", err)
			}
			if p.Tier != tt.tier || p.TierSpec == nil || p.TierSpec.Name != tt.tier || p.KeyID != tt.keyID {
				t.Errorf("got %+v, want tier %q, key id %q", p, tt.tier, tt.keyID)
			}
		})
	}

	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", c) }
	none := sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "", claims(nil))
	// HS256 signed with the RSA public key as the HMAC secret: the classic key-confusion attack.
	confused := sign(t, jwt.SigningMethodHS256, []byte(publicPEM(t, &k.rsa.PublicKey)), "rsa1", claims(nil))
	valid := hs(claims(nil))
	parts := strings.Split(valid, ".")
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"cfg","exp":9999999999}`)) + "." + parts[2]
	refused := []struct {
		name, token, want string
	}{
		{"expired", hs(claims(map[string]any{"exp": now.Add(-time.Second).Unix()})), "expired token"},
		{"no exp", hs(claims(map[string]any{"exp": nil})), "token lacks a required claim"},
		{"not yet valid", hs(claims(map[string]any{"nbf": now.Add(time.Minute).Unix()})), "token not valid yet"},
		{"wrong issuer", hs(claims(map[string]any{"iss": "https://evil.example"})), "token issuer not accepted"},
		{"no issuer", hs(claims(map[string]any{"iss": nil})), "token lacks a required claim"},
		{"wrong audience", hs(claims(map[string]any{"aud": "other"})), "token audience not accepted"},
		{"alg none", none, "token algorithm not allowed"},
		{"HS256 signed with the RSA public key", confused, "bad token signature"},
		{"signed by an unknown key", sign(t, jwt.SigningMethodRS256, k.otherRSA, "", claims(nil)), "bad token signature"},
		{"kid of another key", sign(t, jwt.SigningMethodRS256, k.rsa, "ec1", claims(nil)), "bad token signature"},
		{"tampered payload", tampered, "bad token signature"},
		{"malformed", "eyJhbGciOiJIUzI1NiJ9.!!!.xyz", "malformed token"},
		{"no tenant", hs(claims(map[string]any{"sub": nil})), "token names no tenant"},
		{"unknown tenant", hs(claims(map[string]any{"sub": "nobody"})), "unknown tenant"},
		{"suspended tenant", hs(claims(map[string]any{"sub": "sus"})), "tenant suspended"},
		{"tier claim above the tenant's tier", hs(claims(map[string]any{"tier": "enterprise"})), "token tier above the tenant's tier"},
		{"unknown tier claim", hs(claims(map[string]any{"tier": "platinum"})), "token tier above the tenant's tier"},
		{"tier claim not a string", hs(claims(map[string]any{"tier": 1})), "token tier above the tenant's tier"},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			_, err := f.dir.Authenticate(ctx, tt.token)
			if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an ErrUnauthenticated containing %q", err, tt.want)
			}
			for _, part := range strings.Split(tt.token, ".") {
				if len(part) > 8 && strings.Contains(err.Error(), part) {
					t.Errorf("error %q contains part of the token", err)
				}
			}
		})
	}
}

// TestJWTRememberedTokens: a token verified once is still refused once it expires, and its
// tenant's suspension applies at once.
func TestJWTRememberedTokens(t *testing.T) {
	f, _ := jwtFixture(t)
	ctx := context.Background()
	a, err := NewAdmin(AdminConfig{}, f.store, f.dir, f.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", jwt.MapClaims{
		"sub": "acme", "iss": "https://idp.example", "aud": "usher", "exp": f.clock.Now().Add(time.Minute).Unix(),
	})
	if _, err := f.dir.Authenticate(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if err := a.SuspendTenant(ctx, Actor{Name: "admin", Admin: true}, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dir.Authenticate(ctx, tok); !errors.Is(err, errSuspendedTenant) {
		t.Errorf("suspended: got %v, want %v", err, errSuspendedTenant)
	}
	if err := a.ResumeTenant(ctx, Actor{Name: "admin", Admin: true}, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dir.Authenticate(ctx, tok); err != nil {
		t.Errorf("resumed: got %v, want accepted", err)
	}
	f.clock.Advance(time.Minute)
	if _, err := f.dir.Authenticate(ctx, tok); !errors.Is(err, errTokenExpired) {
		t.Errorf("after exp: got %v, want %v", err, errTokenExpired)
	}
}

func TestJWTConfusionWhenOnlyRS256IsAllowed(t *testing.T) {
	k := keys(t)
	pub := publicPEM(t, &k.rsa.PublicKey)
	v, err := NewJWTVerifier(JWTConfig{Algorithms: []string{"RS256"}, PublicKeys: []JWTKey{{PEM: pub}}, TenantClaim: "sub", TierClaim: "tier"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := newDirectoryFixture(t, openSQLite(t), DirectoryOptions{JWT: v})
	claims := jwt.MapClaims{"sub": "acme", "exp": time.Now().Add(time.Hour).Unix()}
	tok := sign(t, jwt.SigningMethodHS256, []byte(pub), "", claims)
	if _, err := f.dir.Authenticate(context.Background(), tok); !errors.Is(err, errTokenAlgorithm) {
		t.Errorf("got %v, want %v", err, errTokenAlgorithm)
	}
}

func TestJWTConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		jc   JWTConfig
		want string
	}{
		{"keys without algorithms", JWTConfig{HS256Secret: testHS256Secret}, "jwt.algorithms: must list"},
		{"none", JWTConfig{HS256Secret: testHS256Secret, Algorithms: []string{"HS256", "none"}}, `jwt.algorithms[1]: "none" is not one of`},
		{"short secret", JWTConfig{HS256Secret: "short", Algorithms: []string{"HS256"}}, "jwt.hs256_secret: must be at least 32 bytes"},
		{"secret without HS256", JWTConfig{HS256Secret: testHS256Secret, Algorithms: []string{"RS256"}}, "jwt.hs256_secret: set, but HS256 is not in jwt.algorithms"},
		{"pem and file", JWTConfig{Algorithms: []string{"RS256"}, PublicKeys: []JWTKey{{PEM: "x", PEMFile: "y"}}}, "jwt.public_keys[0]: set exactly one of pem and pem_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t)
			c.JWT = tt.jc
			c.SetDefaults()
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
	if _, err := NewJWTVerifier(JWTConfig{Algorithms: []string{"ES256"}, HS256Secret: testHS256Secret}, nil); err == nil || !strings.Contains(err.Error(), "ES256 is allowed but no ES256 key") {
		t.Errorf("got %v, want an error about the missing ES256 key", err)
	}
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewJWTVerifier(JWTConfig{Algorithms: []string{"RS256"}, PublicKeys: []JWTKey{{PEM: publicPEM(t, &weak.PublicKey)}}}, nil); err == nil || !strings.Contains(err.Error(), "jwt.public_keys[0]: RSA keys must have at least 2048 bits") {
		t.Errorf("got %v, want a refusal of the 1024-bit key", err)
	}
	if _, err := NewJWTVerifier(JWTConfig{Algorithms: []string{"RS256"}, PublicKeys: []JWTKey{{PEM: "not pem"}}}, nil); err == nil || !strings.Contains(err.Error(), "jwt.public_keys[0]") {
		t.Errorf("got %v, want an error naming jwt.public_keys[0]", err)
	}
}

func BenchmarkJWTAuthenticate(b *testing.B) {
	f, k := jwtFixture(b)
	claims := jwt.MapClaims{"sub": "acme", "iss": "https://idp.example", "aud": "usher", "exp": f.clock.Now().Add(time.Hour).Unix()}
	for _, tt := range []struct {
		name  string
		token string
	}{
		{"HS256", sign(b, jwt.SigningMethodHS256, []byte(testHS256Secret), "", claims)},
		{"RS256", sign(b, jwt.SigningMethodRS256, k.rsa, "rsa1", claims)},
		{"ES256", sign(b, jwt.SigningMethodES256, k.ec, "ec1", claims)},
		{"EdDSA", sign(b, jwt.SigningMethodEdDSA, k.ed, "", claims)},
	} {
		b.Run(tt.name+"/cached", func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := f.dir.Authenticate(ctx, tt.token); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tt.name+"/verified", func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				f.dir.jwt.Load().mu.Lock()
				clear(f.dir.jwt.Load().verified)
				f.dir.jwt.Load().mu.Unlock()
				if _, err := f.dir.Authenticate(ctx, tt.token); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// FuzzDirectoryAuthenticate feeds arbitrary Authorization headers through the whole credential
// path (Bearer parsing, shape dispatch, stored-key parsing, JWT parsing): no panic, every refusal
// wraps ErrUnauthenticated without echoing the credential, and only the fixture's real
// credentials are accepted.
func FuzzDirectoryAuthenticate(f *testing.F) {
	fx, _ := jwtFixture(f)
	good := sign(f, jwt.SigningMethodHS256, []byte(testHS256Secret), "", jwt.MapClaims{"sub": "acme", "iss": "https://idp.example", "aud": "usher", "exp": fx.clock.Now().Add(time.Hour).Unix()})
	accept := map[string]bool{fx.key: true, "sk-config": true, good: true}
	for _, seed := range []string{fx.key, fx.revoked, "sk-config", good, good[:len(good)-3], "usk_", "usk__", "eyJ..", "eyJhbGciOiJub25lIn0.e30.", strings.Repeat("usk_a", 20)} {
		f.Add("Bearer " + seed)
	}
	f.Fuzz(func(t *testing.T, header string) {
		cred, ok := BearerCredential(header)
		if !ok {
			return
		}
		_, err := fx.dir.Authenticate(context.Background(), cred)
		if err == nil {
			if !accept[cred] {
				t.Fatalf("credential %q accepted", cred)
			}
			return
		}
		if !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("got %v, want an error wrapping ErrUnauthenticated", err)
		}
		if len(cred) >= 6 && strings.Contains(err.Error(), cred) {
			t.Fatalf("error %q contains the credential", err)
		}
	})
}

func TestParseJWKS(t *testing.T) {
	k := keys(t)
	b64 := base64.RawURLEncoding.EncodeToString
	rsaJWK := `{"kty":"RSA","kid":"r","n":"` + b64(k.rsa.N.Bytes()) + `","e":"AQAB"}`
	edJWK := `{"kty":"OKP","crv":"Ed25519","kid":"e","x":"` + b64(k.ed.Public().(ed25519.PublicKey)) + `"}`
	got, err := parseJWKS([]byte(`{"keys":[` + rsaJWK + `,` + edJWK + `]}`))
	if err != nil || len(got) != 2 {
		t.Fatalf("got %v, %v; want two keys", got, err)
	}
	if pub, ok := got[0].key.(*rsa.PublicKey); !ok || !pub.Equal(&k.rsa.PublicKey) || got[0].id != "r" {
		t.Errorf("RSA: got %+v, want the test key with kid r", got[0])
	}
	if pub, ok := got[1].key.(ed25519.PublicKey); !ok || !pub.Equal(k.ed.Public()) || got[1].id != "e" {
		t.Errorf("Ed25519: got %+v, want the test key with kid e", got[1])
	}
	for _, bad := range []string{
		`not json`,
		`{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}`,
		`{"keys":[{"kty":"RSA","n":"!!","e":"AQAB"}]}`,
		`{"keys":[{"kty":"EC","crv":"P-256","x":"AA","y":"AA"}]}`,
		`{"keys":[{"kty":"OKP","crv":"Ed25519","x":"AA"}]}`,
	} {
		if _, err := parseJWKS([]byte(bad)); err == nil {
			t.Errorf("%s: got no error, want a refusal", bad)
		}
	}
}

// TestJWTForTenantCreatedElsewhere: a verified token naming a tenant created through another
// replica a moment ago is accepted on its first use, with no announcement and no poll.
func TestJWTForTenantCreatedElsewhere(t *testing.T) {
	f, _ := jwtFixture(t)
	ctx := context.Background()
	if _, err := f.store.CreateTenant(ctx, "elsewhere", Tenant{ID: "fresh", Name: "Fresh", Tier: "free"}); err != nil {
		t.Fatal(err)
	}
	tok := sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", jwt.MapClaims{
		"sub": "fresh", "iss": "https://idp.example", "aud": "usher", "exp": f.clock.Now().Add(time.Hour).Unix()})
	if p, err := f.dir.Authenticate(ctx, tok); err != nil || p.TenantID != "fresh" {
		t.Fatalf("got %+v, %v; want tenant fresh", p, err)
	}
}
