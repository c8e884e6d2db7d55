package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"strings"

	"github.com/usherllm/usher/migrations"
	"github.com/usherllm/usher/tenants"
)

// openStore opens the tenant store at url and brings its schema up to date; serve does this
// at every start, so `usher migrate up` is only needed to migrate ahead of a rollout.
func openStore(ctx context.Context, url string) (*tenants.Store, error) {
	store, err := tenants.Open(ctx, url, migrations.FS)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	if err := store.MigrateUp(ctx); err != nil {
		store.Close()
		return nil, fmt.Errorf("database migrations: %w", err)
	}
	return store, nil
}

// runMigrate is `usher migrate up|status --config FILE`. status only reads: a SQLite database
// that does not exist is reported as such, not created empty.
func runMigrate(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("usher migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", os.Getenv("USHER_CONFIG"), "configuration `file` (YAML); its database.url is migrated")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: usher migrate up|status --config FILE")
		fs.PrintDefaults()
	}
	if len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fs.Usage()
		return exitOK
	}
	if len(args) == 0 || (args[0] != "up" && args[0] != "status") {
		fs.Usage()
		return exitUsage
	}
	verb := args[0]
	if code, done := parseFlags(fs, args[1:]); done {
		return code
	}
	if *configPath == "" {
		fmt.Fprintln(stderr, "usher migrate: --config FILE is required")
		return exitUsage
	}
	cfg, err := loadConfig(*configPath, lookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "usher migrate: config %s:\n%s\n", *configPath, indent(err.Error()))
		return exitUsage
	}
	if verb == "status" {
		if path, ok := sqliteFile(cfg.Tenants.Database.URL); ok {
			if _, err := os.Stat(path); errors.Is(err, iofs.ErrNotExist) {
				fmt.Fprintf(stderr, "usher migrate status: there is no database at %s yet: `usher migrate up` or `usher serve` creates it\n", path)
				return exitFailure
			}
		}
	}
	ctx := context.Background()
	store, err := tenants.Open(ctx, cfg.Tenants.Database.URL, migrations.FS)
	if err != nil {
		fmt.Fprintf(stderr, "usher migrate: database: %v\n", err)
		return exitFailure
	}
	defer store.Close()
	if verb == "up" {
		if err := store.MigrateUp(ctx); err != nil {
			fmt.Fprintf(stderr, "usher migrate up: %v\n", err)
			return exitFailure
		}
	}
	if err := store.MigrateStatus(ctx, stdout); err != nil {
		fmt.Fprintf(stderr, "usher migrate status: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// sqliteFile returns the file of a SQLite database.url, in the forms tenants.Open reads
// (`sqlite:PATH`, `file:PATH`, a plain path); ok is false for any other URL.
func sqliteFile(url string) (path string, ok bool) {
	if url == "" || strings.Contains(url, "://") {
		return "", false
	}
	path = strings.TrimPrefix(strings.TrimPrefix(url, "sqlite:"), "file:")
	return path, path != ""
}
