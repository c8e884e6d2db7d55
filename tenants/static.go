package tenants

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
)

// Static authenticates the API keys of the tenants declared in the config file. It is immutable
// after NewStatic and safe for concurrent use.
//
// Keys are found by the SHA-256 of the presented credential. Looking up by hash leaks nothing an
// attacker can use: map timing depends on the hash, which the attacker cannot steer toward a
// stored one. The matched entry is then compared in constant time.
type Static struct {
	byHash map[[sha256.Size]byte]staticKey
}

type staticKey struct {
	hash      [sha256.Size]byte
	principal Principal
}

var _ Authenticator = (*Static)(nil)

// NewStatic builds a Static over specs, which must have passed Config.Validate (after
// SetDefaults). A malformed or duplicate hash is an error naming the field.
func NewStatic(specs []TenantSpec) (*Static, error) {
	s := &Static{byHash: make(map[[sha256.Size]byte]staticKey)}
	for i, t := range specs {
		for j, k := range t.Keys {
			field := fmt.Sprintf("tenants[%d].keys[%d].sha256", i, j)
			var h [sha256.Size]byte
			if !isHexHash(k.SHA256) {
				return nil, fmt.Errorf("%s: must be 64 hex characters", field)
			}
			if _, err := hex.Decode(h[:], []byte(k.SHA256)); err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			if _, dup := s.byHash[h]; dup {
				return nil, fmt.Errorf("%s: the same key is declared twice", field)
			}
			s.byHash[h] = staticKey{hash: h, principal: Principal{
				TenantID: t.ID, TenantName: t.Name, Tier: t.Tier, KeyID: k.Name,
			}}
		}
	}
	return s, nil
}

// Authenticate returns the principal of the config key credential. Cost: one SHA-256 of the
// credential and one map lookup; it does not allocate.
func (s *Static) Authenticate(_ context.Context, credential string) (Principal, error) {
	if err := checkShape(credential); err != nil {
		return Principal{}, err
	}
	h := sum256(credential)
	k, ok := s.byHash[h]
	if !ok || subtle.ConstantTimeCompare(h[:], k.hash[:]) != 1 {
		return Principal{}, errUnknownCredential
	}
	return k.principal, nil
}
