package tenants

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// JWTConfig configures verification of JWTs presented as bearer credentials (`jwt:` in the file).
// JWTs are accepted only when at least one verification key is configured.
type JWTConfig struct {
	// Algorithms is the allow-list, for example [RS256]; required when keys are configured.
	// Supported: HS256, RS256, ES256, EdDSA. `none` is never accepted.
	Algorithms []string `yaml:"algorithms"`
	// HS256Secret is the shared secret for HS256 (at least 32 bytes).
	HS256Secret string `yaml:"hs256_secret"`
	// PublicKeys are RSA, ECDSA P-256 or Ed25519 public keys in PEM.
	PublicKeys []JWTKey `yaml:"public_keys"`
	// JWKSFile is a JSON Web Key Set file with more public keys.
	JWKSFile string `yaml:"jwks_file"`
	// JWKSURL is the identity provider's JSON Web Key Set, fetched over HTTP(S) and cached:
	// its keys rotate by `kid` without a restart (see jwks.go for the rules).
	JWKSURL string `yaml:"jwks_url"`
	// JWKSMinRefresh is the shortest time between two fetches of JWKSURL, whatever its
	// Cache-Control says or however many tokens with unknown key ids arrive. Default 30s.
	JWKSMinRefresh time.Duration `yaml:"jwks_min_refresh"`
	// JWKSMaxRefresh is the longest time a fetched set is used before it is fetched again.
	// Default 1h.
	JWKSMaxRefresh time.Duration `yaml:"jwks_max_refresh"`
	// JWKSTimeout bounds one fetch of JWKSURL, and so the wait of a token whose key is not at
	// hand. Default 5s.
	JWKSTimeout time.Duration `yaml:"jwks_timeout"`
	// Issuer and Audience, when set, must match the iss and aud claims.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// TenantClaim names the claim holding the tenant id; default "sub".
	TenantClaim string `yaml:"tenant_claim"`
	// TierClaim names the optional claim that lowers the tier; default "tier".
	TierClaim string `yaml:"tier_claim"`
	// ScopeClaim names the optional claim of space-separated scopes (or a list of them); the
	// scope "keys:manage" (ScopeManageKeys) lets the token manage its tenant's keys. Default
	// "scope".
	ScopeClaim string `yaml:"scope_claim"`
	// Leeway is the clock skew allowed on exp and nbf; default 0.
	Leeway time.Duration `yaml:"leeway"`
}

// JWTKey is one PEM public key, inline or in a file, optionally bound to a key id (kid header).
type JWTKey struct {
	ID      string `yaml:"kid"`
	PEM     string `yaml:"pem"`
	PEMFile string `yaml:"pem_file"`
}

var jwtAlgorithms = map[string]bool{"HS256": true, "RS256": true, "ES256": true, "EdDSA": true}

// Enabled reports whether any verification key is configured.
func (c JWTConfig) Enabled() bool {
	return c.HS256Secret != "" || len(c.PublicKeys) > 0 || c.JWKSFile != "" || c.JWKSURL != ""
}

func (c *JWTConfig) setDefaults() {
	if c.TenantClaim == "" {
		c.TenantClaim = "sub"
	}
	if c.TierClaim == "" {
		c.TierClaim = "tier"
	}
	if c.ScopeClaim == "" {
		c.ScopeClaim = "scope"
	}
	if c.JWKSMinRefresh == 0 {
		c.JWKSMinRefresh = DefaultJWKSMinRefresh
	}
	if c.JWKSMaxRefresh == 0 {
		c.JWKSMaxRefresh = DefaultJWKSMaxRefresh
	}
	if c.JWKSTimeout == 0 {
		c.JWKSTimeout = DefaultJWKSTimeout
	}
}

