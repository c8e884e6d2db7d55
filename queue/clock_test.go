package queue_test

import (
	"sync"
	"time"

	"github.com/usherllm/usher/queue"
)

// fakeClock is a manual clock: time moves only in Advance, which runs due timers in the calling
// goroutine, in order, without holding the clock's lock.
type fakeClock struct {
	mu     sync.Mutex // guards now and every timer's fields
	now    time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	c      *fakeClock
	when   time.Time
	f      func()
	active bool
}

var (
	_ queue.Clock = (*fakeClock)(nil)
	_ queue.Timer = (*fakeTimer)(nil)
)

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) queue.Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, when: c.now.Add(d), f: f, active: true}
	c.timers = append(c.timers, t)
	return t
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.when, t.active = t.c.now.Add(d), true
	return was
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

// Advance moves the clock forward by d, firing each timer due on the way at its own time.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	c.AdvanceTo(end)
}

// AdvanceTo moves the clock to end (never backwards), firing due timers on the way.
func (c *fakeClock) AdvanceTo(end time.Time) {
	for {
		c.mu.Lock()
		var next *fakeTimer
		for _, t := range c.timers {
			if t.active && !t.when.After(end) && (next == nil || t.when.Before(next.when)) {
				next = t
			}
		}
		if next == nil {
			if end.After(c.now) {
				c.now = end
			}
			c.mu.Unlock()
			return
		}
		if next.when.After(c.now) {
			c.now = next.when
		}
		next.active = false
		f := next.f
		c.mu.Unlock()
		f()
	}
}
