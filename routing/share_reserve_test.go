package routing

import (
	"context"
	"errors"
	"testing"
	"time"
)

// pickNow places one request of m on r's pool at once, or says it found no room.
func pickNow(t *testing.T, r *simReplica, interactive bool) *Lease {
	t.Helper()
	l, err := r.pool.Pick(context.Background(), &Request{Model: "m", Interactive: interactive})
	if errors.Is(err, ErrNoRoom) {
		return nil
	}
	if err != nil {
		t.Fatalf("%s: pick: %v", r.name, err)
	}
	return l
}

// fleetInFlight fails the test when the replicas have more than the worker's limit in flight.
func fleetInFlight(t *testing.T, rs []*simReplica) int64 {
	t.Helper()
	var total int64
	for _, r := range rs {
		total += r.inFlight()
	}
	if total > simLimit {
		t.Fatalf("the fleet has %d in flight on w0, over its limit %d (%s)", total, simLimit, simState(rs))
	}
	return total
}

// TestInteractiveReserveIsTheFleets: replica a's batch backlog fills its share of a worker of 12
// slots; b has nothing queued, so the split gives a everything but the fleet's interactive
// reserve (a quarter: 3) and b nothing. An interactive request arriving at b is placed at
// once on room b takes from the fleet's reserve, three of them, and a fourth finds none, while
// a's batch never gets the reserve; the fleet never has more than 12 in flight. Once b's
// interactive requests end, the next exchanges give the reserve back, and an interactive
// request arriving at a takes it. Without the fleet's reserve a's batch holds the whole worker
// and b's interactive request waits.
func TestInteractiveReserveIsTheFleets(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleetWith(t, clock, fleet, 0.25, "a", "b")
	a, b := rs[0], rs[1]
	a.keep[1] = 400
	simRun(t, clock, rs, 0, 10)
	wantInFlight(t, rs, 9, 0)

	var held []*Lease
	for i := range 3 {
		if pickNow(t, b, true) != nil {
			t.Fatalf("b's interactive request %d placed within b's share of 0 (%s)", i, simState(rs))
		}
		if !b.pool.TakeReserve(context.Background(), &Request{Model: "m", Interactive: true}) {
			t.Fatalf("b's interactive request %d took nothing of the fleet's reserve (%s)", i, simState(rs))
		}
		if l := pickNow(t, a, false); l != nil {
			t.Fatalf("a's batch request placed on the fleet's reserve (%s)", simState(rs))
		}
		l := pickNow(t, b, true)
		if l == nil {
			t.Fatalf("b's interactive request %d found no room after taking the reserve (%s)", i, simState(rs))
		}
		held = append(held, l)
		fleetInFlight(t, rs)
	}
	if b.pool.TakeReserve(context.Background(), &Request{Model: "m", Interactive: true}) {
		t.Fatalf("b took a fourth request of a reserve of 3 (%s)", simState(rs))
	}
	if a.pool.TakeReserve(context.Background(), &Request{Model: "m", Interactive: true}) {
		t.Fatalf("a took room of the reserve b holds (%s)", simState(rs))
	}
	if got := fleetInFlight(t, rs); got != simLimit {
		t.Fatalf("the fleet has %d in flight, want %d", got, simLimit)
	}

	for _, l := range held {
		l.Release(Outcome{})
	}
	simRun(t, clock, rs, 10, 6) // past reserveKeep: b gives the reserve back
	if got := fleet.reserveHeld("w0"); got != 0 {
		t.Fatalf("the fleet's reserve holds %d after b's interactive requests ended, want 0 (%s)", got, simState(rs))
	}
	wantInFlight(t, rs, 9, 0)
	if !a.pool.TakeReserve(context.Background(), &Request{Model: "m", Interactive: true}) || pickNow(t, a, true) == nil {
		t.Fatalf("a's interactive request got no room of the reserve b gave back (%s)", simState(rs))
	}
	fleetInFlight(t, rs)
	simRun(t, clock, rs, 16, 10)
}

