package routing

import (
	"context"
	"math/rand/v2"
	"testing"
)

func TestRoundRobin(t *testing.T) {
	tests := []struct {
		name    string
		down    []int    // workers marked unhealthy
		exclude []string // Request.Exclude
		want    []string // IDs of successive picks ("" for none)
	}{
		{name: "in turn", want: []string{"w0", "w1", "w2", "w0", "w1"}},
		{name: "skips unhealthy", down: []int{1}, want: []string{"w0", "w2", "w2", "w0"}},
		{name: "skips excluded", exclude: []string{"w0"}, want: []string{"w1", "w1", "w2", "w1"}},
		{name: "none eligible", down: []int{0, 1, 2}, want: []string{"", ""}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newTestPool(t, Config{Workers: testWorkers(3, "m")})
			ws := modelWorkers(t, p, "m")
			for _, i := range tt.down {
				markDown(ws[i])
			}
			rr := &RoundRobin{}
			r := &Request{Model: "m", Exclude: tt.exclude}
			for i, want := range tt.want {
				w, route := rr.Pick(context.Background(), choice{Request: r}, ws)
				if got := idOf(w); got != want {
					t.Errorf("pick %d: got %q, want %q", i, got, want)
				}
				if route != RouteRoundRobin {
					t.Errorf("pick %d: got route %q, want %q", i, route, RouteRoundRobin)
				}
			}
		})
	}
	if w, _ := (&RoundRobin{}).Pick(context.Background(), choice{Request: &Request{}}, nil); w != nil {
		t.Errorf("empty pool: got %q, want nil", w.ID())
	}
}

func TestRandomIsUniformOverEligible(t *testing.T) {
	tests := []struct {
		name string
		down []int
		want map[string]bool // the workers that may be picked
	}{
		{name: "all eligible", want: map[string]bool{"w0": true, "w1": true, "w2": true, "w3": true}},
		{name: "most down", down: []int{0, 1, 2}, want: map[string]bool{"w3": true}},
		{name: "none eligible", down: []int{0, 1, 2, 3}, want: map[string]bool{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := newTestPool(t, Config{Workers: testWorkers(4, "m")})
			ws := modelWorkers(t, p, "m")
			for _, i := range tt.down {
				markDown(ws[i])
			}
			pol := &Random{rand: &lockedRand{src: rand.NewPCG(3, 4)}}
			counts := map[string]int{}
			const picks = 4000
			for range picks {
				w, route := pol.Pick(context.Background(), choice{Request: &Request{Model: "m"}}, ws)
				if route != RouteRandom {
					t.Fatalf("got route %q, want %q", route, RouteRandom)
				}
				counts[idOf(w)]++
			}
			if len(tt.want) == 0 {
				if counts[""] != picks {
					t.Fatalf("got picks %v, want only nil", counts)
				}
				return
			}
			for id, n := range counts {
				if !tt.want[id] {
					t.Errorf("got %d picks of %q, want none", n, id)
				}
			}
			for id := range tt.want {
				share := float64(counts[id]) / picks
				if want := 1 / float64(len(tt.want)); share < want*0.85 || share > want*1.15 {
					t.Errorf("worker %s: got share %.3f, want about %.3f", id, share, want)
				}
			}
		})
	}
}

func TestLeastRequest(t *testing.T) {
	tests := []struct {
		name     string
		inFlight []int64
		down     []int
		exclude  []string
		want     string
	}{
		{name: "fewest in flight", inFlight: []int64{3, 1, 2}, want: "w1"},
		{name: "skips unhealthy lighter", inFlight: []int64{3, 0, 2}, down: []int{1}, want: "w2"},
		{name: "skips excluded lighter", inFlight: []int64{3, 0, 2}, exclude: []string{"w1"}, want: "w2"},
		{name: "skips full worker", inFlight: []int64{4, 4, 4}, want: ""},
		{name: "none eligible", inFlight: []int64{0, 0, 0}, down: []int{0, 1, 2}, want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Workers: testWorkers(3, "m"), MaxConcurrency: 4}
			p, _ := newTestPool(t, cfg)
			ws := modelWorkers(t, p, "m")
			for i, n := range tt.inFlight {
				ws[i].inFlight.Store(n)
			}
			for _, i := range tt.down {
				markDown(ws[i])
			}
			pol := &LeastRequest{rand: runtimeRand{}}
			w, route := pol.Pick(context.Background(), choice{Request: &Request{Model: "m", Exclude: tt.exclude}}, ws)
			if got := idOf(w); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if route != RouteLeastRequest {
				t.Errorf("got route %q, want %q", route, RouteLeastRequest)
			}
		})
	}
}

func TestLeastRequestSpreadsTies(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(3, "m")})
	ws := modelWorkers(t, p, "m")
	pol := &LeastRequest{rand: &lockedRand{src: rand.NewPCG(5, 6)}}
	seen := map[string]bool{}
	for range 100 {
		w, _ := pol.Pick(context.Background(), choice{Request: &Request{Model: "m"}}, ws)
		seen[idOf(w)] = true
	}
	if len(seen) != 3 {
		t.Errorf("idle workers picked: got %v, want all three", seen)
	}
}

func TestEligible(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(w *Worker)
		tokens   int
		exclude  []string
		eligible bool
	}{
		{name: "fresh worker", setup: func(*Worker) {}, eligible: true},
		{name: "unhealthy", setup: markDown, eligible: false},
		{name: "draining", setup: func(w *Worker) { w.draining.Store(true) }, eligible: false},
		{name: "excluded", setup: func(*Worker) {}, exclude: []string{"x", "w0"}, eligible: false},
		{name: "at request cap", setup: func(w *Worker) { w.inFlight.Store(2) }, eligible: false},
		{name: "token cap exceeded", setup: func(w *Worker) { w.inFlight.Store(1); w.inFlightTokens.Store(900) }, tokens: 200, eligible: false},
		{name: "token cap met", setup: func(w *Worker) { w.inFlight.Store(1); w.inFlightTokens.Store(800) }, tokens: 200, eligible: true},
		{name: "idle worker takes an oversize request", setup: func(*Worker) {}, tokens: 5000, eligible: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			specs := testWorkers(1, "m")
			specs[0].MaxConcurrency, specs[0].MaxTokensInFlight = 2, 1000
			p, _ := newTestPool(t, Config{Workers: specs})
			w := modelWorkers(t, p, "m")[0]
			tt.setup(w)
			r := &Request{Model: "m", Tokens: tt.tokens, Exclude: tt.exclude}
			if got := r.Eligible(w); got != tt.eligible {
				t.Errorf("got %v, want %v", got, tt.eligible)
			}
		})
	}
}

func idOf(w *Worker) string {
	if w == nil {
		return ""
	}
	return w.ID()
}
