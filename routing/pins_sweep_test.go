package routing

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Without Redis, pins of sessions never seen again are freed without being read (issue 10, item
// 7: each new session ID's pin stayed in memory until read): a gateway whose clients use a new
// session ID for every request holds about twice the live pins, not every pin ever made.
func TestMemoryPinStoreSweepsPinsNeverReadAgain(t *testing.T) {
	clock := newFakeClock()
	s := NewMemoryPinStore(clock.Now, 0)
	ctx := context.Background()
	const live = 10_000
	for round := range 10 {
		for i := range live {
			k := PinKey{Model: "m", Tenant: "t", Key: fmt.Sprintf("r%d-s%d", round, i)}
			if round%2 == 0 {
				_ = s.Set(ctx, k, "w1", time.Minute)
			} else {
				_, _ = s.Claim(ctx, k, "", "w1", time.Minute)
			}
		}
		clock.Advance(2 * time.Minute)
	}
	s.mu.Lock()
	held := len(s.pins)
	s.mu.Unlock()
	if held > 2*live+minSweepAt {
		t.Fatalf("pins held after 10 rounds of %d one-off sessions: %d, want at most %d", live, held, 2*live+minSweepAt)
	}
	// A live pin is never swept (the one-off pins are another tenant's: a tenant's own pins past
	// MaxPinsPerTenant replace its least recently used, see TestPinsPerTenantAreBounded).
	k := PinKey{Model: "m", Tenant: "t", Key: "kept"}
	_ = s.Set(ctx, k, "w2", time.Hour)
	for i := range 3 * live {
		_ = s.Set(ctx, PinKey{Model: "m", Tenant: "u", Key: fmt.Sprintf("x%d", i)}, "w1", time.Second)
		if i%live == 0 {
			clock.Advance(2 * time.Second)
		}
	}
	if got, _ := s.Get(ctx, k, time.Hour); got != "w2" {
		t.Fatalf("a live pin after sweeps: got %q, want w2", got)
	}
}
