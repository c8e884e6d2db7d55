package redistest

import (
	"errors"
	"testing"
)

// A second server asked for a port a first one holds is not taken for the first: go test runs
// packages in parallel, and a test that used another package's server lost it when that test
// ended (seen in CI: "connection refused" in the middle of a test).
func TestStartOnATakenPortIsRefused(t *testing.T) {
	first := Start(t)
	second := &Server{t: t, port: first.port}
	if err := second.start(); !errors.Is(err, errPortTaken) {
		second.Stop()
		t.Fatalf("a second redis-server on %s: got %v, want %v", first.Addr(), err, errPortTaken)
	}
	pid, err := serverPID(first.Addr())
	if err != nil || pid != first.cmd.Process.Pid {
		t.Errorf("the first server: got pid %d, %v; want %d", pid, err, first.cmd.Process.Pid)
	}
	first.Restart()
	if pid, err := serverPID(first.Addr()); err != nil || pid != first.cmd.Process.Pid {
		t.Errorf("after Restart: got pid %d, %v; want the new process %d", pid, err, first.cmd.Process.Pid)
	}
}
