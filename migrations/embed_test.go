package migrations

import (
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
)

// TestFSHoldsEveryMigration: the embedded set is exactly the folder's SQL files, each a goose
// migration with an Up and a Down section.
func TestFSHoldsEveryMigration(t *testing.T) {
	embedded, err := fs.Glob(FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	onDisk, err := fs.Glob(os.DirFS("."), "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	if len(embedded) == 0 || !slices.Equal(embedded, onDisk) {
		t.Fatalf("got embedded %v, want the folder's %v", embedded, onDisk)
	}
	for _, name := range embedded {
		b, err := fs.ReadFile(FS, name)
		if err != nil {
			t.Fatal(err)
		}
		if s := string(b); !strings.Contains(s, "-- +goose Up") || !strings.Contains(s, "-- +goose Down") {
			t.Errorf("%s: got no goose Up and Down sections", name)
		}
	}
}
