package routing

import (
	"context"
	"testing"
	"time"
)

// called reports whether p asked for an exchange before its next tick since the last look.
func called(p *Pool) bool {
	select {
	case <-p.ExchangeCalled():
		return true
	default:
		return false
	}
}

// TestExchangeCalledForWaitingInteractive: replica a's batch fills all of a worker of 12 but
// the fleet's interactive reserve (3), which b's first three interactive requests take. b's
// fourth finds no room, nor any in the reserve, and nothing of b's to preempt: b asks for an
// exchange at once (CallForRoom), and that exchange calls a, whose own exchange then shrinks
// its share for b's demand. When one of a's requests ends, a asks for an
// exchange that calls b, and b's exchange gives it the room: the waiting request is placed
// after four exchanges, none of them waiting for a tick. Once no other replica waits with an
// interactive request, a's requests end without a call.
func TestExchangeCalledForWaitingInteractive(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleetWith(t, clock, fleet, 0.25, "a", "b")
	a, b := rs[0], rs[1]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, r := range rs {
		go r.pool.watchShareCalls(ctx)
		<-fleet.watching
	}
	a.keep[1] = 400 // a's requests stay in flight until the test ends them
	simRun(t, clock, rs, 0, 10)
	wantInFlight(t, rs, 9, 0)
	interactive := &Request{Model: "m", Interactive: true}
	for i := range 3 {
		if !b.pool.TakeReserve(ctx, interactive) || pickNow(t, b, true) == nil {
			t.Fatalf("b's interactive request %d got no room of the reserve (%s)", i, simState(rs))
		}
	}
	if called(a.pool) || called(b.pool) {
		t.Fatal("an exchange was called before any request waited")
	}

	if pickNow(t, b, true) != nil || b.pool.TakeReserve(ctx, interactive) {
		t.Fatalf("b's fourth interactive request found room (%s)", simState(rs))
	}
	if called(b.pool) {
		t.Fatal("the reserve's refusal alone called an exchange (preemption may yet make room)")
	}
	b.pool.CallForRoom() // as the gateway does when nothing of b's can be preempted
	if !called(b.pool) {
		t.Fatal("b's interactive request waits for the fleet and b did not ask for an exchange")
	}
	b.queued[0] = 1
	if err := b.pool.SyncShares(ctx, b.demand); err != nil {
		t.Fatal(err)
	}
	if !called(a.pool) {
		t.Fatal("b's exchange for its waiting interactive request did not call a")
	}
	if err := a.pool.SyncShares(ctx, a.demand); err != nil {
		t.Fatal(err)
	}
	if s := a.share(); s >= a.inFlight() {
		t.Fatalf("a's share did not shrink for b's interactive demand (%s)", simState(rs))
	}
	if called(b.pool) || called(a.pool) {
		t.Fatal("an exchange called with no change for another replica")
	}

	a.leases[0].l.Release(Outcome{})
	a.leases = a.leases[1:]
	if !called(a.pool) {
		t.Fatal("a ended a request on a worker where b waits and did not ask for an exchange")
	}
	if err := a.pool.SyncShares(ctx, a.demand); err != nil {
		t.Fatal(err)
	}
	if !called(b.pool) {
		t.Fatal("a's exchange after giving up room b waits for did not call b")
	}
	if err := b.pool.SyncShares(ctx, b.demand); err != nil {
		t.Fatal(err)
	}
	if pickNow(t, b, true) == nil {
		t.Fatalf("b's waiting interactive request found no room after the called exchanges (%s)", simState(rs))
	}
	b.queued[0] = 0
	a.queued[0] = 1 // a's own interactive demand calls for nothing when its requests end

	for _, r := range []*simReplica{b, a, b, a} {
		if err := r.pool.SyncShares(ctx, r.demand); err != nil {
			t.Fatal(err)
		}
	}
	called(a.pool)
	called(b.pool)
	a.leases[0].l.Release(Outcome{})
	a.leases = a.leases[1:]
	if called(a.pool) {
		t.Fatal("a asked for an exchange for an ended request that nobody waits for")
	}
	fleetInFlight(t, rs)
}
