package routing

import (
	"sync"
	"sync/atomic"
)

// broadcast wakes every goroutine waiting on it at once: Wait returns a channel that the next
// notify closes. notify costs one atomic load when nobody waits, so it may sit on a hot path.
type broadcast struct {
	watched atomic.Bool // someone holds the current channel
	mu      sync.Mutex  // guards ch
	ch      chan struct{}
}

// Wait returns a channel closed at the next notify.
func (b *broadcast) Wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	b.watched.Store(true)
	return b.ch
}

func (b *broadcast) notify() {
	if !b.watched.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.watched.CompareAndSwap(true, false) {
		close(b.ch)
		b.ch = make(chan struct{})
	}
}

// Changes returns a channel closed at the next change of what the pool can take: a worker
// added, removed, retired, drained or undrained, marked unhealthy or healthy, its circuit
// opened or closed, its learned limit changed, or its load from other replicas re-read. Call it
// again after each close for the change after. The gateway's queues follow the pool's capacity
// with it, without polling. Safe for concurrent use.
func (p *Pool) Changes() <-chan struct{} { return p.changes.Wait() }
