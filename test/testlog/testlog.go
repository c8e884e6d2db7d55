// Package testlog keeps the logs of what an end-to-end test starts (usher processes, engines,
// Redis clients) out of the way of its failure: the assertion comes first, then one line per log
// naming the file that holds it. Under `go test -v` a failing test prints the logs themselves
// instead, after its assertions, as a reader following the run expects.
//
// The files go to $USHER_TEST_LOGS, else to usher-test-logs in the system's temporary folder,
// named after the test and the process; a later failure of the same test replaces them.
package testlog

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// Dir is the folder failed tests' logs are written to.
func Dir() string {
	if d := os.Getenv("USHER_TEST_LOGS"); d != "" {
		return d
	}
	return filepath.Join(os.TempDir(), "usher-test-logs")
}

// OnFailure has t, if it failed, hand over the log that text returns when its cleanups run: in
// full under -v, else written to a file named after the test and name, which one line names.
// Call it before registering the cleanup that stops the process: cleanups run last registered
// first, so the log is read once the process has stopped and is complete.
func OnFailure(t testing.TB, name string, text func() string) {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			Report(t, name, text())
		}
	})
}

// Report hands log over now: in full under -v, else as a file that one line of t's output names.
func Report(t testing.TB, name, log string) {
	t.Helper()
	lines := strings.Count(log, "\n")
	if testing.Verbose() {
		t.Logf("log of %s (%d lines):\n%s", name, lines, log)
		return
	}
	path, err := write(fileName(t.Name(), name), log)
	if err != nil {
		t.Logf("log of %s (%d lines) not written: %v; run with -v to see it", name, lines, err)
		return
	}
	t.Logf("log of %s (%d lines): %s", name, lines, path)
}

// fileName is a file name for the log of process in test: the test's name with its subtest
// separators, then the process's name, every character a file name may not hold replaced.
func fileName(test, process string) string {
	clean := func(s string) string {
		return strings.Map(func(r rune) rune {
			switch {
			case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
				return r
			}
			return '_'
		}, s)
	}
	return clean(test) + "--" + clean(process) + ".log"
}

func write(name, log string) (string, error) {
	dir := Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte(log), 0o644)
}

// File is a log shared by the whole test binary, such as a client library's global logger: its
// lines go to one file of Dir, created at the first line, and nowhere else. It is safe for
// concurrent use.
type File struct {
	name string
	mu   sync.Mutex // guards f and err
	f    *os.File
	err  error
}

// NewFile returns the shared log written to the file name in Dir.
func NewFile(name string) *File { return &File{name: name} }

// Printf writes one line, as go-redis's redis.SetLogger wants. A file that cannot be written
// drops the line (the logger of a library has no one to report to).
func (l *File) Printf(_ context.Context, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil && l.err == nil {
		if l.err = os.MkdirAll(Dir(), 0o755); l.err == nil {
			l.f, l.err = os.Create(filepath.Join(Dir(), l.name))
		}
	}
	if l.f != nil {
		fmt.Fprintf(l.f, strings.TrimSuffix(format, "\n")+"\n", args...)
	}
}

// Close closes the file; written says whether any line went to it, at path.
func (l *File) Close() (path string, written bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return "", false
	}
	_ = l.f.Close()
	path, l.f, l.err = l.f.Name(), nil, os.ErrClosed
	return path, true
}
