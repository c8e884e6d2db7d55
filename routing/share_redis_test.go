package routing

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/test/redistest"
)

// TestSharesOverRedis: two replicas split a worker of 12 slots through a real Redis: a, with a
// long backlog, gets 10 and b, with two requests, 2. Fields another writer put in the worker's
// hash (out of bounds, negative, not numbers) are dropped and change nothing. With
// redis-server stopped each replica keeps within its last grant and half the worker for as
// long as it is stopped (b does not grow to its half); restarted empty, they keep within those
// for ShareReportTTL and then split by demand again. The two never have more than 12 in
// flight.
func TestSharesOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	var rs []*simReplica
	var clients []*redis.Client
	for _, name := range []string{"a", "b"} {
		cfg := Config{Workers: []WorkerSpec{{ID: "w0", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: simLimit}}}
		rdb := newRedisClient(t, srv)
		p, _ := newTestPoolWith(t, cfg, Options{Now: clock.Now, Shares: NewRedisStore(rdb, 0)})
		rs = append(rs, &simReplica{name: name, pool: p})
		clients = append(clients, rdb)
	}
	rs[0].keep[1], rs[0].life = 400, 2
	rs[1].queued[1] = 2
	wantShares := func(when string, want ...int64) {
		t.Helper()
		for i, r := range rs {
			if got := r.share(); got != want[i] {
				t.Fatalf("%s: %s's share is %d, want %d (%s)", when, r.name, got, want[i], simState(rs))
			}
		}
	}
	simRun(t, clock, rs, 0, 20)
	wantShares("split", 10, 2)

	rdb := newRedisClient(t, srv)
	ctx := context.Background()
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	at := now.UnixMilli()
	key := shareKey("w0")
	for field, v := range map[string]string{
		"huge": fmt.Sprintf("99999999 0 0 %d", at), "negative": fmt.Sprintf("-12 0 0 %d", at),
		"nan": "nan 1 1 1", "demand": fmt.Sprintf("0 0 99999999999999999999 %d", at), "future": fmt.Sprintf("0 0 0 %d", at+60_000),
	} {
		if err := rdb.HSet(ctx, key, field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	simRun(t, clock, rs, 20, 5)
	wantShares("with junk in the hash", 10, 2)
	if n := rdb.HLen(ctx, key).Val(); n != 2 {
		t.Fatalf("the worker's hash has %d fields, want the 2 replicas' (%v)", n, rdb.HGetAll(ctx, key).Val())
	}

	srv.Stop()
	ttl := int(ShareReportTTL / (50 * time.Millisecond))
	simRun(t, clock, rs, 25, 10)
	wantShares("redis-server stopped, the last grants still counted", 6, 2)
	simRun(t, clock, rs, 35, ttl)
	wantShares("redis-server stopped past the reports' TTL", 6, 2)
	srv.Restart()
	// go-redis holds back dialing for a while after failed dials: wait until both replicas'
	// clients reach the server again (the simulated clock does not move meanwhile).
	for _, c := range clients {
		deadline := time.Now().Add(5 * time.Second)
		for c.Ping(ctx).Err() != nil {
			if time.Now().After(deadline) {
				t.Fatal("a replica's client did not reach the restarted redis-server within 5s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	back := 35 + ttl
	simRun(t, clock, rs, back, ttl-2)
	for _, r := range rs {
		if got := r.share(); got > 6 {
			t.Fatalf("rejoining: %s's share is %d, want at most its half, 6 (%s)", r.name, got, simState(rs))
		}
	}
	simRun(t, clock, rs, back+ttl-2, 20)
	wantShares("rejoined", 10, 2)
}

// TestShareWeightsOverRedis: a replica's weights reach the others through the worker's hash of
// weights; fields another writer put there (not numbers, out of bounds, from the future) are
// dropped; a live replica that reports no weights (an earlier version, which writes only the
// grants' hash) is answered as one tenant of weight 1 per level it has demand in, and its
// grant still counts.
func TestShareWeightsOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newRedisClient(t, srv)
	ctx := context.Background()
	a, b := NewRedisStore(newRedisClient(t, srv), 0), NewRedisStore(newRedisClient(t, srv), 0)
	if _, err := a.ExchangeShares(ctx, []ShareReport{{Worker: "w0", Limit: 12, Want: 6, Interactive: 1, Demand: 30,
		InteractiveWeight: 500, Weight: 3000}}); err != nil {
		t.Fatal(err)
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	at := now.UnixMilli()
	weights := shareKey("w0") + shareWeightsSuffix
	for field, v := range map[string]string{
		"nan": fmt.Sprintf("nan 1 %d", at), "huge": fmt.Sprintf("99999999999999 1 %d", at),
		"future": fmt.Sprintf("1 1 %d", at+60_000), "short": "1 1",
	} {
		if err := rdb.HSet(ctx, weights, field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.HSet(ctx, shareKey("w0"), "old", fmt.Sprintf("4 0 9 %d", at)).Err(); err != nil {
		t.Fatal(err)
	}
	got, err := b.ExchangeShares(ctx, []ShareReport{{Worker: "w0", Limit: 12, Want: 12, Demand: 5, Weight: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	if g := got[0].Grant; g != 2 {
		t.Fatalf("b's grant is %d, want 2: 12 less a's 6 and the old replica's 4", g)
	}
	byName := map[string]ReplicaDemand{}
	for _, d := range got[0].Fleet {
		byName[d.Replica] = d
	}
	want := map[string]ReplicaDemand{
		a.replica: {Replica: a.replica, Interactive: 1, Demand: 30, InteractiveWeight: 500, Weight: 3000},
		"old":     {Replica: "old", Demand: 9, Weight: shareWeightUnit},
		b.replica: {Replica: b.replica, Self: true, Demand: 5, Weight: 1000},
	}
	if len(byName) != len(want) {
		t.Fatalf("b's answer lists %v, want %v", got[0].Fleet, want)
	}
	for name, w := range want {
		if byName[name] != w {
			t.Fatalf("b's answer lists %+v, want %+v", byName[name], w)
		}
	}
	if n := rdb.HLen(ctx, weights).Val(); n != 2 {
		t.Fatalf("the worker's hash of weights has %d fields, want a's and b's (%v)", n, rdb.HGetAll(ctx, weights).Val())
	}
}

// TestReserveOverRedis: the fleet's interactive reserve through a real Redis. A hold that a
// replica reports in its exchange counts against the reserve; a take goes to the worker with
// the most tokens left that has room for one request of its tokens, and none when no worker has;
// junk another writer put in a reserve hash counts for nothing; a hold reported as none is
// dropped.
func TestReserveOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := NewRedisStore(newRedisClient(t, srv), 0), NewRedisStore(newRedisClient(t, srv), 0)
	report := func(worker string, reserve, tokens int64) ShareReport {
		return ShareReport{Worker: worker, Limit: 10, Hold: 1, Want: 5, Demand: 1, Reserve: reserve, ReserveTokens: tokens}
	}
	if _, err := a.ExchangeShares(ctx, []ShareReport{report("w0", 1, 100), report("w1", 0, 0)}); err != nil {
		t.Fatal(err)
	}
	claims := []ReserveClaim{{Worker: "w0", Requests: 2, Tokens: 400, Want: 150, WantRequests: 1}, {Worker: "w1", Requests: 2, Tokens: 400, Want: 150, WantRequests: 1}}
	take := func(s *RedisStore, claims []ReserveClaim, want int) {
		t.Helper()
		got, err := s.TakeReserve(ctx, claims)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Fatalf("took the reserve of claim %d, want %d", got, want)
		}
	}
	take(b, claims, 1)      // w0 has 300 tokens left, w1 400
	take(b, claims, 0)      // w0 300, w1 250
	take(b, claims[:1], -1) // w0: a's request and b's, of 2
	take(a, claims, 1)      // w1: b's request, of 2

	rdb := newRedisClient(t, srv)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	key := shareKey("w1") + shareReserveSuffix
	for field, v := range map[string]string{
		"huge": fmt.Sprintf("99999999 0 %d", now.UnixMilli()), "nan": "nan 1 1", "old": fmt.Sprintf("1 1 %d", now.UnixMilli()-60_000),
	} {
		if err := rdb.HSet(ctx, key, field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.ExchangeShares(ctx, []ShareReport{report("w0", 1, 150), report("w1", 0, 0)}); err != nil {
		t.Fatal(err)
	}
	take(a, claims[1:], 0) // w1: a's request, of 2; b gave its own back, the junk counts for nothing
	take(b, claims[1:], -1)
	if _, err := a.ExchangeShares(ctx, []ShareReport{report("w0", 0, 0), report("w1", 2, 300)}); err != nil {
		t.Fatal(err)
	}
	take(b, claims[:1], 0) // w0: b's request, of 2; a gave its own back
	if n, err := rdb.HLen(ctx, key).Result(); err != nil || n != 1 {
		t.Fatalf("w1's reserve hash has %d fields (%v), want a's alone", n, err)
	}
}

// TestReserveLoansOverRedis: loans to the fleet's interactive reserve through a real Redis. A
// loan is refused while the reserve has room and made while it has none, once for each hold
// beyond it; a loan is room for TakeReserve beyond the reserve's own; the exchange answers the
// live holds and loans and records the loan a replica reports; a loan is taken back only as far
// as the reserve has room; junk another writer put in a loan hash counts for nothing.
func TestReserveLoansOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	a, b := NewRedisStore(newRedisClient(t, srv), 0), NewRedisStore(newRedisClient(t, srv), 0)
	lend := func(s *RedisStore, delta, wantLent, wantRoom int64) {
		t.Helper()
		lent, room, err := s.LendReserve(ctx, "w0", 1, delta)
		if err != nil {
			t.Fatal(err)
		}
		if lent != wantLent || room != wantRoom {
			t.Fatalf("lend %d: got loan %d, room %d; want %d, %d", delta, lent, room, wantLent, wantRoom)
		}
	}
	claim := []ReserveClaim{{Worker: "w0", Requests: 1, Tokens: 400, Want: 100, WantRequests: 1}}
	take := func(s *RedisStore, want int) {
		t.Helper()
		if got, err := s.TakeReserve(ctx, claim); err != nil || got != want {
			t.Fatalf("took the reserve of claim %d (%v), want %d", got, err, want)
		}
	}
	lend(a, 1, 0, 1) // the reserve has room: nothing lent
	take(b, 0)       // the reserve's one request
	take(b, -1)
	lend(a, 1, 1, 1) // no room: lent
	lend(a, 1, 1, 1) // room again: no more
	take(b, 0)       // the loan is room: b holds 2 of 1 + 1 lent
	lend(a, -1, 1, 0)

	rdb := newRedisClient(t, srv)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	key := shareKey("w0") + shareLentSuffix
	for field, v := range map[string]string{
		"huge": fmt.Sprintf("99999999 %d", now.UnixMilli()), "nan": "nan 1", "old": fmt.Sprintf("5 %d", now.UnixMilli()-60_000),
	} {
		if err := rdb.HSet(ctx, key, field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	report := ShareReport{Worker: "w0", Limit: 10, Hold: 2, Want: 5, Demand: 1, Lent: 1}
	got, err := a.ExchangeShares(ctx, []ShareReport{report})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].ReserveHeld != 2 || got[0].ReserveLent != 1 {
		t.Fatalf("exchange answered holds %d, loans %d; want 2 (b's), 1 (a's): the junk counts for nothing", got[0].ReserveHeld, got[0].ReserveLent)
	}
	// b gives one request back: the reserve's own has room, the loan is not needed.
	got, err = b.ExchangeShares(ctx, []ShareReport{{Worker: "w0", Limit: 10, Hold: 1, Want: 5, Demand: 1, Reserve: 1, ReserveTokens: 100}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].ReserveHeld != 1 || got[0].ReserveLent != 1 {
		t.Fatalf("exchange answered holds %d, loans %d; want 1, 1", got[0].ReserveHeld, got[0].ReserveLent)
	}
	lend(a, -1, 0, 0) // taken back: the reserve's own request is b's hold
	take(b, -1)       // no room, no loan beside it
	if n, err := rdb.HLen(ctx, key).Result(); err != nil || n != 0 {
		t.Fatalf("w0's loan hash has %d fields (%v), want none", n, err)
	}
	if _, _, err := a.LendReserve(ctx, "w0", 1, maxSlots+1); err == nil {
		t.Fatal("a loan change beyond maxSlots was sent")
	}
	if _, _, err := a.LendReserve(ctx, "w0", 0, 1); err == nil {
		t.Fatal("a loan to a reserve of size 0 was sent")
	}
}

// TestRoomCallsOverRedis: calls for room through a real Redis's pub/sub reach the other
// replicas, not the caller; a loan call without a model too; a malformed, oversized or
// modelless call another publisher puts on the channel is dropped; a call too large is not sent.
func TestRoomCallsOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := NewRedisStore(newRedisClient(t, srv), 0), NewRedisStore(newRedisClient(t, srv), 0)
	heard := make(chan [2]any, 16)
	var watching sync.WaitGroup
	for name, s := range map[string]*RedisStore{"a": a, "b": b} {
		watching.Go(func() { s.WatchRoomCalls(ctx, func(c RoomCall) { heard <- [2]any{name, c} }) })
	}
	defer watching.Wait()
	defer cancel()
	rdb := newRedisClient(t, srv)
	waitFor(t, "both replicas subscribed", func() bool {
		n, err := rdb.PubSubNumSub(ctx, RoomCallsChannel).Result()
		return err == nil && n[RoomCallsChannel] == 2
	})
	for _, junk := range []string{"{", `{"r":"x","w":["w0"]}`, `{"r":"x","m":"m"}`, `{"r":"x","m":"m","w":["w0"],"pad":"` + strings.Repeat("x", maxRoomCallBytes) + `"}`} {
		if err := rdb.Publish(ctx, RoomCallsChannel, junk).Err(); err != nil {
			t.Fatal(err)
		}
	}
	call := RoomCall{Model: "m", Workers: []string{"w0", "w1"}}
	if err := a.CallRoom(ctx, call); err != nil {
		t.Fatal(err)
	}
	if err := b.CallRoom(ctx, RoomCall{Workers: []string{"w1"}, Lent: true}); err != nil {
		t.Fatal(err)
	}
	// Each replica hears on a connection of its own, so the two arrive in either order.
	want := map[any]RoomCall{"b": call, "a": {Workers: []string{"w1"}, Lent: true}}
	for range len(want) {
		select {
		case got := <-heard:
			if w, ok := want[got[0]]; !ok || !reflect.DeepEqual(got[1], w) {
				t.Fatalf("%v heard %v, want %v: junk passed on, or a call reached its caller", got[0], got[1], w)
			}
			delete(want, got[0])
		case <-time.After(5 * time.Second):
			t.Fatalf("timed out waiting for %v", want)
		}
	}
	select {
	case got := <-heard:
		t.Fatalf("heard %v beyond the two calls", got)
	case <-time.After(100 * time.Millisecond):
	}
	big := RoomCall{Model: "m", Workers: []string{strings.Repeat("w", maxRoomCallBytes)}}
	if err := a.CallRoom(ctx, big); err == nil {
		t.Fatal("a call over maxRoomCallBytes was sent")
	}
}
