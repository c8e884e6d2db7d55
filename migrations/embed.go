// Package migrations holds usher's versioned SQL migrations (goose v3 format), embedded in the
// binary. The same files run on SQLite and PostgreSQL: they use only types and statements both
// understand (TEXT, BIGINT, INTEGER; times as unix milliseconds; ids made by the application).
// `usher migrate up|status` and `usher serve` run them through tenants.Open.
package migrations

import "embed"

// FS holds the migration files at its root, named NNNNN_description.sql.
//
//go:embed *.sql
var FS embed.FS
