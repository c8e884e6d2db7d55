package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// `usher migrate status` only reads: before `usher migrate up` it says there is no database yet,
// exits 1 and leaves no file behind; after it, it lists the applied migrations and exits 0.
func TestMigrateStatusCreatesNoDatabase(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "usher.db")
	config := filepath.Join(dir, "usher.yaml")
	if err := os.WriteFile(config, []byte("database:\n  url: sqlite:"+db+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	migrate := func(verb string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := runMigrate([]string{verb, "--config", config}, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	code, stdout, stderr := migrate("status")
	want := "usher migrate status: there is no database at " + db + " yet: `usher migrate up` or `usher serve` creates it\n"
	if code != exitFailure || stdout != "" || stderr != want {
		t.Fatalf("status before up: got exit %d, stdout %q, stderr %q; want exit %d and stderr %q", code, stdout, stderr, exitFailure, want)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("status before up left %d files in the folder, want only the config", len(entries))
	}

	if code, _, stderr := migrate("up"); code != exitOK {
		t.Fatalf("up: exit %d: %s", code, stderr)
	}
	code, stdout, stderr = migrate("status")
	if code != exitOK || stderr != "" || !strings.Contains(stdout, "00001  applied") {
		t.Fatalf("status after up: got exit %d, stdout %q, stderr %q; want 0 and the migrations listed", code, stdout, stderr)
	}
}