func (c JWTConfig) validate() []error {
	var errs []error
	if !c.Enabled() {
		return nil
	}
	if len(c.Algorithms) == 0 {
		errs = append(errs, errors.New("jwt.algorithms: must list the accepted algorithms when keys are configured"))
	}
	for i, a := range c.Algorithms {
		if !jwtAlgorithms[a] {
			errs = append(errs, fmt.Errorf("jwt.algorithms[%d]: %q is not one of HS256, RS256, ES256, EdDSA", i, a))
		}
	}
	if c.HS256Secret != "" && len(c.HS256Secret) < 32 {
		errs = append(errs, errors.New("jwt.hs256_secret: must be at least 32 bytes"))
	}
	if c.HS256Secret != "" && !slices.Contains(c.Algorithms, "HS256") {
		errs = append(errs, errors.New("jwt.hs256_secret: set, but HS256 is not in jwt.algorithms"))
	}
	if c.Leeway < 0 {
		errs = append(errs, errors.New("jwt.leeway: must not be negative"))
	}
	if c.JWKSURL != "" {
		u, err := url.Parse(c.JWKSURL)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			errs = append(errs, fmt.Errorf("jwt.jwks_url: must be an absolute http(s) URL, got %q", c.JWKSURL))
		}
		if c.JWKSMinRefresh <= 0 {
			errs = append(errs, errors.New("jwt.jwks_min_refresh: must be positive"))
		}
		if c.JWKSMaxRefresh < c.JWKSMinRefresh {
			errs = append(errs, errors.New("jwt.jwks_max_refresh: must be at least jwt.jwks_min_refresh"))
		}
		if c.JWKSTimeout <= 0 {
			errs = append(errs, errors.New("jwt.jwks_timeout: must be positive"))
		}
	}
	for i, k := range c.PublicKeys {
		if (k.PEM == "") == (k.PEMFile == "") {
			errs = append(errs, fmt.Errorf("jwt.public_keys[%d]: set exactly one of pem and pem_file", i))
		}
	}
	return errs
}

// JWTVerifier verifies JWTs against the configured keys. A verified token is remembered until it
// expires, so presenting it again costs a hash and a map lookup instead of a signature check.
// Safe for concurrent use.
type JWTVerifier struct {
	parser      *jwt.Parser
	algorithms  []string
	now         func() time.Time
	leeway      time.Duration
	mu          sync.RWMutex // guards verified
	verified    map[[sha256.Size]byte]verifiedToken
	tenantClaim string
	tierClaim   string
	scopeClaim  string
	// keys by algorithm, from the file (PEM, JWKS file, HS256 secret); a key only ever verifies
	// the algorithm of its own type, so a token signed with HS256 using a public key as secret
	// finds no key.
	keys map[string][]verificationKey
	// remote is the key set of jwt.jwks_url; nil without one.
	remote *jwksSource
}

type verificationKey struct {
	id  string
	key crypto.PublicKey // []byte for HS256
}

// JWTOptions are the dependencies of a JWTVerifier; the zero value is usable without a JWKS URL.
type JWTOptions struct {
	// Now is the clock; nil: time.Now.
	Now func() time.Time
	// Fetcher fetches jwt.jwks_url; required when it is set.
	Fetcher JWKSFetcher
	// Logger receives the key set's fetch failures; nil: discard.
	Logger *slog.Logger
}

// NewJWTVerifier is NewJWTVerifierWith for a configuration without a JWKS URL.
func NewJWTVerifier(c JWTConfig, now func() time.Time) (*JWTVerifier, error) {
	return NewJWTVerifierWith(c, JWTOptions{Now: now})
}

