package routing

import (
	"sync/atomic"
	"time"
)

// breaker is the circuit breaker of one worker (see BreakerConfig). Its state lives in atomics so
// the pick path reads it without a lock; while the circuit is closed a check is one atomic load.
type breaker struct {
	now            func() time.Time
	failuresToOpen int64
	cooldown       time.Duration

	failures  atomic.Int64 // consecutive failed requests
	openUntil atomic.Int64 // unix nanoseconds until which the circuit is open; 0: closed
	probing   atomic.Bool  // the half-open probe is in flight
}

// breakerChange is what one request's end did to the circuit.
type breakerChange int

const (
	breakerSame   breakerChange = iota
	breakerOpened               // the circuit opened (or re-opened after a failed probe)
	breakerClosed               // the half-open probe succeeded
)

// admits reports whether the circuit lets a request through now: closed, or half-open with no
// probe in flight.
func (b *breaker) admits() bool {
	until := b.openUntil.Load()
	if until == 0 {
		return true
	}
	return b.now().UnixNano() >= until && !b.probing.Load()
}

// acquire lets one request through if the circuit admits it; probe says it is the half-open
// probe, which its release must report.
func (b *breaker) acquire() (probe, ok bool) {
	until := b.openUntil.Load()
	if until == 0 {
		return false, true
	}
	if b.now().UnixNano() < until || !b.probing.CompareAndSwap(false, true) {
		return false, false
	}
	return true, true
}

// done records the end of a request that acquire let through.
func (b *breaker) done(failed, probe bool) breakerChange {
	if !failed {
		b.failures.Store(0)
		if probe {
			b.openUntil.Store(0)
			b.probing.Store(false)
			return breakerClosed
		}
		return breakerSame
	}
	n := b.failures.Add(1)
	reopen := b.now().Add(b.cooldown).UnixNano()
	if probe {
		b.openUntil.Store(reopen)
		b.probing.Store(false)
		return breakerOpened
	}
	if n >= b.failuresToOpen && b.openUntil.CompareAndSwap(0, reopen) {
		return breakerOpened
	}
	return breakerSame
}
