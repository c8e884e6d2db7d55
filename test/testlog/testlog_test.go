package testlog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// recorder is the part of a test that Report writes to.
type recorder struct {
	testing.TB
	name string
	logs []string
}

func (r *recorder) Helper()      {}
func (r *recorder) Name() string { return r.name }
func (r *recorder) Logf(format string, args ...any) {
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

// A failed test's log: one line naming a file that holds it whole, or the log itself under -v.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("USHER_TEST_LOGS", dir)
	r := &recorder{TB: t, name: "TestFleet/kill one replica"}
	log := "level=INFO msg=a\nlevel=WARN msg=b\n"
	Report(r, "usher serve r1", log)
	if len(r.logs) != 1 {
		t.Fatalf("got %d lines, want one: %q", len(r.logs), r.logs)
	}
	if testing.Verbose() {
		if want := "log of usher serve r1 (2 lines):\n" + log; r.logs[0] != want {
			t.Fatalf("under -v: got %q, want %q", r.logs[0], want)
		}
		return
	}
	path := filepath.Join(dir, "TestFleet_kill_one_replica--usher_serve_r1.log")
	if want := "log of usher serve r1 (2 lines): " + path; r.logs[0] != want {
		t.Fatalf("got %q, want %q", r.logs[0], want)
	}
	if got, err := os.ReadFile(path); err != nil || string(got) != log {
		t.Fatalf("the file holds %q (%v), want %q", got, err, log)
	}
}

// A shared log file exists only once a line was written to it.
func TestFile(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("USHER_TEST_LOGS", dir)
	f := NewFile("redis-client.log")
	if _, written := f.Close(); written {
		t.Fatal("Close of a log without lines says it was written")
	}
	if _, err := os.Stat(filepath.Join(dir, "redis-client.log")); !os.IsNotExist(err) {
		t.Fatalf("a log without lines left a file: %v", err)
	}
	f = NewFile("redis-client.log")
	f.Printf(context.Background(), "redis: dial tcp %s: connection refused", "127.0.0.1:1")
	f.Printf(context.Background(), "again\n")
	path, written := f.Close()
	got, err := os.ReadFile(path)
	if !written || err != nil || string(got) != "redis: dial tcp 127.0.0.1:1: connection refused\nagain\n" {
		t.Fatalf("got %q written %v (%v)", got, written, err)
	}
}
