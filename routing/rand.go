package routing

import (
	"math/rand/v2"
	"sync"
)

// randSource is the randomness policies draw from; safe for concurrent use.
type randSource interface {
	Uint64() uint64
}

// runtimeRand draws from the runtime's per-thread generator: lock-free, not reproducible.
type runtimeRand struct{}

func (runtimeRand) Uint64() uint64 { return rand.Uint64() }

// lockedRand serialises an injected source, which math/rand/v2 sources need; tests use it for
// reproducible picks.
type lockedRand struct {
	mu  sync.Mutex // guards src
	src rand.Source
}

func (l *lockedRand) Uint64() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.src.Uint64()
}

// intN returns a uniform integer in [0, n) for n > 0 (Lemire's multiply-shift; the bias is
// below 2^-32 for any fleet size).
func intN(r randSource, n int) int {
	hi := (r.Uint64() >> 32) * uint64(n)
	return int(hi >> 32)
}
