package routing

import (
	"context"
	"fmt"
	"testing"
)

func TestConsistentHashSticksToKey(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "consistent_hash", Workers: testWorkers(5, "m")})
	tests := []struct {
		name string
		req  Request
	}{
		{name: "routing key", req: Request{Model: "m", Tenant: "t", RoutingKey: "k1", SessionID: "s1"}},
		{name: "session", req: Request{Model: "m", Tenant: "t", SessionID: "s1"}},
		{name: "tenant", req: Request{Model: "m", Tenant: "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var first string
			for i := range 20 {
				l, err := p.Pick(context.Background(), &tt.req)
				if err != nil {
					t.Fatal(err)
				}
				l.Release(Outcome{})
				if i == 0 {
					first = l.Worker.ID()
				}
				if l.Worker.ID() != first || l.Route != RouteHash {
					t.Fatalf("pick %d: got %s by %q, want %s by %q", i, l.Worker.ID(), l.Route, first, RouteHash)
				}
			}
		})
	}
	l, err := p.Pick(context.Background(), &Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	l.Release(Outcome{})
	if l.Route != RouteLeastRequest {
		t.Errorf("request without a key: got route %q, want %q", l.Route, RouteLeastRequest)
	}
}

// assignKeys maps keys 0..n-1 to workers through the pool, releasing each lease at once.
func assignKeys(t *testing.T, p *Pool, n int, req func(i int) *Request) map[int]string {
	t.Helper()
	got := make(map[int]string, n)
	for i := range n {
		l, err := p.Pick(context.Background(), req(i))
		if err != nil {
			t.Fatal(err)
		}
		got[i] = l.Worker.ID()
		l.Release(Outcome{})
	}
	return got
}

func TestRingMovesFewKeys(t *testing.T) {
	const keys = 10000
	tests := []struct {
		policy string
		req    func(i int) *Request
	}{
		{policy: "consistent_hash", req: func(i int) *Request { return &Request{Model: "m", Tenant: "t", RoutingKey: fmt.Sprint("key-", i)} }},
		{policy: "prefix_hash", req: func(i int) *Request {
			return &Request{Model: "m", Prompt: fmt.Sprintf("system prompt number %d then the user question", i)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			p, _ := newTestPool(t, Config{Policy: tt.policy, Workers: testWorkers(10, "m")})
			before := assignKeys(t, p, keys, tt.req)
			if err := p.Add(WorkerSpec{ID: "new", URL: "http://127.0.0.1:99", Models: []string{"m"}}); err != nil {
				t.Fatal(err)
			}
			joined := assignKeys(t, p, keys, tt.req)
			moved, toNew := 0, 0
			for i := range keys {
				if joined[i] != before[i] {
					moved++
					if joined[i] == "new" {
						toNew++
					}
				}
			}
			// A fair share for the 11th worker is 1/11 of the keys, about 909.
			if moved != toNew || moved < keys/11/2 || moved > keys/11*2 {
				t.Errorf("worker joined: got %d keys moved (%d to it), want about %d, all to it", moved, toNew, keys/11)
			}
			if err := p.Remove("w3"); err != nil {
				t.Fatal(err)
			}
			left := assignKeys(t, p, keys, tt.req)
			moved = 0
			for i := range keys {
				if left[i] != joined[i] {
					moved++
					if joined[i] != "w3" {
						t.Fatalf("worker left: key %d moved from %s, want only w3's keys to move", i, joined[i])
					}
				}
			}
			if moved < keys/10/2 || moved > keys/10*2 {
				t.Errorf("worker left: got %d keys moved, want about %d", moved, keys/10)
			}
		})
	}
}

func TestRingBoundedLoadSpills(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "consistent_hash", Workers: testWorkers(4, "m")})
	r := &Request{Model: "m", Tenant: "t", RoutingKey: "hot"}
	var leases []*Lease
	counts := map[string]int{}
	routes := map[Route]int{}
	for range 40 {
		l, err := p.Pick(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		counts[l.Worker.ID()]++
		routes[l.Route]++
	}
	// capacity = ceil(1.25 x (in flight + 1) / 4): no worker ends far above the mean of 10.
	for id, n := range counts {
		if n > 13 {
			t.Errorf("worker %s: got %d of 40 in flight, want at most ceil(1.25 x 40 / 4) = 13", id, n)
		}
	}
	if routes[RouteSpill] == 0 || routes[RouteHash] == 0 {
		t.Errorf("routes: got %v, want both hash and spill", routes)
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

func TestPrefixHash(t *testing.T) {
	system := "you are a helpful assistant who answers in french "
	tests := []struct {
		name      string
		a, b      string
		prefixLen int
		same      bool
	}{
		{name: "shared prefix, different tails", a: system + "what is a cat", b: system + "how tall is mont blanc", prefixLen: 8, same: true},
		{name: "whitespace differences inside the prefix matter", a: "a  b c d", b: "a b c d", prefixLen: 2, same: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Policy: "prefix_hash", Workers: testWorkers(16, "m"), Models: map[string]ModelConfig{"m": {PrefixHash: PrefixHashConfig{PrefixTokens: tt.prefixLen}}}}
			p, _ := newTestPool(t, cfg)
			got := assignKeys(t, p, 2, func(i int) *Request { return &Request{Model: "m", Prompt: []string{tt.a, tt.b}[i]} })
			if (got[0] == got[1]) != tt.same {
				t.Errorf("got workers %s and %s, want same=%v", got[0], got[1], tt.same)
			}
		})
	}
}

func TestLeadingTokens(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{s: "a b c d", n: 2, want: "a b"},
		{s: "  a\tb\nc", n: 2, want: "  a\tb"},
		{s: "a b", n: 5, want: "a b"},
		{s: "", n: 3, want: ""},
		{s: "one", n: 1, want: "one"},
	}
	for _, tt := range tests {
		if got := leadingTokens(tt.s, tt.n); got != tt.want {
			t.Errorf("leadingTokens(%q, %d): got %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func TestPrefixHashSpillsWhenSaturated(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "prefix_hash", Workers: testWorkers(8, "m")})
	r := &Request{Model: "m", Prompt: "the same long system prompt for everyone"}
	var leases []*Lease
	seen := map[string]bool{}
	for range 16 {
		l, err := p.Pick(context.Background(), r)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		seen[l.Worker.ID()] = true
	}
	// Spill walks the ring from the same point, so the prefix stays on a few workers.
	if len(seen) < 2 || len(seen) > 8 {
		t.Errorf("16 concurrent requests of one prefix: got %d workers, want a spill to a few", len(seen))
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// Issue 10, item 3: with one of three workers drained, the bounded load of consistent_hash (and
// of sticky_session's fallback) counted the drained worker in the mean, so every working worker
// looked overloaded and 480 of 600 requests got no worker while slots were free. Every request
// with room somewhere gets a worker.
func TestBoundedLoadCountsOnlyWorkersThatTakeRequests(t *testing.T) {
	cfg := Config{Policy: "consistent_hash", Workers: testWorkers(3, "m"), MaxConcurrency: 32}
	p, _ := newTestPool(t, cfg)
	if err := p.Drain(context.Background(), "w2"); err != nil {
		t.Fatal(err)
	}
	var leases []*Lease
	for i := range 60 {
		l, err := p.Pick(context.Background(), &Request{Model: "m", Tenant: "t", RoutingKey: fmt.Sprintf("k%d", i%7)})
		if err != nil {
			t.Fatalf("request %d with %d in flight on 2 workers of 32 slots: %v", i, len(leases), err)
		}
		if l.Worker.ID() == "w2" {
			t.Fatalf("request %d went to the drained worker", i)
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}
