package tenants

import (
	"context"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/test/redistest"
)

func newFairShare(t *testing.T, addr string, ttl time.Duration) (*FairShareCounters, *redis.Client) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { rdb.Close() })
	fs, err := NewFairShareCounters(FairShareOptions{Redis: rdb, TTL: ttl, Timeout: 2 * time.Second, FloorAge: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return fs, rdb
}

// TestFairShareExchange: counters are lifted then charged, two replicas see each other's
// charges, and the fleet's floor is the least a replica sent lately.
func TestFairShareExchange(t *testing.T) {
	srv := redistest.Start(t)
	a, _ := newFairShare(t, srv.Addr(), time.Minute)
	b, _ := newFairShare(t, srv.Addr(), time.Minute)
	ctx := context.Background()

	none := math.Inf(1)
	f, err := a.Exchange(ctx, "m", []float64{none, 300, none}, []FairShareCharge{
		{Tenant: "heavy", Class: 1, Charge: 500},
		{Tenant: "light", Class: 1, Charge: 100, Lifted: true, Lift: 250.5},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, floors := f.Counters, f.Floors
	if want := []float64{500, 350.5}; !slices.Equal(got, want) {
		t.Errorf("counters %v, want %v", got, want)
	}
	if want := []float64{none, 300, none}; !slices.Equal(floors, want) {
		t.Errorf("floors %v, want %v", floors, want)
	}

	f, err = b.Exchange(ctx, "m", []float64{none, 100, 7}, []FairShareCharge{
		{Tenant: "heavy", Class: 1, Charge: -20, Lifted: true, Lift: 100}, // a lift below: no effect
		{Tenant: "heavy", Class: 2, Charge: 1},                            // another class: another counter
		{Tenant: "light", Class: 1},
	})
	if err != nil {
		t.Fatal(err)
	}
	got, floors = f.Counters, f.Floors
	if want := []float64{480, 1, 350.5}; !slices.Equal(got, want) {
		t.Errorf("B's counters %v, want %v", got, want)
	}
	if want := []float64{none, 100, 7}; !slices.Equal(floors, want) {
		t.Errorf("B's floors %v, want %v (the least of A's and B's)", floors, want)
	}
	if f, _ = a.Exchange(ctx, "m", []float64{400, none, none}, nil); !slices.Equal(f.Floors, []float64{400, 100, 7}) {
		t.Errorf("A's floors with B's still fresh: %v, want [400 100 7]", f.Floors)
	}
	time.Sleep(400 * time.Millisecond) // past FloorAge: B's floors no longer count, nor A's
	if f, _ = a.Exchange(ctx, "m", []float64{none, 50, none}, nil); !slices.Equal(f.Floors, []float64{none, 50, none}) {
		t.Errorf("A's floors once B's are old: %v, want [+Inf 50 +Inf]", f.Floors)
	}
	if f, _ := a.Exchange(ctx, "other", nil, []FairShareCharge{{Tenant: "heavy", Class: 1}}); !slices.Equal(f.Counters, []float64{0}) {
		t.Errorf("another model's counter of heavy: %v, want 0", f.Counters)
	}
}

// TestFairShareKeysAreBounded: a hostile tenant id (huge, odd bytes) names a key of bounded
// size, every key expires, and bad input is refused before any round trip.
func TestFairShareKeysAreBounded(t *testing.T) {
	srv := redistest.Start(t)
	fs, rdb := newFairShare(t, srv.Addr(), 30*time.Second)
	ctx := context.Background()
	hostile := strings.Repeat("\x00\xff{}:*\n", 100_000)
	if _, err := fs.Exchange(ctx, hostile, []float64{1}, []FairShareCharge{{Tenant: hostile, Class: 0, Charge: 1}}); err != nil {
		t.Fatal(err)
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Fatalf("keys %q, want the floors and a counter", keys)
	}
	for _, k := range keys {
		if len(k) > 80 || strings.ContainsAny(k, "\x00\xff\n*") {
			t.Errorf("key %q: want a short key of printable bytes", k)
		}
		if ttl := rdb.PTTL(ctx, k).Val(); ttl <= 0 || ttl > 30*time.Second {
			t.Errorf("key %s expires in %v, want within 30s", k, ttl)
		}
	}
	for _, tc := range []struct {
		name    string
		floors  []float64
		charges []FairShareCharge
	}{
		{"too many flows", nil, make([]FairShareCharge, MaxFairShareFlows+1)},
		{"class out of range", nil, []FairShareCharge{{Tenant: "t", Class: maxFairShareClasses}}},
		{"NaN charge", nil, []FairShareCharge{{Tenant: "t", Charge: math.NaN()}}},
		{"-Inf floor", []float64{math.Inf(-1)}, nil},
	} {
		if _, err := fs.Exchange(ctx, "m", tc.floors, tc.charges); err == nil {
			t.Errorf("%s: got no error, want a refusal", tc.name)
		}
	}
}

// TestFairShareCutFailsFast: with Redis cut, an exchange fails within its timeout; restored, the
// next one succeeds.
func TestFairShareCutFailsFast(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	fs, err := NewFairShareCounters(FairShareOptions{Redis: rdb, Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	charge := []FairShareCharge{{Tenant: "t", Class: 1, Charge: 10}}
	if _, err := fs.Exchange(ctx, "m", nil, charge); err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	start := time.Now()
	if _, err := fs.Exchange(ctx, "m", nil, charge); err == nil {
		t.Error("exchange with Redis cut: got no error")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("exchange with Redis cut took %v, want it bounded by its timeout", d)
	}
	proxy.Restore()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := fs.Exchange(ctx, "m", nil, []FairShareCharge{{Tenant: "t", Class: 1}})
		got := f.Counters
		if err == nil {
			if !slices.Equal(got, []float64{10}) {
				t.Errorf("counter after the cut: %v, want 10 (the failed exchange applied nothing)", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exchange after Restore: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFairShareQueuedSummed: each replica's queued requests of a flow are summed over the
// replicas that sent theirs within FloorAge; a replica that sends 0 leaves the sum at once, one
// that stops sending leaves it after FloorAge; a field another writer put there (not a number,
// beyond the bound) is dropped; a Queued out of bounds is refused.
func TestFairShareQueuedSummed(t *testing.T) {
	srv := redistest.Start(t)
	a, rdb := newFairShare(t, srv.Addr(), time.Minute)
	b, _ := newFairShare(t, srv.Addr(), time.Minute)
	ctx := context.Background()
	queued := func(fs *FairShareCounters, flows ...FairShareCharge) []int64 {
		t.Helper()
		f, err := fs.Exchange(ctx, "m", nil, flows)
		if err != nil {
			t.Fatal(err)
		}
		return f.Queued
	}
	if got := queued(a, FairShareCharge{Tenant: "heavy", Class: 1, Queued: 30}, FairShareCharge{Tenant: "light", Class: 1, Queued: 2}); !slices.Equal(got, []int64{30, 2}) {
		t.Fatalf("A's first exchange: queued %v, want [30 2]", got)
	}
	key := "usher:fair:{" + idHash("m") + "}:1:" + idHash("heavy") + ":queued"
	for field, v := range map[string]string{"junk": "many 1", "huge": "99999999999 1"} {
		if err := rdb.HSet(ctx, key, field, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := queued(b, FairShareCharge{Tenant: "heavy", Class: 1, Queued: 10}, FairShareCharge{Tenant: "heavy", Class: 2, Queued: 1}); !slices.Equal(got, []int64{40, 1}) {
		t.Fatalf("B's exchange: queued %v, want [40 1] (A's and B's of heavy in class 1)", got)
	}
	if n := rdb.HLen(ctx, key).Val(); n != 2 {
		t.Fatalf("heavy's hash of queued requests has %d fields, want A's and B's (%v)", n, rdb.HGetAll(ctx, key).Val())
	}
	if got := queued(a, FairShareCharge{Tenant: "heavy", Class: 1}); !slices.Equal(got, []int64{10}) {
		t.Fatalf("A sent none: queued %v, want B's 10", got)
	}
	time.Sleep(400 * time.Millisecond) // past FloorAge: B's no longer count
	if got := queued(a, FairShareCharge{Tenant: "heavy", Class: 1, Queued: 5}); !slices.Equal(got, []int64{5}) {
		t.Fatalf("B's are old: queued %v, want A's 5", got)
	}
	if _, err := a.Exchange(ctx, "m", nil, []FairShareCharge{{Tenant: "t", Queued: -1}}); err == nil {
		t.Error("a negative Queued: got no error, want a refusal")
	}
}
