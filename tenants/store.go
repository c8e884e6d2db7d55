package tenants

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver (pure Go)
)

// Store keeps tenants, API keys and the audit log in SQL: SQLite (modernc.org/sqlite, pure Go) in
// a file, or PostgreSQL. Every change writes its audit entry and bumps the revision in the same
// transaction. Safe for concurrent use; all queries are parameterised.
//
// The hot path never calls Store: a Directory holds what authentication needs in memory.
type Store struct {
	db         *sql.DB
	dialect    goose.Dialect
	migrations fs.FS
	now        func() time.Time
	rand       io.Reader
	// auditSeq orders the audit entries this process writes within one millisecond.
	auditSeq atomic.Int64
}

// Errors callers branch on (the admin API maps them to 404, 409 and 503).
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("already exists")
	// ErrStorage marks a failure of the database itself (down, read-only, full, too slow), not a
	// refusal of what was asked: a server fault, worth retrying later.
	ErrStorage = errors.New("the tenant store failed")
)

// storageFault marks err, from the database, as ErrStorage; nil, the store's own refusals
// (ErrNotFound, ErrConflict) and a cancelled caller stay as they are.
func storageFault(err error) error {
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrConflict) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStorage, err)
}

// Tenant statuses.
const (
	StatusActive    = "active"
	StatusSuspended = "suspended"
)

// Tenant is a tenant as the store and the admin API see it.
type Tenant struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Tier   string `json:"tier"`
	Status string `json:"status"` // StatusActive or StatusSuspended
	// Created is when the tenant was created; for a tenant of the config file, when the
	// configuration was loaded.
	Created time.Time `json:"created"`
	// ReadOnly marks a tenant declared in the config file; the admin API cannot change it.
	ReadOnly bool `json:"read_only"`
}

// APIKey describes a stored key. It never holds the secret.
type APIKey struct {
	ID       string    `json:"id"` // the public id, part of the key string
	TenantID string    `json:"tenant_id"`
	Name     string    `json:"name"`
	Created  time.Time `json:"created"`
	Expires  time.Time `json:"expires,omitzero"`   // zero: never
	Revoked  time.Time `json:"revoked,omitzero"`   // zero: not revoked
	LastUsed time.Time `json:"last_used,omitzero"` // zero: never used (updated in batches)
	// Tier caps the tier the key runs at: it runs at this tier, or at the tenant's when that is
	// lower. Empty: the tenant's tier, whatever it becomes.
	Tier string `json:"tier,omitempty"`
	// ManageKeys allows the key to create and revoke the tenant's keys, within its own tier and
	// expiry.
	ManageKeys bool `json:"manage_keys"`
	// Parent is the id of the stored key that minted this one; empty when the admin (or a JWT)
	// made it. A budget set on the parent bounds this key too.
	Parent string `json:"parent,omitempty"`

	secretHash string
}

// AuditEntry is one line of the audit log.
type AuditEntry struct {
	ID     string    `json:"id"`
	At     time.Time `json:"at"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"` // for example "tenant.create", "key.revoke"
	Object string    `json:"object"` // for example "tenant:acme", "key:AbC123"
	// TenantID is the tenant the object belongs to.
	TenantID string `json:"tenant_id"`
	// Details is the JSON object the change recorded (for example a new key's name and tier);
	// nil, and absent from JSON, when it recorded none.
	Details json.RawMessage `json:"details,omitempty"`
}

// Open connects to the database named by url and returns a Store; it does not migrate (call
// MigrateUp). url is `postgres://...` or `postgresql://...` for PostgreSQL (driver pgx), and
// `sqlite:PATH`, `file:PATH` or a plain file path for SQLite. migrations is the goose migration
// set, normally migrations.FS.
func Open(ctx context.Context, url string, migrations fs.FS) (*Store, error) {
	driver, dsn, dialect, err := parseDatabaseURL(url)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	if dialect == goose.DialectSQLite3 {
		// One connection: SQLite serialises writers anyway, and this rules out SQLITE_BUSY.
		db.SetMaxOpenConns(1)
	}
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open database: %w", err)
	}
	return &Store{db: db, dialect: dialect, migrations: migrations, now: time.Now, rand: rand.Reader}, nil
}

