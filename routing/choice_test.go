package routing

import (
	"context"
	"testing"
)

// A pick's Eligible is the request's own test and every protection's filter: without
// protections it is Request.Eligible; each protection in force refuses what its filter refuses.
func TestChoiceEligible(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(4, "m")})
	ws := modelWorkers(t, p, "m")
	ws[1].interactivePrefills.Store(1)
	ws[2].prefill.tokens.Store(500)
	r := &Request{Model: "m", PromptTokens: 100, Tokens: 200, Exclude: []string{"w0"}}
	for _, tt := range []struct {
		name string
		c    choice
		want []bool // per worker w0..w3
	}{
		{"no protection: the request's test", choice{Request: r}, []bool{false, true, true, true}},
		{"retry-skip list", choice{Request: r, full: []string{"w3"}}, []bool{false, true, true, false}},
		{"prefill budget", choice{Request: r, prefillBudget: 512}, []bool{false, true, false, true}},
		{"spread off interactive prompts", choice{Request: r, spread: true}, []bool{false, false, true, true}},
	} {
		for i, w := range ws {
			if got := tt.c.Eligible(w); got != tt.want[i] {
				t.Errorf("%s: %s eligible %v, want %v", tt.name, w.ID(), got, tt.want[i])
			}
			if got, req := (&choice{Request: r}).Eligible(w), r.Eligible(w); got != req {
				t.Errorf("no protection: %s eligible %v, Request.Eligible %v", w.ID(), got, req)
			}
		}
	}
}

// Every policy skips what a protection filters: with the prefill budget in force (interactive
// traffic present), a batch request goes only to the worker with room in it, whatever the
// policy.
func TestPoliciesSkipWhatAProtectionFilters(t *testing.T) {
	for _, name := range conformancePolicies() {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Policy: name, Workers: testWorkers(3, "m")}
			cfg.Concurrency.LowerPrefillTokens = 512
			cfg.Concurrency.PrefillPieceTokens = -1
			p, _ := newTestPool(t, cfg)
			k := picker{t: t, p: p, model: "m"}
			k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Release(Outcome{})
			ws := modelWorkers(t, p, "m")
			ws[0].prefill.tokens.Store(500)
			ws[2].prefill.tokens.Store(500)
			for i, r := range conformanceRequests(40) {
				r.PromptTokens = 100
				p.Prepare(context.Background(), r)
				l, err := p.Pick(context.Background(), r)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				l.Release(Outcome{})
				if id := l.Worker.ID(); id != "w1" {
					t.Fatalf("request %d went to %s, whose prefill budget is spent; want w1", i, id)
				}
			}
		})
	}
}
