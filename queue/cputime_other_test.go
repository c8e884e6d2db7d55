//go:build !unix

package queue

import (
	"testing"
	"time"
)

// cpuTime is not measured off unix; the cpu-ns/op metric then reads 0.
func cpuTime(testing.TB) time.Duration { return 0 }