// TestInteractiveReserveWhileCut: while the store is cut no replica takes the reserve, and
// after it comes back empty none does until every live replica has reported its hold again
// (ShareReportTTL), so a hold that a restarted store forgot is never lent twice; then a takes
// what b does not hold, and the fleet never has more than the worker's limit in flight.
func TestInteractiveReserveWhileCut(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleetWith(t, clock, fleet, 0.25, "a", "b")
	a, b := rs[0], rs[1]
	a.keep[1], a.life = 400, 2
	simRun(t, clock, rs, 0, 10)
	interactive := &Request{Model: "m", Interactive: true}
	if !b.pool.TakeReserve(context.Background(), interactive) || pickNow(t, b, true) == nil {
		t.Fatalf("b's interactive request got no room of the reserve (%s)", simState(rs))
	}
	fleet.setCut(true)
	simRun(t, clock, rs, 10, 4)
	if a.pool.TakeReserve(context.Background(), interactive) {
		t.Fatalf("a took the reserve while the store was cut (%s)", simState(rs))
	}
	fleet.forget()
	fleet.setCut(false)
	simRun(t, clock, rs, 14, 1)
	if a.pool.TakeReserve(context.Background(), interactive) {
		t.Fatalf("a took the reserve while rejoining (%s)", simState(rs))
	}
	simRun(t, clock, rs, 15, int(ShareReportTTL/(50*time.Millisecond))+1)
	taken := 0
	for a.pool.TakeReserve(context.Background(), interactive) {
		if pickNow(t, a, true) == nil {
			t.Fatalf("a's interactive request found no room after taking the reserve (%s)", simState(rs))
		}
		fleetInFlight(t, rs)
		taken++
	}
	if taken == 0 {
		t.Fatalf("a took nothing of the reserve after the rejoin (%s)", simState(rs))
	}
}

// TestInteractiveReserveCoversAShrunkShare: a replica whose share shrank below its requests in
// flight (here by 2, its batch not yet ended) takes that excess from the reserve with the
// interactive request's room, so the request is placed at once; the fleet never has more than
// the worker's limit in flight.
func TestInteractiveReserveCoversAShrunkShare(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleetWith(t, clock, fleet, 0.25, "a", "b")
	a := rs[0]
	a.keep[1] = 400
	simRun(t, clock, rs, 0, 10)
	wantInFlight(t, rs, 9, 0)
	modelWorkersOf(a.pool).share.Store(7) // as SyncShares shrinks it, before a's batch ends
	if !a.pool.TakeReserve(context.Background(), &Request{Model: "m", Interactive: true}) || pickNow(t, a, true) == nil {
		t.Fatalf("a's interactive request found no room after taking the reserve (%s)", simState(rs))
	}
	if got := fleet.reserveHeld("w0"); got != 3 {
		t.Fatalf("a holds %d of the reserve, want 3: the request and the 2 above its share", got)
	}
	fleetInFlight(t, rs)
}

// The fleet's interactive reserve is sized as one replica's queue sizes its own: over the
// workers that serve the same models, ceil(share x the sum of their limits), the units left over
// to the largest remainders (ties by ID). Per worker, a tenth of two workers of four slots kept
// one slot of each (batch had 6 of 8 where one replica's queue leaves it 7); now one of the
// eight. A worker of other models, or of another role, is sized in its own group, and a worker
// is never all reserve.
func TestFleetReserveSizedOverTheModelsWorkers(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	specs := []WorkerSpec{
		{ID: "w0", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: 4},
		{ID: "w1", URL: "http://127.0.0.1:2", Models: []string{"m"}, MaxConcurrency: 4},
		{ID: "w2", URL: "http://127.0.0.1:3", Models: []string{"m"}, MaxConcurrency: 6},
		{ID: "n0", URL: "http://127.0.0.1:4", Models: []string{"n"}, MaxConcurrency: 4},
		{ID: "o0", URL: "http://127.0.0.1:5", Models: []string{"o"}, MaxConcurrency: 1},
		{ID: "p0", URL: "http://127.0.0.1:6", Models: []string{"d"}, MaxConcurrency: 4, Role: RolePrefill},
		{ID: "d0", URL: "http://127.0.0.1:7", Models: []string{"d"}, MaxConcurrency: 4, Role: RoleDecode},
	}
	p, _ := newTestPoolWith(t, Config{Workers: specs}, Options{Now: clock.Now, InteractiveReserve: 0.1, Shares: newMemFleet(clock.Now).replica("a")})
	if err := p.SyncShares(context.Background(), func(string) ModelBacklog { return ModelBacklog{} }); err != nil {
		t.Fatal(err)
	}
	// m: 0.4 + 0.4 + 0.6 = 1.4, so 2 requests; the remainders 0.6 (w2), 0.4 (w0), 0.4 (w1).
	// d: its prefill and decode pools are sized apart, each as a model of its own.
	want := map[string]int64{"w0": 1, "w1": 0, "w2": 1, "n0": 1, "o0": 0, "p0": 1, "d0": 1}
	for _, w := range p.workers {
		if got, _ := w.reserveSize(); got != want[w.spec.ID] {
			t.Errorf("%s keeps %d of the fleet's reserve, want %d", w.spec.ID, got, want[w.spec.ID])
		}
	}
}

