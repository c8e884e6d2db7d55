package queue

import "time"

// Clock is the queue's source of time. Tests inject a fake one; the default is the real clock.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine once d has passed, like time.AfterFunc.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is the handle AfterFunc returns; *time.Timer satisfies it.
type Timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

var (
	_ Clock = realClock{}
	_ Timer = (*time.Timer)(nil)
)
