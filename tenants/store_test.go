package tenants

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"io/fs"

	"github.com/usherllm/usher/test/pgtest"
)

// openSQLite returns a migrated store in a fresh SQLite file.
func openSQLite(t testing.TB) *Store {
	t.Helper()
	s, err := Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "usher.db"), migrationsFS)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.MigrateUp(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

// openPostgres returns a migrated store in a fresh schema of the PostgreSQL at
// USHER_TEST_POSTGRES_DSN; the schema is dropped when the test ends.
func openPostgres(t testing.TB) *Store {
	t.Helper()
	s, err := Open(context.Background(), pgtest.URL(t), migrationsFS)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.MigrateUp(context.Background()); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return s
}

var dialects = []struct {
	name string
	open func(testing.TB) *Store
}{
	{"sqlite", openSQLite},
	{"postgres", openPostgres},
}

func TestParseDatabaseURL(t *testing.T) {
	tests := []struct {
		url, driver, dsnPrefix, err string
	}{
		{"postgres://u@h/db", "pgx", "postgres://u@h/db", ""},
		{"postgresql://u@h/db", "pgx", "postgresql://u@h/db", ""},
		{"sqlite:/var/lib/usher.db", "sqlite", "file:/var/lib/usher.db?", ""},
		{"file:usher.db", "sqlite", "file:usher.db?", ""},
		{"usher.db", "sqlite", "file:usher.db?", ""},
		{"", "", "", "database.url: must not be empty"},
		{"mysql://x", "", "", "database.url: scheme must be"},
		{"sqlite:", "", "", "database.url: sqlite needs a file path"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			driver, dsn, _, err := parseDatabaseURL(tt.url)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil || driver != tt.driver || !strings.HasPrefix(dsn, tt.dsnPrefix) {
				t.Errorf("got (%q, %q, %v), want (%q, %q...)", driver, dsn, err, tt.driver, tt.dsnPrefix)
			}
		})
	}
}

func TestStore(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Run("migrate status", func(t *testing.T) { testMigrateStatus(t, d.open(t)) })
			t.Run("tenants", func(t *testing.T) { testStoreTenants(t, d.open(t)) })
			t.Run("keys", func(t *testing.T) { testStoreKeys(t, d.open(t)) })
			t.Run("metacharacters", func(t *testing.T) { testStoreMetacharacters(t, d.open(t)) })
			t.Run("audit paging", func(t *testing.T) { testStoreAuditPaging(t, d.open(t)) })
		})
	}
}

func testMigrateStatus(t *testing.T, s *Store) {
	ctx := context.Background()
	var buf bytes.Buffer
	if err := s.MigrateStatus(ctx, &buf); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); !strings.Contains(got, "00001") || !strings.Contains(got, "applied") || !strings.Contains(got, "00001_tenants.sql") {
		t.Errorf("got %q, want migration 00001 applied", got)
	}
	if err := s.MigrateUp(ctx); err != nil {
		t.Errorf("second migrate up: got %v, want nothing to do", err)
	}
}

