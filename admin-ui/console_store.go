package adminui

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
)

// Server-side console sessions. With a SessionStore (Deps.Sessions: the SQL store in usher
// serve) a signed cookie is not enough: its session must also be in the store, looked up on
// every console request (one indexed read; console traffic is a few requests a minute per
// operator). Signing out, or an admin ending a session, deletes the row, so every replica
// refuses the cookie from its next request on, with no propagation delay to bound. Rotating the
// admin or viewer token changes the cookies' signing key, which ends every session at once;
// their rows, stamped with the old key's id, are pruned at the next start or sign-in, as are
// expired ones. The store holds only
// the SHA-256 of each session's secret id.
//
// The store is SQL rather than Redis because it is always there (Redis is optional for one
// replica), survives a Redis flush or restart without signing every operator out, and fails
// closed the same way on every replica when it is down.

// SessionStore keeps console sessions. *tenants.Store implements it.
type SessionStore interface {
	CreateAdminSession(ctx context.Context, s tenants.AdminSession) error
	AdminSession(ctx context.Context, idHash string) (tenants.AdminSession, error)
	AdminSessions(ctx context.Context, keyID string, now time.Time) ([]tenants.AdminSession, error)
	TouchAdminSession(ctx context.Context, idHash string, t time.Time) error
	DeleteAdminSession(ctx context.Context, idHash string) error
	PruneAdminSessions(ctx context.Context, keyID string, now time.Time) error
}

var _ SessionStore = (*tenants.Store)(nil)

// sessionTouch is how stale a session's last-seen time may get before a request writes it.
const sessionTouch = time.Minute

// errSessionStore: the session store failed; the console fails closed.
var errSessionStore = errors.New("console sessions unavailable: the session store did not answer")

// sessionIDHash is the stored name of a session: the hex SHA-256 of its secret id.
func sessionIDHash(s consoleSession) string {
	h := sha256.Sum256([]byte(s.ID))
	return hex.EncodeToString(h[:])
}

// storeSession records a new session; no-op without a store.
func (p *Plane) storeSession(r *http.Request, s consoleSession) error {
	if p.sessions == nil {
		return nil
	}
	now := p.now()
	// Each sign-in also clears the expired rows, so the table holds the open sessions only.
	if p.codec.shared {
		if err := p.sessions.PruneAdminSessions(r.Context(), p.codec.keyID, now); err != nil {
			p.log.Warn("old console sessions not pruned", "err", err)
		}
	}
	return p.sessions.CreateAdminSession(r.Context(), tenants.AdminSession{
		IDHash: sessionIDHash(s), KeyID: p.codec.keyID, Role: s.Role, Remote: p.clientAddr(r),
		UserAgent: boundedText(r.UserAgent(), 200), Created: now, Expires: s.Expires, LastSeen: now,
	})
}

// checkStoredSession reports errBadSession when the signed session s is not (or no longer) in
// the store, errSessionStore when the store fails; nil without a store.
func (p *Plane) checkStoredSession(ctx context.Context, s consoleSession) error {
	if p.sessions == nil {
		return nil
	}
	stored, err := p.sessions.AdminSession(ctx, sessionIDHash(s))
	switch {
	case errors.Is(err, tenants.ErrNotFound):
		return errBadSession
	case err != nil:
		p.log.Error("console session check failed", "err", err)
		return errSessionStore
	case stored.KeyID != p.codec.keyID || stored.Role != s.Role || !p.now().Before(stored.Expires):
		return errBadSession
	}
	if now := p.now(); now.Sub(stored.LastSeen) >= sessionTouch {
		if err := p.sessions.TouchAdminSession(ctx, stored.IDHash, now); err != nil {
			p.log.Warn("console session last-seen time not written", "err", err)
		}
	}
	return nil
}

// endSession deletes session idHash from the store; ErrNotFound (404) when it is not there.
func (p *Plane) endSession(ctx context.Context, idHash string) error {
	if p.sessions == nil {
		return errNoSessionStore
	}
	return p.sessions.DeleteAdminSession(ctx, idHash)
}

var errNoSessionStore = fmt.Errorf("console sessions are not stored: %w", tenants.ErrNotFound)

// pruneSessions deletes expired sessions and those signed with another key. Only when the key
// is shared by every replica (derived from the tokens): a per-process key would make each
// replica prune the others' sessions.
func (p *Plane) pruneSessions() {
	if p.sessions == nil || !p.codec.shared {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.sessions.PruneAdminSessions(ctx, p.codec.keyID, p.now()); err != nil {
		p.log.Warn("old console sessions not pruned", "err", err)
	}
}

func (p *Plane) listSessions(ctx context.Context) ([]tenants.AdminSession, error) {
	if p.sessions == nil {
		return []tenants.AdminSession{}, nil
	}
	return p.sessions.AdminSessions(ctx, p.codec.keyID, p.now())
}

// boundedText is s cut to at most n bytes of valid UTF-8 without NUL.
func boundedText(s string, n int) string {
	s = strings.ToValidUTF8(strings.ReplaceAll(s, "\x00", ""), "")
	for len(s) > n {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}

// The admin API's console sessions: GET /console-sessions lists them (admin and viewer),
// DELETE /console-sessions/:id ends one (admin).

func (p *Plane) listSessionsAPI(c echo.Context) error {
	list, err := p.listSessions(c.Request().Context())
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, map[string]any{"sessions": list})
}

func (p *Plane) endSessionAPI(c echo.Context) error {
	if err := p.endSessionAction(c, c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// endSessionAction ends the console session named by its id hash, on every replica.
func (p *Plane) endSessionAction(c echo.Context, idHash string) error {
	if len(idHash) != 2*sha256.Size {
		return gateway.BadRequest("id", "a console session id is 64 hex characters")
	}
	if err := p.endSession(c.Request().Context(), idHash); err != nil {
		return err
	}
	p.audit(c, "console.session.end", "console-session:"+idHash[:12])
	return nil
}

// signinsView is the Console sessions page: the open sessions, the caller's own marked.
type signinsView struct {
	Sessions []tenants.AdminSession
	Current  string
	Stored   bool
}

func (con *console) signinsPage(c echo.Context) error {
	list, err := con.p.listSessions(c.Request().Context())
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	return con.page(c, "signins", signinsView{Sessions: list, Current: sessionIDHash(sessionOf(c)), Stored: con.p.sessions != nil})
}

func (con *console) endSignin(c echo.Context) (string, string, error) {
	if err := con.p.endSessionAction(c, c.Param("id")); err != nil {
		return "", "", err
	}
	return "Session ended on every replica.", "", nil
}
