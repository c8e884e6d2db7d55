package tenants

import (
	"fmt"
	"io"
	"math/big"
	"strings"
)

// Stored API keys have the form usk_<id>_<secret>: id is the public id (13 base62 characters,
// from 9 random bytes), secret is 43 base62 characters encoding 32 random bytes. Base62 keeps
// the key one "word" for double-click selection, and neither part contains '_'.
const (
	keyPrefix    = "usk_"
	keyIDBytes   = 9
	keyIDLen     = 13
	secretBytes  = 32
	secretLen    = 43
	storedKeyLen = len(keyPrefix) + keyIDLen + 1 + secretLen
)

const base62Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// newKeyString draws a new key from rnd (crypto/rand in production).
func newKeyString(rnd io.Reader) (id, secret, key string, err error) {
	var b [keyIDBytes + secretBytes]byte
	if _, err := io.ReadFull(rnd, b[:]); err != nil {
		return "", "", "", fmt.Errorf("draw key: %w", err)
	}
	id = base62(b[:keyIDBytes], keyIDLen)
	secret = base62(b[keyIDBytes:], secretLen)
	return id, secret, keyPrefix + id + "_" + secret, nil
}

// base62 encodes b big-endian in exactly width digits (width must hold 256^len(b)).
func base62(b []byte, width int) string {
	n := new(big.Int).SetBytes(b)
	out := make([]byte, width)
	base, rem := big.NewInt(62), new(big.Int)
	for i := width - 1; i >= 0; i-- {
		n.DivMod(n, base, rem)
		out[i] = base62Alphabet[rem.Int64()]
	}
	return string(out)
}

// looksLikeStoredKey reports whether credential has the prefix of a stored key; such a credential
// is never looked up anywhere else.
func looksLikeStoredKey(credential string) bool { return strings.HasPrefix(credential, keyPrefix) }

// parseStoredKey splits a stored key into public id and secret. It does not allocate.
func parseStoredKey(credential string) (id, secret string, ok bool) {
	if len(credential) != storedKeyLen || !looksLikeStoredKey(credential) || credential[len(keyPrefix)+keyIDLen] != '_' {
		return "", "", false
	}
	id = credential[len(keyPrefix) : len(keyPrefix)+keyIDLen]
	secret = credential[len(keyPrefix)+keyIDLen+1:]
	if !isBase62(id) || !isBase62(secret) {
		return "", "", false
	}
	return id, secret, true
}

// looksLikeStoredKeyID reports whether a Principal's KeyID is a stored key's public id (not a
// config key's name, which is never 13 base62 characters of a stored tenant's key, nor a JWT's
// "jwt" or "jwt:<kid>").
func looksLikeStoredKeyID(id string) bool { return len(id) == keyIDLen && isBase62(id) }

func isBase62(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z') {
			return false
		}
	}
	return true
}