// NewJWTVerifierWith loads the keys of c (after SetDefaults and Validate): it reads the PEM and
// JWKS files, and fetches jwt.jwks_url once, waiting at most jwt.jwks_timeout. A JWKS URL that
// cannot be fetched does not fail it (API keys still work, and the set is fetched again when a
// token needs it); it returns nil, nil when c configures no key. Calling it again with the same
// configuration is how the keys are reloaded (SIGHUP).
func NewJWTVerifierWith(c JWTConfig, o JWTOptions) (*JWTVerifier, error) {
	if !c.Enabled() {
		return nil, nil
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	v := &JWTVerifier{
		tenantClaim: c.TenantClaim, tierClaim: c.TierClaim, scopeClaim: c.ScopeClaim, keys: map[string][]verificationKey{},
		now: o.Now, leeway: c.Leeway, verified: map[[sha256.Size]byte]verifiedToken{},
	}
	add := func(id string, key crypto.PublicKey, field string) error {
		alg, err := keyAlgorithm(key)
		if err != nil {
			return fmt.Errorf("%s: %w", field, err)
		}
		v.keys[alg] = append(v.keys[alg], verificationKey{id: id, key: key})
		return nil
	}
	if c.HS256Secret != "" {
		v.keys["HS256"] = []verificationKey{{key: []byte(c.HS256Secret)}}
	}
	for i, k := range c.PublicKeys {
		field := fmt.Sprintf("jwt.public_keys[%d]", i)
		pem := []byte(k.PEM)
		if k.PEMFile != "" {
			b, err := os.ReadFile(k.PEMFile)
			if err != nil {
				return nil, fmt.Errorf("%s.pem_file: %w", field, err)
			}
			pem = b
		}
		key, err := parsePublicKeyPEM(pem)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if err := add(k.ID, key, field); err != nil {
			return nil, err
		}
	}
	if c.JWKSFile != "" {
		b, err := os.ReadFile(c.JWKSFile)
		if err != nil {
			return nil, fmt.Errorf("jwt.jwks_file: %w", err)
		}
		keys, err := parseJWKS(b)
		if err != nil {
			return nil, fmt.Errorf("jwt.jwks_file: %w", err)
		}
		for i, k := range keys {
			if err := add(k.id, k.key, fmt.Sprintf("jwt.jwks_file: keys[%d]", i)); err != nil {
				return nil, err
			}
		}
	}
	var algs []string
	for _, a := range c.Algorithms {
		if a == "none" || !jwtAlgorithms[a] {
			return nil, fmt.Errorf("jwt.algorithms: %q is not accepted", a)
		}
		if len(v.keys[a]) == 0 && c.JWKSURL == "" {
			return nil, fmt.Errorf("jwt.algorithms: %s is allowed but no %s key is configured", a, a)
		}
		algs = append(algs, a)
	}
	for a := range v.keys {
		if !slices.Contains(algs, a) {
			delete(v.keys, a)
		}
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(algs), jwt.WithExpirationRequired(), jwt.WithTimeFunc(o.Now), jwt.WithLeeway(c.Leeway)}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	v.algorithms = algs
	if c.JWKSURL != "" {
		if o.Fetcher == nil {
			return nil, errors.New("jwt.jwks_url: set, but no fetcher was given")
		}
		v.remote = &jwksSource{url: c.JWKSURL, fetcher: o.Fetcher, now: o.Now, log: o.Logger,
			minRefresh: c.JWKSMinRefresh, maxRefresh: c.JWKSMaxRefresh, timeout: c.JWKSTimeout,
			allowed: func(alg string) bool { return slices.Contains(algs, alg) }, changed: v.forget}
		<-v.remote.start(false)
	}
	return v, nil
}

// keyAlgorithm is the one algorithm a public key verifies.
func keyAlgorithm(key crypto.PublicKey) (string, error) {
	switch k := key.(type) {
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return "", errors.New("RSA keys must have at least 2048 bits")
		}
		return "RS256", nil
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() {
			return "", errors.New("only P-256 ECDSA keys (ES256) are supported")
		}
		return "ES256", nil
	case ed25519.PublicKey:
		return "EdDSA", nil
	}
	return "", fmt.Errorf("unsupported key type %T", key)
}

// forget drops the verified tokens, so each is verified again with the keys now at hand.
func (v *JWTVerifier) forget() {
	v.mu.Lock()
	defer v.mu.Unlock()
	clear(v.verified)
}

func parsePublicKeyPEM(pem []byte) (crypto.PublicKey, error) {
	if k, err := jwt.ParseRSAPublicKeyFromPEM(pem); err == nil {
		return k, nil
	}
	if k, err := jwt.ParseECPublicKeyFromPEM(pem); err == nil {
		return k, nil
	}
	if k, err := jwt.ParseEdPublicKeyFromPEM(pem); err == nil {
		return k, nil
	}
	return nil, errors.New("not an RSA, ECDSA or Ed25519 public key in PEM")
}

// parseJWKS reads the public keys of a JSON Web Key Set (RFC 7517): RSA, EC P-256, OKP Ed25519.
// Any other key is an error.
func parseJWKS(b []byte) ([]verificationKey, error) { return readJWKS(b, false) }