func parseDatabaseURL(url string) (driver, dsn string, dialect goose.Dialect, err error) {
	switch {
	case url == "":
		return "", "", "", errors.New("database.url: must not be empty")
	case strings.HasPrefix(url, "postgres://"), strings.HasPrefix(url, "postgresql://"):
		return "pgx", url, goose.DialectPostgres, nil
	case strings.Contains(url, "://"):
		return "", "", "", errors.New("database.url: scheme must be postgres://, sqlite: or a file path")
	}
	path := strings.TrimPrefix(strings.TrimPrefix(url, "sqlite:"), "file:")
	if path == "" {
		return "", "", "", errors.New("database.url: sqlite needs a file path")
	}
	q := "_pragma=busy_timeout(5000)&_pragma=foreign_keys(1)&_pragma=journal_mode(WAL)&_txlock=immediate"
	return "sqlite", "file:" + path + "?" + q, goose.DialectSQLite3, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) provider() (*goose.Provider, error) {
	var opts []goose.ProviderOption
	if s.dialect == goose.DialectPostgres {
		// Several gateways starting at once: one migrates, the others wait.
		locker, err := lock.NewPostgresSessionLocker()
		if err != nil {
			return nil, err
		}
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(s.dialect, s.db, s.migrations, opts...)
	if err != nil {
		return nil, fmt.Errorf("migrations: %w", err)
	}
	return p, nil
}

// MigrateUp applies every pending migration.
func (s *Store) MigrateUp(ctx context.Context) error {
	p, err := s.provider()
	if err != nil {
		return err
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate up: %w", err)
	}
	return nil
}

// MigrateStatus writes one line per migration to w: version, state (applied or pending), when
// it was applied and its file name.
func (s *Store) MigrateStatus(ctx context.Context, w io.Writer) error {
	p, err := s.provider()
	if err != nil {
		return err
	}
	st, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("migrate status: %w", err)
	}
	for _, m := range st {
		at := "-"
		if !m.AppliedAt.IsZero() {
			at = m.AppliedAt.UTC().Format(time.RFC3339)
		}
		if _, err := fmt.Fprintf(w, "%05d  %-8s  %-20s  %s\n", m.Source.Version, m.State, at, m.Source.Path); err != nil {
			return err
		}
	}
	return nil
}