// TestReserveLentForAnotherReplicasInteractive: three replicas keep a worker of 12 full of
// batch (a, the first to place, holds it all), less the fleet's interactive reserve of one
// request, and c's interactive request holds the reserve. b's interactive request then finds no
// room: none of its share, none in the reserve, nothing of its own to preempt. a, called for it,
// lends the reserve one request of its share (and ends a batch request there, as the gateway
// preempts it); a second loan for the same call is refused, the reserve having room again; b
// takes the room and places its request, and a's batch does not take the room back while it is
// lent. The fleet never has more than the worker's limit in flight. Once the interactive
// requests end and their holds go back, so does the loan, and batch has all but the reserve
// again. Without the loan b's request waited for a batch request to end.
func TestReserveLentForAnotherReplicasInteractive(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	rs := newSimFleetWith(t, clock, fleet, 1.0/simLimit, "a", "b", "c")
	for _, r := range rs {
		r.keep[1] = 400 // batch requests that stay until ended here
	}
	a, b, c := rs[0], rs[1], rs[2]
	simRun(t, clock, rs, 0, 10)
	round := 10
	if got := fleetInFlight(t, rs); got != simLimit-1 {
		t.Fatalf("batch holds %d, want all but the reserve's one (%s)", got, simState(rs))
	}
	ctx := context.Background()
	interactive := &Request{Model: "m", Interactive: true}
	if !c.pool.TakeReserve(ctx, interactive) {
		t.Fatalf("c's interactive request found the reserve held (%s)", simState(rs))
	}
	held := []*Lease{pickNow(t, c, true)}
	if held[0] == nil {
		t.Fatalf("c's interactive request found no room after taking the reserve (%s)", simState(rs))
	}
	if b.pool.TakeReserve(ctx, interactive) || pickNow(t, b, true) != nil {
		t.Fatalf("b's interactive request found room with the reserve held (%s)", simState(rs))
	}
	w := modelWorkersOf(a.pool)
	if !a.pool.LendReserve(ctx, w) {
		t.Fatalf("a lent nothing to a reserve without room (holds %d, loans %d; %s)", fleet.reserveHeld("w0"), fleet.reserveLent("w0"), simState(rs))
	}
	a.leases[0].l.Release(Outcome{}) // the batch request a preempts for the loan
	a.leases = a.leases[1:]
	if a.pool.LendReserve(ctx, w) {
		t.Fatalf("a lent again, to a reserve that has room again (holds %d, loans %d)", fleet.reserveHeld("w0"), fleet.reserveLent("w0"))
	}
	if pickNow(t, a, false) != nil {
		t.Fatalf("a placed a batch request on the room it lent (%s)", simState(rs))
	}
	if !b.pool.TakeReserve(ctx, interactive) {
		t.Fatalf("b's interactive request found no room of the loan (holds %d, loans %d; %s)", fleet.reserveHeld("w0"), fleet.reserveLent("w0"), simState(rs))
	}
	l := pickNow(t, b, true)
	if l == nil {
		t.Fatalf("b's interactive request found no room after taking the loan (%s)", simState(rs))
	}
	held = append(held, l)
	if got := fleetInFlight(t, rs); got != simLimit {
		t.Fatalf("the fleet holds %d, want the worker's limit (%s)", got, simState(rs))
	}
	simRun(t, clock, rs, round, 3) // exchanges while the loan is needed: it stays
	round += 3
	if got := fleet.reserveLent("w0"); got != 1 {
		t.Fatalf("the loan is %d while both holds need it, want 1 (%s)", got, simState(rs))
	}
	for _, l := range held {
		l.Release(Outcome{})
	}
	simRun(t, clock, rs, round, 8) // past reserveKeep: the holds go back, then the loan
	if h, l := fleet.reserveHeld("w0"), fleet.reserveLent("w0"); h != 0 || l != 0 {
		t.Fatalf("after the interactive requests ended, the reserve is held %d and lent %d, want 0 and 0 (%s)", h, l, simState(rs))
	}
	if got := fleetInFlight(t, rs); got != simLimit-1 {
		t.Fatalf("batch holds %d after the loan came back, want all but the reserve's one (%s)", got, simState(rs))
	}
}
