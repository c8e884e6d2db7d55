package routing

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

func TestPowerOfTwo(t *testing.T) {
	clock := newFakeClock()
	tests := []struct {
		name    string
		tokens  [2]int64 // in flight per worker
		waiting [2]int64 // reported queue per worker
		stale   [2]bool  // report older than MaxAge
		want    string
	}{
		{name: "fewer tokens in flight", tokens: [2]int64{5000, 100}, want: "w1"},
		{name: "reported queue weighs in", tokens: [2]int64{100, 500}, waiting: [2]int64{3, 0}, want: "w1"},
		{name: "stale report counts as busy", tokens: [2]int64{100, 900}, stale: [2]bool{true, false}, want: "w1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs := testWorkers(2, "m")
			for i := range specs {
				specs[i].MaxConcurrency, specs[i].MaxTokensInFlight = 10, 10000
			}
			p, _ := newTestPool(t, Config{Workers: specs})
			ws := modelWorkers(t, p, "m")
			for i, w := range ws {
				w.inFlightTokens.Store(tt.tokens[i])
				at := clock.Now()
				if tt.stale[i] {
					at = at.Add(-time.Minute)
				}
				w.load.store(LoadReport{Waiting: tt.waiting[i], At: at})
			}
			pol := &PowerOfTwo{rand: &lockedRand{src: rand.NewPCG(1, 1)}, now: clock.Now, maxAge: 6 * time.Second}
			for range 20 {
				w, route := pol.Pick(context.Background(), choice{Request: &Request{Model: "m"}}, ws)
				if idOf(w) != tt.want || route != RoutePowerOfTwo {
					t.Fatalf("got %s by %q, want %s by %q", idOf(w), route, tt.want, RoutePowerOfTwo)
				}
			}
		})
	}
}

func TestLengthBin(t *testing.T) {
	tests := []struct{ n, want int }{
		{-1, 0}, {0, 0}, {3, 3}, {4, 4}, {7, 7}, {8, 8}, {11, 9}, {15, 11}, {16, 12}, {1 << 40, numLengthBins - 1},
	}
	for _, tt := range tests {
		if got := lengthBin(tt.n); got != tt.want {
			t.Errorf("lengthBin(%d): got %d, want %d", tt.n, got, tt.want)
		}
	}
	for n := 1; n < 1<<20; n = n*5/4 + 1 {
		if lengthBin(n) > lengthBin(n+1) {
			t.Fatalf("lengthBin not monotonic at %d", n)
		}
	}
}

func TestBucketOwnsLengthRanges(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "bucket", Workers: testWorkers(4, "m")})
	pol := p.snap.Load().models["m"].policy.(*Bucket)
	ws := modelWorkers(t, p, "m")
	// Recent load: a quarter of the tokens in each of four length bands.
	lengths := []int{100, 1000, 4000, 16000}
	for _, n := range lengths {
		pol.load[lengthBin(n)].Store(1000)
	}
	pol.recut()
	owner := map[int]string{}
	for _, n := range lengths {
		w, route := pol.Pick(context.Background(), choice{Request: &Request{Model: "m", PromptTokens: n}}, ws)
		if route != RouteBucket {
			t.Fatalf("length %d: got route %q, want %q", n, route, RouteBucket)
		}
		owner[n] = idOf(w)
	}
	if got := len(map[string]bool{owner[100]: true, owner[1000]: true, owner[4000]: true, owner[16000]: true}); got != 4 {
		t.Errorf("owners of four equal bands: got %v, want four different workers", owner)
	}
	for i := 1; i < len(lengths); i++ {
		if owner[lengths[i-1]] >= owner[lengths[i]] {
			t.Errorf("owners: got %v, want longer prompts on later workers", owner)
		}
	}
	// The decay halved the recorded load.
	if got := pol.load[lengthBin(100)].Load(); got != 500+int64(100) {
		t.Errorf("load after a re-cut and one pick: got %d, want 600", got)
	}
}

func TestBucketSharesAHeavyBin(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "bucket", Workers: testWorkers(3, "m")})
	pol := p.snap.Load().models["m"].policy.(*Bucket)
	ws := modelWorkers(t, p, "m")
	pol.load[lengthBin(500)].Store(1 << 20)
	pol.recut()
	seen := map[string]bool{}
	for range 60 {
		w, _ := pol.Pick(context.Background(), choice{Request: &Request{Model: "m", PromptTokens: 500}}, ws)
		seen[idOf(w)] = true
	}
	if len(seen) != 3 {
		t.Errorf("all load in one bin: got owners %v, want all three workers", seen)
	}
}

func TestBucketFallsBackWhenOwnerIsLoaded(t *testing.T) {
	cfg := Config{Policy: "bucket", Workers: testWorkers(2, "m"), Models: map[string]ModelConfig{"m": {Bucket: BucketConfig{BalanceAbs: 2, BalanceRel: 2}}}}
	p, _ := newTestPool(t, cfg)
	pol := p.snap.Load().models["m"].policy.(*Bucket)
	ws := modelWorkers(t, p, "m")
	owner, _ := pol.Pick(context.Background(), choice{Request: &Request{Model: "m", PromptTokens: 10}}, ws)
	other := ws[0]
	if other == owner {
		other = ws[1]
	}
	tests := []struct {
		name         string
		owner, other int64
		want         *Worker
		route        Route
	}{
		{name: "owner under the absolute bound", owner: 2, other: 0, want: owner, route: RouteBucket},
		{name: "owner within the relative bound", owner: 6, other: 3, want: owner, route: RouteBucket},
		{name: "owner above both", owner: 7, other: 3, want: other, route: RouteLoadFallback},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			owner.inFlight.Store(tt.owner)
			other.inFlight.Store(tt.other)
			w, route := pol.Pick(context.Background(), choice{Request: &Request{Model: "m", PromptTokens: 10}}, ws)
			if w != tt.want || route != tt.route {
				t.Errorf("got %s by %q, want %s by %q", idOf(w), route, idOf(tt.want), tt.route)
			}
		})
	}
}