// q rewrites the ? placeholders of query for the dialect.
func (s *Store) q(query string) string {
	if s.dialect != goose.DialectPostgres {
		return query
	}
	var b strings.Builder
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// change runs fn in a transaction that also bumps the revision and writes an audit entry; a
// failure of the database is ErrStorage.
func (s *Store) change(ctx context.Context, actor, action, tenantID, object string, details any, fn func(tx *sql.Tx, now time.Time) error) error {
	return storageFault(s.changeTx(ctx, actor, action, tenantID, object, details, fn))
}

func (s *Store) changeTx(ctx context.Context, actor, action, tenantID, object string, details any, fn func(tx *sql.Tx, now time.Time) error) error {
	now := s.now()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := fn(tx, now); err != nil {
		return err
	}
	if err := s.logChange(ctx, tx, tenantID, object); err != nil {
		return err
	}
	if err := s.audit(ctx, tx, now, actor, action, tenantID, object, details); err != nil {
		return err
	}
	return tx.Commit()
}

// keptChanges is how many rows of the changes log the store keeps; a replica more changes behind
// reloads everything.
const keptChanges = 10_000

// logChange bumps the revision and logs what changed under the new one (tx held). The row lock
// on revision orders concurrent changes, so revisions commit in order and without gaps.
func (s *Store) logChange(ctx context.Context, tx *sql.Tx, tenantID, object string) error {
	if _, err := tx.ExecContext(ctx, s.q(`UPDATE revision SET rev = rev + 1 WHERE id = 1`)); err != nil {
		return fmt.Errorf("bump revision: %w", err)
	}
	var rev int64
	if err := tx.QueryRowContext(ctx, `SELECT rev FROM revision WHERE id = 1`).Scan(&rev); err != nil {
		return fmt.Errorf("read revision: %w", err)
	}
	keyID, _ := strings.CutPrefix(object, "key:")
	if keyID == object {
		keyID = ""
	}
	if _, err := tx.ExecContext(ctx, s.q(`INSERT INTO changes (rev, tenant_id, key_id) VALUES (?, ?, ?)`), rev, tenantID, keyID); err != nil {
		return fmt.Errorf("log change: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM changes WHERE rev <= ?`), rev-keptChanges); err != nil {
		return fmt.Errorf("trim the changes log: %w", err)
	}
	return nil
}

// Change is one entry of the changes log: the tenant changed, or one of its keys.
type Change struct {
	Rev      int64
	TenantID string
	KeyID    string // "" for a change to the tenant itself
}

// Changes returns the logged changes with after < rev <= upTo, oldest first. Entries trimmed
// from the log are missing: callers compare the count with upTo - after.
func (s *Store) Changes(ctx context.Context, after, upTo int64) ([]Change, error) {
	rows, err := s.db.QueryContext(ctx, s.q(`SELECT rev, tenant_id, key_id FROM changes WHERE rev > ? AND rev <= ? ORDER BY rev`), after, upTo)
	if err != nil {
		return nil, storageFault(fmt.Errorf("read changes: %w", err))
	}
	defer rows.Close()
	var out []Change
	for rows.Next() {
		var c Change
		if err := rows.Scan(&c.Rev, &c.TenantID, &c.KeyID); err != nil {
			return nil, storageFault(fmt.Errorf("read changes: %w", err))
		}
		out = append(out, c)
	}
	return out, storageFault(rows.Err())
}

// Record writes an audit entry for a change made outside the store (a worker drained, a pin
// set): the audit log then tells every operator action, not only those on tenants and keys.
func (s *Store) Record(ctx context.Context, actor, action, object string, details any) error {
	return s.RecordFor(ctx, actor, action, "", object, details)
}

// RecordFor is Record of an event about an object of tenantID, which the tenant then sees in
// its audit log.
func (s *Store) RecordFor(ctx context.Context, actor, action, tenantID, object string, details any) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.audit(ctx, tx, s.now(), actor, action, tenantID, object, details); err != nil {
		return err
	}
	return tx.Commit()
}

func (s *Store) audit(ctx context.Context, tx *sql.Tx, now time.Time, actor, action, tenantID, object string, details any) error {
	d, err := json.Marshal(details)
	if err != nil {
		return fmt.Errorf("audit details: %w", err)
	}
	var r [4]byte
	if _, err := io.ReadFull(s.rand, r[:]); err != nil {
		return fmt.Errorf("audit id: %w", err)
	}
	id := fmt.Sprintf("%016x%012x%s", now.UnixMilli(), s.auditSeq.Add(1), hex.EncodeToString(r[:]))
	_, err = tx.ExecContext(ctx, s.q(`INSERT INTO audit_log (id, at_ms, actor, action, tenant_id, object, details) VALUES (?, ?, ?, ?, ?, ?, ?)`),
		id, now.UnixMilli(), actor, action, tenantID, object, string(d))
	if err != nil {
		return fmt.Errorf("write audit log: %w", err)
	}
	return nil
}

// Revision returns the number of changes ever made to tenants and keys. Cheap: one row.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	var rev int64
	if err := s.db.QueryRowContext(ctx, `SELECT rev FROM revision WHERE id = 1`).Scan(&rev); err != nil {
		return 0, storageFault(fmt.Errorf("read revision: %w", err))
	}
	return rev, nil
}

// CreateTenant stores a new tenant with status active (or t.Status when set) and audits it.
// ErrConflict when the id is taken.
func (s *Store) CreateTenant(ctx context.Context, actor string, t Tenant) (Tenant, error) {
	if t.Status == "" {
		t.Status = StatusActive
	}
	err := s.change(ctx, actor, "tenant.create", t.ID, "tenant:"+t.ID, map[string]string{"name": t.Name, "tier": t.Tier, "status": t.Status},
		func(tx *sql.Tx, now time.Time) error {
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM tenants WHERE id = ?`), t.ID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return fmt.Errorf("tenant %q: %w", t.ID, ErrConflict)
			}
			t.Created = time.UnixMilli(now.UnixMilli())
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO tenants (id, name, tier, status, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?, ?, ?)`),
				t.ID, t.Name, t.Tier, t.Status, now.UnixMilli(), now.UnixMilli())
			return err
		})
	if err != nil {
		return Tenant{}, fmt.Errorf("create tenant: %w", err)
	}
	return t, nil
}