// readJWKS is parseJWKS; lenient skips the keys it cannot use instead (an identity provider's
// set may hold encryption keys or curves usher does not verify).
func readJWKS(b []byte, lenient bool) ([]verificationKey, error) {
	var set struct {
		Keys []struct {
			Kty string `json:"kty"`
			Kid string `json:"kid"`
			Crv string `json:"crv"`
			N   string `json:"n"`
			E   string `json:"e"`
			X   string `json:"x"`
			Y   string `json:"y"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, err
	}
	dec := base64.RawURLEncoding
	var out []verificationKey
	for i, k := range set.Keys {
		field := fmt.Sprintf("keys[%d]", i)
		switch {
		case k.Kty == "RSA":
			n, err1 := dec.DecodeString(k.N)
			e, err2 := dec.DecodeString(k.E)
			if err1 != nil || err2 != nil || len(e) == 0 || len(e) > 4 {
				if lenient {
					continue
				}
				return nil, fmt.Errorf("%s: malformed RSA key", field)
			}
			out = append(out, verificationKey{id: k.Kid, key: &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}})
		case k.Kty == "EC" && k.Crv == "P-256":
			x, err1 := dec.DecodeString(k.X)
			y, err2 := dec.DecodeString(k.Y)
			if err1 != nil || err2 != nil || len(x) != 32 || len(y) != 32 {
				if lenient {
					continue
				}
				return nil, fmt.Errorf("%s: malformed P-256 key", field)
			}
			pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), append(append([]byte{4}, x...), y...))
			if err != nil {
				if lenient {
					continue
				}
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			out = append(out, verificationKey{id: k.Kid, key: pub})
		case k.Kty == "OKP" && k.Crv == "Ed25519":
			x, err := dec.DecodeString(k.X)
			if err != nil || len(x) != ed25519.PublicKeySize {
				if lenient {
					continue
				}
				return nil, fmt.Errorf("%s: malformed Ed25519 key", field)
			}
			out = append(out, verificationKey{id: k.Kid, key: ed25519.PublicKey(x)})
		default:
			if lenient {
				continue
			}
			return nil, fmt.Errorf("%s: unsupported key type %q %q", field, k.Kty, k.Crv)
		}
	}
	return out, nil
}

// looksLikeJWT reports whether credential has the shape of a compact JWS: three segments, the
// first a base64url JSON object.
func looksLikeJWT(credential string) bool {
	return strings.HasPrefix(credential, "eyJ") && strings.Count(credential, ".") == 2
}

// JWT refusals. They name the reason, never the token or its claims.
var (
	errTokenMalformed = fmt.Errorf("malformed token: %w", ErrUnauthenticated)
	errTokenAlgorithm = fmt.Errorf("token algorithm not allowed: %w", ErrUnauthenticated)
	errTokenSignature = fmt.Errorf("bad token signature: %w", ErrUnauthenticated)
	errTokenExpired   = fmt.Errorf("expired token: %w", ErrUnauthenticated)
	errTokenNotYet    = fmt.Errorf("token not valid yet: %w", ErrUnauthenticated)
	errTokenClaimGone = fmt.Errorf("token lacks a required claim (exp; iss and aud when configured): %w", ErrUnauthenticated)
	errTokenIssuer    = fmt.Errorf("token issuer not accepted: %w", ErrUnauthenticated)
	errTokenAudience  = fmt.Errorf("token audience not accepted: %w", ErrUnauthenticated)
	errTokenInvalid   = fmt.Errorf("invalid token: %w", ErrUnauthenticated)
	errTokenNoTenant  = fmt.Errorf("token names no tenant: %w", ErrUnauthenticated)
	errTokenTier      = fmt.Errorf("token tier above the tenant's tier: %w", ErrUnauthenticated)
)

// keyfunc finds the keys that may have signed t: those of its algorithm whose id matches its
// kid (all of them when either has none), from the file and from the JWKS URL. When the URL's
// set has none, it is fetched again (rate-limited; see jwks.go) and searched once more.
func (v *JWTVerifier) keyfunc(t *jwt.Token) (any, error) {
	alg := t.Method.Alg()
	kid, _ := t.Header["kid"].(string)
	set := jwt.VerificationKeySet{}
	collect := func() {
		for _, keys := range [][]verificationKey{v.keys[alg], v.remoteKeys(alg)} {
			for _, k := range keys {
				if kid == "" || k.id == "" || k.id == kid {
					set.Keys = append(set.Keys, k.key)
				}
			}
		}
	}
	collect()
	if len(set.Keys) == 0 && v.remote != nil {
		if err := v.remote.refreshForUnknownKey(); err != nil {
			return nil, err
		}
		collect()
	}
	if len(set.Keys) == 0 {
		return nil, errTokenSignature
	}
	return set, nil
}

func (v *JWTVerifier) remoteKeys(alg string) []verificationKey {
	if v.remote == nil {
		return nil
	}
	return v.remote.forAlgorithm(alg)
}

// verifiedToken is what a verified token says, kept so the same token presented again skips the
// signature check. Tenant status and tier are resolved again on every use.
type verifiedToken struct {
	tenantID string
	tier     string // the tier claim; hasTier false when absent
	hasTier  bool
	keyID    string
	exp      time.Time
	until    time.Time // exp plus leeway
	// manageKeys: the scope claim holds ScopeManageKeys.
	manageKeys bool
}

// maxVerifiedTokens bounds the cache; when full it is emptied (an attacker can only make
// verifications slower, never wrong).
const maxVerifiedTokens = 10_000

// authenticate verifies token and resolves its tenant and tier through d.
func (v *JWTVerifier) authenticate(ctx context.Context, token string, d *Directory) (Principal, error) {
	h := sum256(token)
	v.mu.RLock()
	vt, hit := v.verified[h]
	v.mu.RUnlock()
	if hit && v.remote != nil {
		v.remote.refreshIfDue()
	}
	if !hit || !v.now().Before(vt.until) {
		var err error
		if vt, err = v.verify(token); err != nil {
			return Principal{}, err
		}
		v.mu.Lock()
		if len(v.verified) >= maxVerifiedTokens {
			clear(v.verified)
		}
		v.verified[h] = vt
		v.mu.Unlock()
	}
	t, ok := d.Tenant(vt.tenantID)
	if !ok && d.lookUpMiss(ctx, "tenant:"+vt.tenantID, func(s *snapshot) bool { _, ok := s.tenants[vt.tenantID]; return ok }) {
		t, ok = d.Tenant(vt.tenantID)
	}
	if !ok {
		return Principal{}, errUnknownTenant
	}
	p, err := d.principal(t)
	if err != nil {
		return Principal{}, err
	}
	if vt.hasTier {
		spec, known := d.Tier(vt.tier)
		if !known || !spec.Within(p.TierSpec) {
			return Principal{}, errTokenTier
		}
		p.TierCapped = true
		if spec != p.TierSpec {
			p.lowerTo(spec)
		}
	}
	p.KeyID, p.Expires, p.ManageKeys = vt.keyID, vt.exp, vt.manageKeys
	return p, nil
}

// verify checks the token's signature and claims.
func (v *JWTVerifier) verify(token string) (verifiedToken, error) {
	claims := jwt.MapClaims{}
	parsed, err := v.parser.ParseWithClaims(token, claims, v.keyfunc)
	if err != nil || !parsed.Valid {
		if parsed != nil {
			if alg, _ := parsed.Header["alg"].(string); !slices.Contains(v.algorithms, alg) {
				return verifiedToken{}, errTokenAlgorithm
			}
		}
		return verifiedToken{}, jwtRefusal(err)
	}
	exp, err := claims.GetExpirationTime()
	if err != nil || exp == nil {
		return verifiedToken{}, errTokenClaimGone
	}
	vt := verifiedToken{keyID: "jwt", exp: exp.Time, until: exp.Add(v.leeway), manageKeys: hasScope(claims[v.scopeClaim], ScopeManageKeys)}
	vt.tenantID, _ = claims[v.tenantClaim].(string)
	if vt.tenantID == "" {
		return verifiedToken{}, errTokenNoTenant
	}
	var raw any
	if raw, vt.hasTier = claims[v.tierClaim]; vt.hasTier {
		vt.tier, _ = raw.(string)
	}
	if kid, _ := parsed.Header["kid"].(string); kid != "" && idPattern.MatchString(kid) {
		vt.keyID = "jwt:" + kid
	}
	return vt, nil
}

// hasScope reports whether claim, a space-separated string or a list of strings, holds scope.
func hasScope(claim any, scope string) bool {
	switch c := claim.(type) {
	case string:
		return slices.Contains(strings.Fields(c), scope)
	case []any:
		return slices.Contains(c, any(scope))
	}
	return false
}

func jwtRefusal(err error) error {
	switch {
	case errors.Is(err, errTokenSignature):
		return errTokenSignature
	case errors.Is(err, errTokenKeyUnavailable):
		return errTokenKeyUnavailable
	case errors.Is(err, jwt.ErrTokenMalformed):
		return errTokenMalformed
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return errTokenSignature
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return errTokenAlgorithm
	case errors.Is(err, jwt.ErrTokenExpired):
		return errTokenExpired
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return errTokenNotYet
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return errTokenClaimGone
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return errTokenIssuer
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return errTokenAudience
	default:
		return errTokenInvalid
	}
}
