package routing

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// Pick never writes to the caller's Request: not while interactive requests are present (the
// prefill budget, pieces, the spreading of interactive prompts are the pick's own), not for a
// prepared request, nor for one not prepared; every policy.
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

// ioCounts is every I/O a pool's policies made: pin store calls and /tokenize requests.
type ioCounts struct{ gets, claims, others, tokenize int32 }

// TestPickDoesNoIO: Pick runs under the gateway queue's lock, where no I/O may be. For every
// policy, and sticky_session over kv_aware, Prepare asks what the policy needs once (a new pin:
// one Get and one Claim; kv_aware: one /tokenize) and Pick asks nothing, of the pin store or of a
// worker, whether the request was prepared or not. A request not prepared is routed as though
// that I/O had failed: hashed on its key (sticky_session, manual), as cache_aware (kv_aware).
func TestPickDoesNoIO(t *testing.T) {
	type tc struct{ name, policy, fallback string }
	var cases []tc
	for _, name := range conformancePolicies() {
		cases = append(cases, tc{name, name, ""})
	}
	cases = append(cases, tc{"sticky_session over kv_aware", "sticky_session", "kv_aware"})
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			specs, tokenize := tokenizingWorkers(t, 3)
			pins := &countingPins{PinStore: NewMemoryPinStore(nil, 0)}
			p, _ := newTestPoolWith(t, Config{Workers: specs, CacheScope: CacheScopeGlobal, Models: map[string]ModelConfig{
				"m": {Policy: tt.policy, StickySession: StickySessionConfig{Fallback: tt.fallback}}}}, Options{Pins: pins})
			kv, _ := p.policies[policyKey{"m", StageWhole}].Policy.(*KVAware)
			if s, ok := p.policies[policyKey{"m", StageWhole}].Policy.(*StickySession); ok {
				kv, _ = s.fallback.(*KVAware)
			}
			if kv != nil {
				kv.workers["w0"].live.Store(true) // w0 publishes events: kv_aware tokenizes
			}
			io := func() ioCounts {
				return ioCounts{pins.gets.Load(), pins.claims.Load(), pins.others.Load(), tokenize.Load()}
			}
			pinning := tt.policy == "sticky_session" || tt.policy == "manual"
			pickNoIO := func(what string, r *Request) Route {
				t.Helper()
				before := io()
				l, err := p.Pick(context.Background(), r)
				if err != nil {
					t.Fatalf("%s: %v", what, err)
				}
				l.Release(Outcome{})
				if got := io(); got != before {
					t.Fatalf("%s: Pick did I/O: got %+v after, %+v before", what, got, before)
				}
				return l.Route
			}

			unprepared := &Request{Model: "m", Tenant: "t", SessionID: "s", RoutingKey: "k", Prompt: "the prompt", Tokens: 10}
			route := pickNoIO("a request not prepared", unprepared)
			if pinning && route != RouteHash && route != RouteSpill {
				t.Errorf("a request not prepared: route %q, want %q or %q (hashed on its key, as without the pin store)", route, RouteHash, RouteSpill)
			}
			if strings.HasPrefix(string(route), "kv_") {
				t.Errorf("a request not prepared: route %q, want cache_aware's (no token ids)", route)
			}

			r := &Request{Model: "m", Tenant: "t", SessionID: "s", RoutingKey: "k", Prompt: "the prompt", Tokens: 10}
			p.Prepare(context.Background(), r)
			var want ioCounts
			if pinning {
				want.gets, want.claims = 1, 1
			}
			if kv != nil {
				want.tokenize = 1
			}
			if got := io(); got != want {
				t.Fatalf("Prepare of a new key: got I/O %+v, want %+v", got, want)
			}
			for i := range 3 {
				route := pickNoIO(fmt.Sprintf("prepared request, pick %d", i), r)
				if pinning && route != RouteAssigned {
					t.Errorf("prepared request, pick %d: route %q, want %q (the pin Prepare made)", i, route, RouteAssigned)
				}
			}
		})
	}
}
