package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"
)

// conformancePolicies lists every registered policy, so a policy added to the package is held to
// the contract without touching this file.
func conformancePolicies() []string {
	names := make([]string, 0, len(policyConstructors))
	for n := range policyConstructors {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// conformanceRequests vary every field a policy may key on.
func conformanceRequests(n int) []*Request {
	rs := make([]*Request, n)
	for i := range rs {
		rs[i] = &Request{
			Model:        "m",
			Tenant:       fmt.Sprintf("t%d", i%3),
			PromptTokens: 10 + i*37%4000,
			Tokens:       50 + i*37%4000,
			Prompt:       fmt.Sprintf("system prompt %d shared by a group; user turn %d", i%5, i),
		}
		switch i % 4 {
		case 1:
			rs[i].SessionID = fmt.Sprintf("s%d", i%7)
		case 2:
			rs[i].RoutingKey = fmt.Sprintf("k%d", i%11)
		case 3:
			rs[i].SessionID, rs[i].RoutingKey = fmt.Sprintf("s%d", i%7), fmt.Sprintf("k%d", i%11)
		}
	}
	return rs
}

// conformancePool has 8 workers of model m (w0..w7) and 2 of model n (n0, n1).
func conformancePool(t *testing.T, policy string) *Pool {
	t.Helper()
	specs := testWorkers(8, "m")
	specs = append(specs,
		WorkerSpec{ID: "n0", URL: "http://127.0.0.1:901", Models: []string{"n"}},
		WorkerSpec{ID: "n1", URL: "http://127.0.0.1:902", Models: []string{"n"}})
	p, _ := newTestPool(t, Config{Policy: policy, Workers: specs})
	return p
}

func TestPolicyConformance(t *testing.T) {
	for _, name := range conformancePolicies() {
		t.Run(name, func(t *testing.T) {
			t.Run("never picks an unhealthy, draining, full, circuit-open or excluded worker, nor one of another model", func(t *testing.T) {
				p := conformancePool(t, name)
				ws := modelWorkers(t, p, "m")
				markDown(ws[1])
				ws[2].draining.Store(true)
				ws[3].inFlight.Store(ws[3].MaxConcurrency())
				markDown(ws[6])
				ws[7].breaker.openUntil.Store(time.Now().Add(time.Hour).UnixNano())
				for i, r := range conformanceRequests(400) {
					r.Exclude = []string{"w4"}
					p.Prepare(context.Background(), r)
					l, err := p.Pick(context.Background(), r)
					if err != nil {
						t.Fatalf("request %d: got %v, want a lease (w0 and w5 are eligible)", i, err)
					}
					if id := l.Worker.ID(); id != "w0" && id != "w5" {
						t.Fatalf("request %d: got %s, want w0 or w5", i, id)
					}
					if !slices.Contains(l.Worker.Models(), "m") {
						t.Fatalf("request %d: got worker %s of models %v, want one serving m", i, l.Worker.ID(), l.Worker.Models())
					}
					l.Release(Outcome{})
				}
			})
			t.Run("empty and all-ineligible pools give nil", func(t *testing.T) {
				p := conformancePool(t, name)
				pol := p.snap.Load().models["m"].policy
				for _, r := range conformanceRequests(20) {
					if w, _ := pol.Pick(context.Background(), choice{Request: r}, nil); w != nil {
						t.Fatalf("empty pool: got %s, want nil", w.ID())
					}
				}
				ws := modelWorkers(t, p, "m")
				for _, w := range ws {
					markDown(w)
				}
				for _, r := range conformanceRequests(20) {
					if w, _ := pol.Pick(context.Background(), choice{Request: r}, ws); w != nil {
						t.Fatalf("all unhealthy: got %s, want nil", w.ID())
					}
				}
			})
			t.Run("safe for concurrent use", func(t *testing.T) {
				p := conformancePool(t, name)
				ws := modelWorkers(t, p, "m")
				reqs := conformanceRequests(200)
				var wg sync.WaitGroup
				for g := range 8 {
					wg.Go(func() {
						rnd := rand.New(rand.NewPCG(uint64(g), 7))
						for i := range 300 {
							if g == 0 && i%10 == 0 {
								w := ws[rnd.IntN(len(ws))]
								w.health.Store(int32(healthUp))
								if rnd.IntN(2) == 0 {
									markDown(w)
								}
								continue
							}
							r := *reqs[rnd.IntN(len(reqs))]
							p.Prepare(context.Background(), &r)
							l, err := p.Pick(context.Background(), &r)
							if err != nil {
								continue
							}
							if !slices.Contains(l.Worker.Models(), "m") {
								t.Errorf("got worker %s not serving m", l.Worker.ID())
							}
							l.Release(Outcome{PromptTokens: r.PromptTokens, CachedTokens: r.PromptTokens / 2})
						}
					})
				}
				wg.Wait()
				for _, w := range ws {
					if w.InFlight() != 0 {
						t.Errorf("worker %s: got %d in flight after all releases, want 0", w.ID(), w.InFlight())
					}
				}
			})
		})
	}
}