// UpdateTenant changes the name and tier of tenant t.ID. ErrNotFound when it does not exist.
func (s *Store) UpdateTenant(ctx context.Context, actor string, t Tenant) error {
	err := s.change(ctx, actor, "tenant.update", t.ID, "tenant:"+t.ID, map[string]string{"name": t.Name, "tier": t.Tier},
		func(tx *sql.Tx, now time.Time) error {
			return exactlyOne(tx.ExecContext(ctx, s.q(`UPDATE tenants SET name = ?, tier = ?, updated_at_ms = ? WHERE id = ?`), t.Name, t.Tier, now.UnixMilli(), t.ID))
		})
	if err != nil {
		return fmt.Errorf("update tenant %q: %w", t.ID, err)
	}
	return nil
}

// SetTenantStatus suspends (StatusSuspended) or resumes (StatusActive) a tenant.
func (s *Store) SetTenantStatus(ctx context.Context, actor, id, status string) error {
	action := "tenant.resume"
	if status == StatusSuspended {
		action = "tenant.suspend"
	}
	err := s.change(ctx, actor, action, id, "tenant:"+id, nil, func(tx *sql.Tx, now time.Time) error {
		return exactlyOne(tx.ExecContext(ctx, s.q(`UPDATE tenants SET status = ?, updated_at_ms = ? WHERE id = ?`), status, now.UnixMilli(), id))
	})
	if err != nil {
		return fmt.Errorf("set status of tenant %q: %w", id, err)
	}
	return nil
}

// DeleteTenant removes a tenant and its keys. The audit log keeps their history.
func (s *Store) DeleteTenant(ctx context.Context, actor, id string) error {
	err := s.change(ctx, actor, "tenant.delete", id, "tenant:"+id, nil, func(tx *sql.Tx, _ time.Time) error {
		if _, err := tx.ExecContext(ctx, s.q(`DELETE FROM api_keys WHERE tenant_id = ?`), id); err != nil {
			return err
		}
		return exactlyOne(tx.ExecContext(ctx, s.q(`DELETE FROM tenants WHERE id = ?`), id))
	})
	if err != nil {
		return fmt.Errorf("delete tenant %q: %w", id, err)
	}
	return nil
}

func exactlyOne(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return ErrNotFound
	}
	return nil
}

const tenantColumns = `id, name, tier, status, created_at_ms`

func scanTenant(row interface{ Scan(...any) error }) (Tenant, error) {
	var t Tenant
	var created int64
	if err := row.Scan(&t.ID, &t.Name, &t.Tier, &t.Status, &created); err != nil {
		return Tenant{}, err
	}
	t.Created = time.UnixMilli(created)
	return t, nil
}

