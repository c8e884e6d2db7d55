// Package pgtest gives a test its own fresh schema of the PostgreSQL at USHER_TEST_POSTGRES_DSN.
//
// .ci/run sets the variable; without it a test using URL fails in CI (CI=true) and is skipped
// elsewhere, so a newcomer without PostgreSQL can still run `make test`.
package pgtest

import (
	"crypto/rand"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// DSNEnv names the PostgreSQL the tests use.
const DSNEnv = "USHER_TEST_POSTGRES_DSN"

// URL creates a fresh schema and returns a database URL whose search_path is that schema; the
// schema is dropped when the test ends.
func URL(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(DSNEnv)
	if dsn == "" {
		const hint = "%s is not set; set it to a PostgreSQL DSN, e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
		if os.Getenv("CI") == "true" {
			t.Fatalf(hint, DSNEnv)
		}
		t.Skipf(hint+" (skipped outside CI; .ci/run sets it)", DSNEnv)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatalf("open %s: %v", DSNEnv, err)
	}
	defer db.Close()
	schema := "usher_test_" + strings.ToLower(rand.Text()[:12])
	if _, err := db.Exec(`CREATE SCHEMA ` + schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		db, err := sql.Open("pgx", dsn)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return fmt.Sprintf("%s%ssearch_path=%s", dsn, sep, schema)
}
