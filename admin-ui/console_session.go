package adminui

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/usherllm/usher/tenants"
)

// Console sessions are HMAC-signed cookies, backed by a server-side table when the plane has a
// SessionStore (console_store.go): the cookie carries the role, the expiry and a random session
// id, signed with HMAC-SHA256. The key comes
// from the Authenticator when it offers one (SessionKeyer; *tenants.Admin derives it from
// the configured admin and viewer token hashes), so every replica with the same tokens accepts
// the same sessions, a restart keeps them, and rotating a token ends them all. Without a
// SessionKeyer the key is random per process: sessions then hold on one replica until it
// restarts. Without a SessionStore, signing out only clears the cookie in the browser and a copied
// cookie stays valid until its expiry, which is why sessions are short (sessionLifetime).

// SessionKeyer is implemented by an Authenticator that provides the secret console sessions
// are signed with. *tenants.Admin implements it.
type SessionKeyer interface {
	// SessionKey returns at least 32 secret bytes shared by every replica, or nil for none.
	SessionKey() []byte
}

var _ SessionKeyer = (*tenants.Admin)(nil)

const (
	sessionCookie   = "usher_console"
	signinCookie    = "usher_console_signin"
	flashCookie     = "usher_console_flash"
	refusalCookie   = "usher_console_refusal"
	consolePath     = "/admin/"
	sessionLifetime = 8 * time.Hour
	signinLifetime  = 15 * time.Minute
	csrfField       = "csrf"
)

// Console roles.
const (
	roleAdmin  = "admin"
	roleViewer = "viewer"
)

var errBadSession = errors.New("console session: invalid or expired")

// consoleSession is a signed-in operator.
type consoleSession struct {
	Role    string
	Expires time.Time
	ID      string // random; the CSRF token is derived from it
}

// actor is who the session acts as in the admin service and the audit log.
func (s consoleSession) actor() tenants.Actor {
	if s.Role == roleAdmin {
		return tenants.Actor{Name: "admin", Admin: true}
	}
	return tenants.Actor{Name: "viewer", Viewer: true}
}

// sessionCodec signs and checks session cookies and CSRF tokens. Safe for concurrent use; the
// zero value is not usable.
type sessionCodec struct {
	key []byte
	now func() time.Time
	// keyID names key in the session store without revealing it; shared says every replica
	// derives the same key (from the tokens).
	keyID  string
	shared bool
}

func newSessionCodec(auth Authenticator, now func() time.Time) sessionCodec {
	var key []byte
	if k, ok := auth.(SessionKeyer); ok {
		key = k.SessionKey()
	}
	shared := len(key) >= 32
	if !shared {
		key = make([]byte, 32)
		_, _ = rand.Read(key)
	}
	c := sessionCodec{key: key, now: now, shared: shared}
	c.keyID = hex.EncodeToString(c.mac("key id")[:8])
	return c
}

func (c sessionCodec) mac(parts ...string) []byte {
	m := hmac.New(sha256.New, c.key)
	for _, p := range parts {
		m.Write([]byte(p))
		m.Write([]byte{0})
	}
	return m.Sum(nil)
}

var b64 = base64.RawURLEncoding

// issue returns a new session of role and its cookie value.
func (c sessionCodec) issue(role string) (consoleSession, string) {
	s := consoleSession{Role: role, Expires: c.now().Add(sessionLifetime).Truncate(time.Second), ID: rand.Text()}
	payload := role + "|" + strconv.FormatInt(s.Expires.Unix(), 10) + "|" + s.ID
	return s, b64.EncodeToString([]byte(payload)) + "." + b64.EncodeToString(c.mac("session", payload))
}

// parse checks a cookie value's signature (constant time) and expiry.
func (c sessionCodec) parse(value string) (consoleSession, error) {
	enc, sig, ok := strings.Cut(value, ".")
	if !ok {
		return consoleSession{}, errBadSession
	}
	payload, err1 := b64.DecodeString(enc)
	mac, err2 := b64.DecodeString(sig)
	if err1 != nil || err2 != nil || !hmac.Equal(mac, c.mac("session", string(payload))) {
		return consoleSession{}, errBadSession
	}
	fields := strings.Split(string(payload), "|")
	if len(fields) != 3 || fields[0] != roleAdmin && fields[0] != roleViewer || fields[2] == "" {
		return consoleSession{}, errBadSession
	}
	exp, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil || !c.now().Before(time.Unix(exp, 0)) {
		return consoleSession{}, errBadSession
	}
	return consoleSession{Role: fields[0], Expires: time.Unix(exp, 0), ID: fields[2]}, nil
}

// csrf is the CSRF token of a session: forms carry it, and every POST must present it.
func (c sessionCodec) csrf(s consoleSession) string { return b64.EncodeToString(c.mac("csrf", s.ID)) }

// checkCSRF compares token with the session's in constant time.
func (c sessionCodec) checkCSRF(s consoleSession, token string) bool {
	got, err := b64.DecodeString(token)
	return err == nil && hmac.Equal(got, c.mac("csrf", s.ID))
}

// signinCSRF is the token of the sign-in form, tied to the nonce of the sign-in cookie, so a
// foreign page cannot sign a browser in to a session of its choosing.
func (c sessionCodec) signinCSRF(nonce string) string {
	return b64.EncodeToString(c.mac("signin", nonce))
}

func (c sessionCodec) checkSigninCSRF(nonce, token string) bool {
	got, err := b64.DecodeString(token)
	return nonce != "" && err == nil && hmac.Equal(got, c.mac("signin", nonce))
}

// secureRequest reports whether the browser reached us over TLS, directly or through a proxy
// that says so; the console's cookies are Secure then.
func secureRequest(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// consoleCookie is a console cookie: HttpOnly, SameSite=Strict, scoped to the console, Secure
// over TLS. maxAge < 0 deletes it.
func consoleCookie(r *http.Request, name, value string, maxAge time.Duration) *http.Cookie {
	ck := &http.Cookie{Name: name, Value: value, Path: consolePath, HttpOnly: true,
		Secure: secureRequest(r), SameSite: http.SameSiteStrictMode}
	if maxAge < 0 {
		ck.MaxAge = -1
		ck.Expires = time.Unix(1, 0)
	} else {
		ck.MaxAge = int(maxAge.Seconds())
	}
	return ck
}