// Tenant returns one stored tenant; ErrNotFound when there is none.
func (s *Store) Tenant(ctx context.Context, id string) (Tenant, error) {
	t, err := scanTenant(s.db.QueryRowContext(ctx, s.q(`SELECT `+tenantColumns+` FROM tenants WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return Tenant{}, fmt.Errorf("tenant %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Tenant{}, storageFault(fmt.Errorf("read tenant %q: %w", id, err))
	}
	return t, nil
}

// Tenants returns every stored tenant, ordered by id.
func (s *Store) Tenants(ctx context.Context) ([]Tenant, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tenantColumns+` FROM tenants ORDER BY id`)
	if err != nil {
		return nil, storageFault(fmt.Errorf("list tenants: %w", err))
	}
	defer rows.Close()
	var out []Tenant
	for rows.Next() {
		t, err := scanTenant(rows)
		if err != nil {
			return nil, storageFault(fmt.Errorf("list tenants: %w", err))
		}
		out = append(out, t)
	}
	return out, storageFault(rows.Err())
}

// NewKey describes a key to create.
type NewKey struct {
	Name string
	// Expires zero means the key never expires.
	Expires time.Time
	// Tier caps the key's tier (APIKey.Tier); empty: the tenant's tier.
	Tier       string
	ManageKeys bool
	// Parent is the stored key minting it (APIKey.Parent); empty: none.
	Parent string
}

// CreateKey makes a new API key for tenant tenantID and returns its description and the whole
// key string, `usk_<id>_<secret>`. The key string is returned only here: the store keeps the
// SHA-256 of the secret. The store checks no scope: Admin does.
func (s *Store) CreateKey(ctx context.Context, actor, tenantID string, nk NewKey) (APIKey, string, error) {
	id, secret, key, err := newKeyString(s.rand)
	if err != nil {
		return APIKey{}, "", err
	}
	k := APIKey{ID: id, TenantID: tenantID, Name: nk.Name, Expires: nk.Expires, Tier: nk.Tier, ManageKeys: nk.ManageKeys, Parent: nk.Parent}
	details := map[string]any{"name": nk.Name, "expires": nk.Expires, "tier": nk.Tier, "manage_keys": nk.ManageKeys}
	if nk.Parent != "" {
		details["parent"] = nk.Parent
	}
	err = s.change(ctx, actor, "key.create", tenantID, "key:"+id, details,
		func(tx *sql.Tx, now time.Time) error {
			var n int
			if err := tx.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM tenants WHERE id = ?`), tenantID).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("tenant %q: %w", tenantID, ErrNotFound)
			}
			k.Created = time.UnixMilli(now.UnixMilli())
			_, err := tx.ExecContext(ctx, s.q(`INSERT INTO api_keys (id, tenant_id, name, secret_sha256, created_at_ms, expires_at_ms, tier, manage_keys, parent_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
				id, tenantID, nk.Name, HashKey(secret), now.UnixMilli(), nullMillis(nk.Expires), nk.Tier, boolInt(nk.ManageKeys), nk.Parent)
			return err
		})
	if err != nil {
		return APIKey{}, "", fmt.Errorf("create key: %w", err)
	}
	return k, key, nil
}

// RevokeKey revokes key id of tenant tenantID at once; revoking twice keeps the first time.
// ErrNotFound when the tenant has no such key.
func (s *Store) RevokeKey(ctx context.Context, actor, tenantID, id string) error {
	err := s.change(ctx, actor, "key.revoke", tenantID, "key:"+id, nil, func(tx *sql.Tx, now time.Time) error {
		return exactlyOne(tx.ExecContext(ctx, s.q(`UPDATE api_keys SET revoked_at_ms = COALESCE(revoked_at_ms, ?) WHERE id = ? AND tenant_id = ?`), now.UnixMilli(), id, tenantID))
	})
	if err != nil {
		return fmt.Errorf("revoke key %q: %w", id, err)
	}
	return nil
}

const keyColumns = `id, tenant_id, name, secret_sha256, created_at_ms, expires_at_ms, revoked_at_ms, last_used_at_ms, tier, manage_keys, parent_id`

func scanKey(row interface{ Scan(...any) error }) (APIKey, error) {
	var k APIKey
	var created, manage int64
	var expires, revoked, used sql.NullInt64
	if err := row.Scan(&k.ID, &k.TenantID, &k.Name, &k.secretHash, &created, &expires, &revoked, &used, &k.Tier, &manage, &k.Parent); err != nil {
		return APIKey{}, err
	}
	k.ManageKeys = manage != 0
	k.Created = time.UnixMilli(created)
	k.Expires, k.Revoked, k.LastUsed = fromNullMillis(expires), fromNullMillis(revoked), fromNullMillis(used)
	return k, nil
}

// Key returns one key by its public id, whatever its tenant; ErrNotFound when there is none.
func (s *Store) Key(ctx context.Context, id string) (APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, s.q(`SELECT `+keyColumns+` FROM api_keys WHERE id = ?`), id))
	if errors.Is(err, sql.ErrNoRows) {
		return APIKey{}, fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return APIKey{}, storageFault(fmt.Errorf("read key %q: %w", id, err))
	}
	return k, nil
}

// Keys returns the keys of one tenant (every tenant when tenantID is empty), newest first.
func (s *Store) Keys(ctx context.Context, tenantID string) ([]APIKey, error) {
	query, args := `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at_ms DESC, id`, []any(nil)
	if tenantID != "" {
		query, args = `SELECT `+keyColumns+` FROM api_keys WHERE tenant_id = ? ORDER BY created_at_ms DESC, id`, []any{tenantID}
	}
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, storageFault(fmt.Errorf("list keys: %w", err))
	}
	defer rows.Close()
	var out []APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, storageFault(fmt.Errorf("list keys: %w", err))
		}
		out = append(out, k)
	}
	return out, storageFault(rows.Err())
}

// TouchKeys records when keys were last used, in one transaction. It is not audited and does not
// bump the revision: it changes no authentication decision.
func (s *Store) TouchKeys(ctx context.Context, used map[string]time.Time) error {
	if len(used) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("touch keys: %w", err)
	}
	defer tx.Rollback()
	for id, at := range used {
		if _, err := tx.ExecContext(ctx, s.q(`UPDATE api_keys SET last_used_at_ms = ? WHERE id = ? AND (last_used_at_ms IS NULL OR last_used_at_ms < ?)`), at.UnixMilli(), id, at.UnixMilli()); err != nil {
			return fmt.Errorf("touch keys: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("touch keys: %w", err)
	}
	return nil
}

// AuditQuery selects audit entries, newest first. Empty fields match everything.
type AuditQuery struct {
	Actor  string
	Object string // exact, for example "tenant:acme"
	// TenantID selects the entries about one tenant and its keys.
	TenantID string
	// Before is the cursor of the next page: the NextBefore of the previous page.
	Before string
	// Limit is the page size: default 50, at most 500.
	Limit int
}

// AuditPage is one page of audit entries. NextBefore is empty on the last page.
type AuditPage struct {
	Entries    []AuditEntry `json:"entries"`
	NextBefore string       `json:"next_before,omitempty"`
}

// Audit returns one page of the audit log.
func (s *Store) Audit(ctx context.Context, aq AuditQuery) (AuditPage, error) {
	if aq.Limit <= 0 {
		aq.Limit = 50
	}
	aq.Limit = min(aq.Limit, 500)
	query := `SELECT id, at_ms, actor, action, tenant_id, object, details FROM audit_log WHERE 1 = 1`
	var args []any
	if aq.Actor != "" {
		query += ` AND actor = ?`
		args = append(args, aq.Actor)
	}
	if aq.TenantID != "" {
		query += ` AND tenant_id = ?`
		args = append(args, aq.TenantID)
	}
	if aq.Object != "" {
		query += ` AND object = ?`
		args = append(args, aq.Object)
	}
	if aq.Before != "" {
		query += ` AND id < ?`
		args = append(args, aq.Before)
	}
	query += ` ORDER BY id DESC LIMIT ?`
	args = append(args, aq.Limit+1)
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return AuditPage{}, storageFault(fmt.Errorf("query audit log: %w", err))
	}
	defer rows.Close()
	var page AuditPage
	for rows.Next() {
		var e AuditEntry
		var at int64
		var details string
		if err := rows.Scan(&e.ID, &at, &e.Actor, &e.Action, &e.TenantID, &e.Object, &details); err != nil {
			return AuditPage{}, storageFault(fmt.Errorf("query audit log: %w", err))
		}
		e.At = time.UnixMilli(at)
		if details != "" && details != "null" {
			e.Details = json.RawMessage(details)
		}
		page.Entries = append(page.Entries, e)
	}
	if err := rows.Err(); err != nil {
		return AuditPage{}, storageFault(fmt.Errorf("query audit log: %w", err))
	}
	if len(page.Entries) > aq.Limit {
		page.Entries = page.Entries[:aq.Limit]
		page.NextBefore = page.Entries[aq.Limit-1].ID
	}
	return page, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func nullMillis(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UnixMilli()
}

func fromNullMillis(v sql.NullInt64) time.Time {
	if !v.Valid {
		return time.Time{}
	}
	return time.UnixMilli(v.Int64)
}
