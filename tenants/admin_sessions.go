package tenants

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// AdminSession is a console session as the store keeps it: never its secret id, only that id's
// SHA-256 (IDHash, hex), which is also the public name an admin ends it by.
type AdminSession struct {
	IDHash string `json:"id"`
	// KeyID names the admin and viewer tokens the session was opened under; a session of other
	// tokens is dead.
	KeyID     string    `json:"-"`
	Role      string    `json:"role"`
	Remote    string    `json:"remote"`
	UserAgent string    `json:"user_agent"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	LastSeen  time.Time `json:"last_seen"`
}

const sessionColumns = `id_sha256, key_id, role, remote, user_agent, created_at_ms, expires_at_ms, last_seen_at_ms`

func scanSession(row interface{ Scan(...any) error }) (AdminSession, error) {
	var s AdminSession
	var created, expires, seen int64
	if err := row.Scan(&s.IDHash, &s.KeyID, &s.Role, &s.Remote, &s.UserAgent, &created, &expires, &seen); err != nil {
		return AdminSession{}, err
	}
	s.Created, s.Expires, s.LastSeen = time.UnixMilli(created), time.UnixMilli(expires), time.UnixMilli(seen)
	return s, nil
}

// CreateAdminSession stores a new console session.
func (s *Store) CreateAdminSession(ctx context.Context, a AdminSession) error {
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO console_sessions (`+sessionColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`),
		a.IDHash, a.KeyID, a.Role, a.Remote, a.UserAgent, a.Created.UnixMilli(), a.Expires.UnixMilli(), a.LastSeen.UnixMilli())
	if err != nil {
		return fmt.Errorf("store console session: %w", err)
	}
	return nil
}

// AdminSession returns the stored session of id hash idHash; ErrNotFound when there is none.
func (s *Store) AdminSession(ctx context.Context, idHash string) (AdminSession, error) {
	a, err := scanSession(s.db.QueryRowContext(ctx, s.q(`SELECT `+sessionColumns+` FROM console_sessions WHERE id_sha256 = ?`), idHash))
	if errors.Is(err, sql.ErrNoRows) {
		return AdminSession{}, fmt.Errorf("console session: %w", ErrNotFound)
	}
	if err != nil {
		return AdminSession{}, fmt.Errorf("read console session: %w", err)
	}
	return a, nil
}

// AdminSessions returns the sessions opened under keyID that have not expired at now, newest
// first.
func (s *Store) AdminSessions(ctx context.Context, keyID string, now time.Time) ([]AdminSession, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT `+sessionColumns+` FROM console_sessions WHERE key_id = ? AND expires_at_ms > ? ORDER BY created_at_ms DESC, id_sha256`),
		keyID, now.UnixMilli())
	if err != nil {
		return nil, fmt.Errorf("read console sessions: %w", err)
	}
	defer rows.Close()
	out := []AdminSession{}
	for rows.Next() {
		a, err := scanSession(rows)
		if err != nil {
			return nil, fmt.Errorf("read console sessions: %w", err)
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// TouchAdminSession records that the session was used at t.
func (s *Store) TouchAdminSession(ctx context.Context, idHash string, t time.Time) error {
	if _, err := s.db.ExecContext(ctx, s.q(`UPDATE console_sessions SET last_seen_at_ms = ? WHERE id_sha256 = ?`), t.UnixMilli(), idHash); err != nil {
		return fmt.Errorf("touch console session: %w", err)
	}
	return nil
}

// DeleteAdminSession ends a session; ErrNotFound when there is none.
func (s *Store) DeleteAdminSession(ctx context.Context, idHash string) error {
	if err := exactlyOne(s.db.ExecContext(ctx, s.q(`DELETE FROM console_sessions WHERE id_sha256 = ?`), idHash)); err != nil {
		return fmt.Errorf("end console session: %w", err)
	}
	return nil
}

// PruneAdminSessions deletes the sessions expired at now and those opened under other tokens
// than keyID (dead since a token rotation).
func (s *Store) PruneAdminSessions(ctx context.Context, keyID string, now time.Time) error {
	if _, err := s.db.ExecContext(ctx, s.q(`DELETE FROM console_sessions WHERE key_id <> ? OR expires_at_ms <= ?`), keyID, now.UnixMilli()); err != nil {
		return fmt.Errorf("prune console sessions: %w", err)
	}
	return nil
}
