//go:build unix

package queue

import (
	"syscall"
	"testing"
	"time"
)

// cpuTime is the CPU time (user + system) the process has used so far, GC workers included.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