func testStoreTenants(t *testing.T, s *Store) {
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	s.now = func() time.Time { return now }
	rev0, _ := s.Revision(ctx)
	got, err := s.CreateTenant(ctx, "admin", Tenant{ID: "acme", Name: "Acme", Tier: "pro"})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != StatusActive || !got.Created.Equal(now) {
		t.Errorf("got %+v, want active, created %v", got, now)
	}
	if _, err := s.CreateTenant(ctx, "admin", Tenant{ID: "acme", Name: "again", Tier: "pro"}); !errors.Is(err, ErrConflict) {
		t.Errorf("duplicate: got %v, want ErrConflict", err)
	}
	if err := s.UpdateTenant(ctx, "admin", Tenant{ID: "acme", Name: "Acme Inc", Tier: "free"}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetTenantStatus(ctx, "ops", "acme", StatusSuspended); err != nil {
		t.Fatal(err)
	}
	tn, err := s.Tenant(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if want := (Tenant{ID: "acme", Name: "Acme Inc", Tier: "free", Status: StatusSuspended, Created: now}); tn.ID != want.ID || tn.Name != want.Name || tn.Tier != want.Tier || tn.Status != want.Status || !tn.Created.Equal(want.Created) {
		t.Errorf("got %+v, want %+v", tn, want)
	}
	for name, err := range map[string]error{
		"update missing":  s.UpdateTenant(ctx, "admin", Tenant{ID: "nope", Name: "x", Tier: "pro"}),
		"suspend missing": s.SetTenantStatus(ctx, "admin", "nope", StatusSuspended),
		"delete missing":  s.DeleteTenant(ctx, "admin", "nope"),
	} {
		if !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: got %v, want ErrNotFound", name, err)
		}
	}
	if _, err := s.Tenant(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("read missing: got %v, want ErrNotFound", err)
	}
	if _, _, err := s.CreateKey(ctx, "admin", "acme", NewKey{Name: "ci"}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteTenant(ctx, "admin", "acme"); err != nil {
		t.Fatal(err)
	}
	if keys, _ := s.Keys(ctx, "acme"); len(keys) != 0 {
		t.Errorf("keys after delete: got %d, want 0", len(keys))
	}
	rev, _ := s.Revision(ctx)
	if rev != rev0+5 {
		t.Errorf("revision: got %d, want %d (five changes)", rev, rev0+5)
	}
	page, err := s.Audit(ctx, AuditQuery{Object: "tenant:acme"})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range page.Entries {
		actions = append(actions, e.Actor+" "+e.Action)
	}
	if got, want := strings.Join(actions, ","), "admin tenant.delete,ops tenant.suspend,admin tenant.update,admin tenant.create"; got != want {
		t.Errorf("audit: got %s, want %s", got, want)
	}
	page, err = s.Audit(ctx, AuditQuery{TenantID: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	actions = nil
	for _, e := range page.Entries {
		actions = append(actions, e.Action)
	}
	if got, want := strings.Join(actions, ","), "tenant.delete,key.create,tenant.suspend,tenant.update,tenant.create"; got != want {
		t.Errorf("audit of tenant acme: got %s, want %s", got, want)
	}
}

func testStoreKeys(t *testing.T, s *Store) {
	ctx := context.Background()
	if _, err := s.CreateTenant(ctx, "admin", Tenant{ID: "acme", Name: "Acme", Tier: "pro"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.CreateKey(ctx, "admin", "nope", NewKey{Name: "ci"}); !errors.Is(err, ErrNotFound) {
		t.Errorf("key for missing tenant: got %v, want ErrNotFound", err)
	}
	exp := time.UnixMilli(1_900_000_000_000)
	k, key, err := s.CreateKey(ctx, "admin", "acme", NewKey{Name: "ci", Expires: exp})
	if err != nil {
		t.Fatal(err)
	}
	id, secret, ok := parseStoredKey(key)
	if !ok || id != k.ID {
		t.Fatalf("key %q: got id %q ok %v, want id %q", key, id, ok, k.ID)
	}
	keys, err := s.Keys(ctx, "acme")
	if err != nil || len(keys) != 1 {
		t.Fatalf("got %v %v, want one key", keys, err)
	}
	if keys[0].secretHash != HashKey(secret) || !keys[0].Expires.Equal(exp) || !keys[0].Revoked.IsZero() {
		t.Errorf("got %+v, want the secret's hash, expiry %v, not revoked", keys[0], exp)
	}
	used := time.UnixMilli(1_800_000_000_000)
	if err := s.TouchKeys(ctx, map[string]time.Time{k.ID: used}); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchKeys(ctx, map[string]time.Time{k.ID: used.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(ctx, "admin", "other", k.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("revoke through another tenant: got %v, want ErrNotFound", err)
	}
	if err := s.RevokeKey(ctx, "admin", "acme", k.ID); err != nil {
		t.Fatal(err)
	}
	keys, _ = s.Keys(ctx, "")
	if len(keys) != 1 || keys[0].Revoked.IsZero() || !keys[0].LastUsed.Equal(used) {
		t.Errorf("got %+v, want revoked, last used %v (never moved back)", keys, used)
	}
	page, _ := s.Audit(ctx, AuditQuery{})
	for _, e := range page.Entries {
		if strings.Contains(string(e.Details), secret) || strings.Contains(string(e.Details), key) {
			t.Errorf("audit entry %+v contains the secret", e)
		}
	}
}

// metacharacters are SQL, JSON and shell specials that must survive a round trip unchanged.
var metacharacters = []string{
	`'; DROP TABLE tenants; --`,
	`" OR "1"="1`,
	`\' \\ \x00`,
	`%_*?[]$1 $2 ?`,
	"multi\nline\ttab",
	`Robert'); DELETE FROM api_keys WHERE ('1'='1`,
	`ünïcødé 租户 🚀`,
}

func testStoreMetacharacters(t *testing.T, s *Store) {
	ctx := context.Background()
	for i, m := range metacharacters {
		m = strings.ReplaceAll(m, "\x00", "")
		id := fmt.Sprintf("t%d", i)
		if _, err := s.CreateTenant(ctx, m, Tenant{ID: id, Name: m, Tier: m}); err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		got, err := s.Tenant(ctx, id)
		if err != nil || got.Name != m || got.Tier != m {
			t.Errorf("got %+v %v, want name and tier %q", got, err, m)
		}
		k, _, err := s.CreateKey(ctx, m, id, NewKey{Name: m})
		if err != nil {
			t.Fatalf("%q: %v", m, err)
		}
		keys, _ := s.Keys(ctx, id)
		if len(keys) != 1 || keys[0].Name != m {
			t.Errorf("got %+v, want one key named %q", keys, m)
		}
		page, err := s.Audit(ctx, AuditQuery{Actor: m, Object: "key:" + k.ID})
		if err != nil || len(page.Entries) != 1 || page.Entries[0].Actor != m {
			t.Errorf("audit by actor %q: got %+v %v, want one entry", m, page, err)
		}
		if _, err := s.Tenant(ctx, m); !errors.Is(err, ErrNotFound) {
			t.Errorf("tenant with id %q: got %v, want ErrNotFound", m, err)
		}
	}
	all, err := s.Tenants(ctx)
	if err != nil || len(all) != len(metacharacters) {
		t.Errorf("got %d tenants %v, want %d (no table dropped, none deleted)", len(all), err, len(metacharacters))
	}
}

func testStoreAuditPaging(t *testing.T, s *Store) {
	ctx := context.Background()
	now := time.UnixMilli(1_700_000_000_000)
	s.now = func() time.Time { now = now.Add(time.Millisecond); return now }
	for i := range 7 {
		if _, err := s.CreateTenant(ctx, "admin", Tenant{ID: fmt.Sprintf("t%d", i), Name: "n", Tier: "pro"}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	q := AuditQuery{Limit: 3}
	for range 5 {
		page, err := s.Audit(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range page.Entries {
			seen = append(seen, e.Object)
		}
		if page.NextBefore == "" {
			break
		}
		q.Before = page.NextBefore
	}
	if got, want := strings.Join(seen, ","), "tenant:t6,tenant:t5,tenant:t4,tenant:t3,tenant:t2,tenant:t1,tenant:t0"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

// migrationsFS is the migration set as the binary embeds it (package migrations), read from the
// folder so that tenants stays free of project imports.
var migrationsFS fs.FS = os.DirFS(filepath.Join("..", "migrations"))

// TestStorageFailuresAreErrStorage is issue 26's weak spot: a read-only database answered 400 to
// a tenant's creation, which tells automation not to retry. A failure of the database itself
// is ErrStorage (503 at the admin API); the store's own refusals stay what they were.
func TestStorageFailuresAreErrStorage(t *testing.T) {
	a, f := newAdminFixture(t, AdminConfig{})
	ctx := context.Background()
	admin := Actor{Name: "admin", Admin: true}
	if _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "acme"}); !errors.Is(err, ErrConflict) || errors.Is(err, ErrStorage) {
		t.Errorf("a taken id: got %v, want ErrConflict alone", err)
	}
	if _, err := f.store.db.ExecContext(ctx, `PRAGMA query_only = 1`); err != nil { // the one connection
		t.Fatal(err)
	}
	if _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "newco"}); !errors.Is(err, ErrStorage) {
		t.Errorf("create a tenant on a read-only database: got %v, want ErrStorage", err)
	}
	if _, _, err := a.CreateKey(ctx, admin, "acme", KeyInput{Name: "k"}); !errors.Is(err, ErrStorage) {
		t.Errorf("create a key on a read-only database: got %v, want ErrStorage", err)
	}
	if _, err := f.store.Tenant(ctx, "nobody"); !errors.Is(err, ErrNotFound) || errors.Is(err, ErrStorage) {
		t.Errorf("an unknown tenant on a read-only database: got %v, want ErrNotFound alone", err)
	}
	f.store.Close()
	if _, err := f.store.Tenants(ctx); !errors.Is(err, ErrStorage) {
		t.Errorf("list tenants of a closed database: got %v, want ErrStorage", err)
	}
}
