package routing

import (
	"context"
	"reflect"
	"testing"
)

// Pick never writes to the caller's Request: not while interactive requests are present (the
// prefill budget, pieces, steering away from whole prompts are the pick's own), not for a
// prepared request, nor for one it prepares itself; every policy.
func TestPickNeverModifiesTheRequest(t *testing.T) {
	for _, name := range conformancePolicies() {
		t.Run(name, func(t *testing.T) {
			cfg := Config{Policy: name, Workers: testWorkers(3, "m")}
			cfg.Concurrency.PrefillPieceTokens = 64
			p, _ := newTestPool(t, cfg)
			k := picker{t: t, p: p, model: "m"}
			// Interactive traffic present, and a whole long prompt in prefill on one worker.
			k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Release(Outcome{})
			whole := k.pick("a long batch prompt", Request{PromptTokens: 4000, TargetWorker: "w0"})
			defer whole.Release(Outcome{})
			for _, prepared := range []bool{false, true} {
				for i, r := range conformanceRequests(24) {
					r.Interactive = i%2 == 0
					r.Exclude = []string{"w2"}
					if prepared {
						p.Prepare(context.Background(), r)
					}
					before := *r
					before.Exclude = append([]string(nil), r.Exclude...)
					l, err := p.Pick(context.Background(), r)
					if err != nil {
						t.Fatalf("request %d: %v", i, err)
					}
					l.Release(Outcome{})
					if !reflect.DeepEqual(*r, before) {
						t.Fatalf("request %d (prepared %v): Pick changed it\n got %+v\nwant %+v", i, prepared, *r, before)
					}
				}
			}
		})
	}
}

// A retry is prepared again (a pin to the failed worker moves then) but keeps the token ids the
// first Prepare asked for: one /tokenize per request.
func TestPrepareAgainKeepsTheTokenIDs(t *testing.T) {
	p, asked := newTokenizingPool(t)
	r := &Request{Model: "m", Prompt: "p", Tokens: 10}
	p.Prepare(context.Background(), r)
	r.Exclude = append(r.Exclude, "w0")
	p.Prepare(context.Background(), r)
	if n := asked.Load(); n != 1 {
		t.Errorf("two Prepares of one request asked /tokenize %d times, want once", n)
	}
	if got := r.Prepared.tokens; len(got) != 8 {
		t.Errorf("prepared token ids %v, want the 8 asked", got)
	}
}
