package tenants

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Principal is who a request acts for, as established by an Authenticator.
type Principal struct {
	TenantID   string
	TenantName string
	// Tier is the name of the tier the request runs under.
	Tier string
	// TierSpec is the tier named by Tier, shared and never modified. Authenticators built by
	// NewDirectory always set it; Static alone leaves it nil.
	TierSpec *Tier
	// TenantTier is the tenant's own tier when the credential runs at a lower one (TierSpec is
	// within it); nil when it runs at the tenant's. A lowered credential is held to both: its
	// own tier's limits and its tenant's, which every credential of the tenant shares.
	TenantTier *Tier
	// KeyID names the credential that was presented, never the secret: the key's name for a
	// config key, the public id for a stored key, "jwt" (or "jwt:<kid>") for a token.
	KeyID string
	// KeyParents are the ids of the stored keys that minted the stored key presented, nearest
	// first (APIKey.Parent, then its parent...), separated by spaces (a string keeps Principal
	// comparable); empty for none. A budget set on any of them bounds this key's spending too.
	KeyParents string
	// TierCapped is true when the credential itself names its tier (a stored key minted at a
	// tier, a JWT tier claim): it never runs above that tier, whatever the tenant's becomes.
	TierCapped bool
	// Expires is when the credential stops working (a stored key's expiry, a JWT's exp); zero:
	// never.
	Expires time.Time
	// ManageKeys allows the credential to create and revoke its tenant's keys through the admin
	// service, within its own tier and expiry: a stored key created with manage_keys, a JWT
	// whose scope claim holds ScopeManageKeys.
	ManageKeys bool
}

// lowerTo makes p run at tier t, within its tenant's tier (the caller checked t.Within).
func (p *Principal) lowerTo(t *Tier) {
	if p.TenantTier == nil {
		p.TenantTier = p.TierSpec
	}
	p.Tier, p.TierSpec = t.Name, t
}

// ScopeManageKeys is the scope a JWT carries (in its space-separated scope claim) to manage its
// tenant's keys.
const ScopeManageKeys = "keys:manage"

// Authenticator turns a credential into a Principal.
type Authenticator interface {
	// Authenticate checks credential, the string after "Bearer " in the Authorization header.
	// Every failure wraps ErrUnauthenticated, and no error message contains the credential.
	// Implementations are safe for concurrent use.
	Authenticate(ctx context.Context, credential string) (Principal, error)
}

// ErrUnauthenticated is wrapped by every error that means "no valid credential" (HTTP 401).
var ErrUnauthenticated = errors.New("unauthenticated")

// Prebuilt so the refusal path does not allocate.
var (
	errMissingCredential   = fmt.Errorf("missing credential: %w", ErrUnauthenticated)
	errMalformedCredential = fmt.Errorf("malformed credential: %w", ErrUnauthenticated)
	errUnknownCredential   = fmt.Errorf("unknown credential: %w", ErrUnauthenticated)
)

// MaxCredentialLen is the longest credential accepted, in bytes. It bounds the work an
// unauthenticated caller can cause; JWTs with many claims stay well below it.
const MaxCredentialLen = 8192

// HashKey returns the lowercase hex SHA-256 of the whole key string: the form in which keys are
// stored in the config file (KeySpec.SHA256). `usher keyhash` prints it.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

// BearerCredential returns the credential of an Authorization header value of the form
// "Bearer <credential>" (the scheme is matched without regard to case, as RFC 9110 says). ok is
// false when the header is empty, names another scheme or carries no credential.
func BearerCredential(authorization string) (credential string, ok bool) {
	const scheme = "bearer "
	if len(authorization) <= len(scheme) {
		return "", false
	}
	for i := 0; i < len(scheme); i++ {
		c := authorization[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != scheme[i] {
			return "", false
		}
	}
	credential = authorization[len(scheme):]
	for len(credential) > 0 && credential[0] == ' ' {
		credential = credential[1:]
	}
	return credential, credential != ""
}

// checkShape refuses credentials no authenticator could accept: empty, longer than
// MaxCredentialLen, or containing spaces, control characters or non-ASCII bytes.
func checkShape(credential string) error {
	if credential == "" {
		return errMissingCredential
	}
	if len(credential) > MaxCredentialLen {
		return errMalformedCredential
	}
	for i := 0; i < len(credential); i++ {
		if c := credential[i]; c <= ' ' || c >= 0x7f {
			return errMalformedCredential
		}
	}
	return nil
}

// sum256 is sha256.Sum256 of s without allocating for credentials up to 1 KiB, API keys and
// usual JWTs (a conversion to []byte longer than 32 bytes would go to the heap).
func sum256(s string) [sha256.Size]byte {
	if len(s) <= 1024 {
		var b [1024]byte
		n := copy(b[:], s)
		return sha256.Sum256(b[:n])
	}
	return sha256.Sum256([]byte(s))
}
