package routing

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// disaggWorkers are w0, w1 of role prefill, w2, w3 of role decode and w4 of role both, all
// serving model "m".
func disaggWorkers() []WorkerSpec {
	specs := testWorkers(5, "m")
	for i, r := range []Role{RolePrefill, RolePrefill, RoleDecode, RoleDecode, ""} {
		specs[i].Role = r
	}
	return specs
}

func TestDisaggregationConfigIsValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		want string // "" for valid
	}{
		{"roles and defaults", func(c *Config) {}, ""},
		{"stage policies and protocol", func(c *Config) {
			c.Disaggregation = DisaggregationConfig{PrefillPolicy: "bucket", DecodePolicy: "least_request", Protocol: ProtocolSGLang}
		}, ""},
		{"unknown role", func(c *Config) { c.Workers[0].Role = "prefiller" }, `routing.workers[0].role: must be prefill, decode or both, got "prefiller"`},
		{"unknown prefill policy", func(c *Config) { c.Disaggregation.PrefillPolicy = "fastest" },
			`routing.disaggregation.prefill_policy: unknown policy "fastest"`},
		{"pins cannot route a stage", func(c *Config) { c.Disaggregation.DecodePolicy = "sticky_session" },
			`routing.disaggregation.decode_policy: sticky_session pins a key to one worker`},
		{"unknown protocol", func(c *Config) { c.Disaggregation.Protocol = "nixl" },
			`routing.disaggregation.protocol: must be vllm or sglang, got "nixl"`},
		{"per model", func(c *Config) {
			c.Models = map[string]ModelConfig{"m": {Disaggregation: DisaggregationConfig{PrefillPolicy: "manual"}}}
		}, `routing.models["m"].disaggregation.prefill_policy: manual pins`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Workers: disaggWorkers()}
			tc.edit(&c)
			c.SetDefaults()
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("got %v, want valid", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
	var c Config
	c.SetDefaults()
	if d := c.Disaggregation; d.PrefillPolicy != "cache_aware" || d.DecodePolicy != "power_of_two" || d.Protocol != ProtocolVLLM {
		t.Fatalf("defaults: got %+v, want cache_aware, power_of_two, vllm", d)
	}
}

// A model is disaggregated only with a prefill and a decode worker; each stage picks in its own
// pool with its own policy, and whole requests go to the workers of role both.
func TestStagesPickInTheirOwnPools(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: disaggWorkers(), Models: map[string]ModelConfig{
		"m": {Disaggregation: DisaggregationConfig{PrefillPolicy: "round_robin"}}}})
	proto, ok := p.Disaggregated("m")
	if !ok || proto != ProtocolVLLM {
		t.Fatalf("Disaggregated: got %q, %v; want vllm, true", proto, ok)
	}
	ms := p.snap.Load().models["m"]
	if ms.prefill.policyName != "round_robin" || ms.decode.policyName != "power_of_two" {
		t.Fatalf("stage policies: got %s and %s, want round_robin (the model's) and power_of_two (the default)", ms.prefill.policyName, ms.decode.policyName)
	}
	ctx := context.Background()
	prefillOn, decodeOn := map[string]int{}, map[string]int{}
	for range 12 {
		pre, dec, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 11},
			&Request{Model: "m", Stage: StageDecode, Tokens: 100})
		if err != nil {
			t.Fatal(err)
		}
		prefillOn[pre.Worker.ID()]++
		decodeOn[dec.Worker.ID()]++
		pre.Release(Outcome{})
		dec.Release(Outcome{})
	}
	for id := range prefillOn {
		if id != "w0" && id != "w1" && id != "w4" {
			t.Errorf("a prefill went to %s, not a prefill or both worker", id)
		}
	}
	for id := range decodeOn {
		if id != "w2" && id != "w3" && id != "w4" {
			t.Errorf("a decode went to %s, not a decode or both worker", id)
		}
	}
	for range 4 {
		l, err := p.Pick(ctx, &Request{Model: "m", Tokens: 10})
		if err != nil || l.Worker.ID() != "w4" {
			t.Fatalf("whole request: got %v, %v; want w4, the worker of role both", l, err)
		}
		l.Release(Outcome{})
	}
	// Without its decode workers the model is one pool again.
	for _, id := range []string{"w2", "w3"} {
		if err := p.Remove(id); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := p.Disaggregated("m"); ok {
		t.Fatal("no decode worker left: the model must not be disaggregated")
	}
	if _, err := p.Pick(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 1}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("prefill stage of a model that is not disaggregated: got %v, want ErrNoWorker", err)
	}
	seen := map[string]bool{}
	for range 6 {
		l, err := p.Pick(ctx, &Request{Model: "m", Tokens: 10})
		if err != nil {
			t.Fatal(err)
		}
		seen[l.Worker.ID()] = true
		l.Release(Outcome{})
	}
	if !seen["w0"] && !seen["w1"] {
		t.Fatalf("whole requests went to %v: the prefill workers serve the model whole again", seen)
	}
}

// PickStages holds nothing when a pool is full: the lease of the other stage is given back at
// once, and the error says the request may wait for room.
func TestPickStagesHoldsNothingWhenAPoolIsFull(t *testing.T) {
	specs := disaggWorkers()[:4]
	for i := range specs {
		specs[i].MaxConcurrency = 1
	}
	p, _ := newTestPool(t, Config{Workers: specs})
	ctx := context.Background()
	var decodes []*Lease
	for range 2 {
		_, dec, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 2}, &Request{Model: "m", Stage: StageDecode, Tokens: 2})
		if err != nil {
			t.Fatal(err)
		}
		decodes = append(decodes, dec) // the prefill leases stay held too
	}
	_, _, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 2}, &Request{Model: "m", Stage: StageDecode, Tokens: 2})
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("every worker full: got %v, want ErrNoRoom", err)
	}
	decodes[0].Release(Outcome{})
	// Room on a decode worker, none on the prefill workers: the decode lease taken must be
	// given back.
	_, _, err = p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, Tokens: 2}, &Request{Model: "m", Stage: StageDecode, Tokens: 2})
	if !errors.Is(err, ErrNoRoom) {
		t.Fatalf("prefill pool full: got %v, want ErrNoRoom", err)
	}
	var inFlight int64
	for _, w := range p.snap.Load().models["m"].decode.workers {
		inFlight += w.InFlight()
	}
	if inFlight != 1 {
		t.Fatalf("decode workers hold %d requests, want 1: the refused pick kept its decode lease", inFlight)
	}
}

// A target worker of the other stage does not refuse a stage's pick; one the model does not have
// does.
func TestStageTargetWorker(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: disaggWorkers()})
	ctx := context.Background()
	pre, dec, err := p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, TargetWorker: "w3", Tokens: 2},
		&Request{Model: "m", Stage: StageDecode, TargetWorker: "w3", Tokens: 2})
	if err != nil || dec.Worker.ID() != "w3" || pre.Worker.ID() == "w3" {
		t.Fatalf("target w3: got %v, %v, %v; want the decode on w3", pre, dec, err)
	}
	_, _, err = p.PickStages(ctx, &Request{Model: "m", Stage: StagePrefill, TargetWorker: "nope", Tokens: 2},
		&Request{Model: "m", Stage: StageDecode, TargetWorker: "nope", Tokens: 2})
	if !errors.Is(err, ErrUnknownWorker) {
		t.Fatalf("unknown target: got %v, want ErrUnknownWorker", err)
	}
}

// Without a worker of role both, a whole request of a vLLM-disaggregated model goes to any of
// its workers (which serves it in place), and one of an SGLang-disaggregated model to none.
func TestWholeRequestsWithoutBothWorkers(t *testing.T) {
	ctx := context.Background()
	p, _ := newTestPool(t, Config{Workers: disaggWorkers()[:4]})
	seen := map[string]bool{}
	for range 8 {
		l, err := p.Pick(ctx, &Request{Model: "m", Tokens: 10})
		if err != nil {
			t.Fatalf("vllm: %v", err)
		}
		seen[l.Worker.ID()] = true
		l.Release(Outcome{})
	}
	if len(seen) < 2 {
		t.Fatalf("vllm: whole requests went to %v, want the model's workers", seen)
	}
	p, _ = newTestPool(t, Config{Workers: disaggWorkers()[:4], Disaggregation: DisaggregationConfig{Protocol: ProtocolSGLang}})
	if _, err := p.Pick(ctx, &Request{Model: "m", Tokens: 10}); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("sglang: got %v, want ErrNoWorker", err)
	}
}

// With SGLang's flow a worker of role both serves whole requests only: its engine is not in a
// disaggregation mode.
func TestSGLangBothWorkersServeWholeRequestsOnly(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: disaggWorkers(), Disaggregation: DisaggregationConfig{Protocol: ProtocolSGLang}})
	ms := p.snap.Load().models["m"]
	for _, set := range []*modelSet{ms.prefill, ms.decode} {
		if set.byID["w4"] != nil {
			t.Fatalf("w4, of role both, is in a stage's pool: %v", set.workers)
		}
	}
	if ms.byID["w4"] == nil || len(ms.workers) != 1 {
		t.Fatalf("whole requests go to %v, want w4", ms.workers)
	}
}

// placeStages places both stages of a request of model "m" with a prompt of prompt tokens (PickStages).
func placeStages(p *Pool, interactive bool, prompt int) (pre, dec *Lease, err error) {
	return p.PickStages(context.Background(), &Request{Model: "m", Stage: StagePrefill, Interactive: interactive, PromptTokens: prompt, Tokens: prompt + 1},
		&Request{Model: "m", Stage: StageDecode, Interactive: interactive, PromptTokens: prompt, Tokens: prompt + 50})
}

// leaseWorker names the worker of l ("-": no lease).
func leaseWorker(l *Lease) string {
	if l == nil {
		return "-"
	}
	return l.Worker.ID()
}

// An interactive request is served whole on a decode worker (StageLocal) while every prefill
// worker is prefilling other prompts, where its prompt would wait for the step in progress; with
// a prefill worker free, a long prompt, SGLang's protocol or a lower class, it goes in two
// stages.
func TestInteractiveIsServedLocallyWhileThePrefillPoolIsBusy(t *testing.T) {
	decodeWorker := func(id string) bool { return id == "w2" || id == "w3" }
	// on names the workers of a placement: prefill, then decode ("-": none).
	on := func(pre, dec *Lease) string { return leaseWorker(pre) + ", " + leaseWorker(dec) }
	for _, proto := range []Protocol{ProtocolVLLM, ProtocolSGLang} {
		t.Run(string(proto), func(t *testing.T) {
			cfg := Config{Workers: disaggWorkers()[:4],
				Disaggregation: DisaggregationConfig{PrefillPolicy: "round_robin", Protocol: proto}}
			// Pieces as large as the prefill budget, so that a short batch prompt still fits
			// beside a batch prompt in prefill (the budget is at most a piece).
			cfg.Concurrency.PrefillPieceTokens = DefaultLowerPrefillTokens
			p, _ := newTestPool(t, cfg)
			pre, dec, err := placeStages(p, true, 200)
			if err != nil || dec == nil || decodeWorker(pre.Worker.ID()) {
				t.Fatalf("prefill pool idle: got %s, %v; want two stages, the prefill on w0 or w1", on(pre, dec), err)
			}
			pre.Release(Outcome{})
			dec.Release(Outcome{})
			// A batch prompt in prefill on each prefill worker, their leases held.
			var batch []*Lease
			for range 2 {
				pre, dec, err := placeStages(p, false, 300)
				if err != nil || dec == nil {
					t.Fatalf("batch: got %s, %v; want two stages", on(pre, dec), err)
				}
				batch = append(batch, pre)
			}
			if batch[0].Worker == batch[1].Worker {
				t.Fatalf("both batch prefills went to %s; the test wants one on each prefill worker", batch[0].Worker.ID())
			}
			pre, dec, err = placeStages(p, true, 200)
			if err != nil {
				t.Fatal(err)
			}
			if proto == ProtocolSGLang {
				if dec == nil || decodeWorker(pre.Worker.ID()) {
					t.Fatalf("sglang, prefill pool busy: got %s; want two stages (its decode engines refuse whole requests)", on(pre, dec))
				}
				return
			}
			if dec != nil || !decodeWorker(pre.Worker.ID()) {
				t.Fatalf("prefill pool busy: got %s; want the whole request on w2 or w3, no decode lease", on(pre, dec))
			}
			if pre.Worker.promptsInPrefill.Load() != 200 || pre.Worker.interactivePrefills.Load() != 1 {
				t.Fatalf("the local lease counts %d prompt tokens and %d interactive prompts in prefill on %s, want 200 and 1",
					pre.Worker.promptsInPrefill.Load(), pre.Worker.interactivePrefills.Load(), pre.Worker.ID())
			}
			pre.Release(Outcome{})
			for _, tc := range []struct {
				name        string
				interactive bool
				prompt      int
			}{
				{"batch", false, 100},
				{"prompt above the prefill budget", true, DefaultLowerPrefillTokens + 1},
			} {
				pre, dec, err := placeStages(p, tc.interactive, tc.prompt)
				if err != nil || dec == nil || decodeWorker(pre.Worker.ID()) {
					t.Fatalf("%s: got %s, %v; want two stages", tc.name, on(pre, dec), err)
				}
				pre.Release(Outcome{})
				dec.Release(Outcome{})
			}
			// One prefill worker free again: interactive prompts go to it.
			batch[0].Release(Outcome{})
			pre, dec, err = placeStages(p, true, 200)
			if err != nil || dec == nil || pre.Worker != batch[0].Worker {
				t.Fatalf("a prefill worker free: got %s, %v; want two stages, the prefill on %s", on(pre, dec), err, batch[0].Worker.ID())
			}
		})
	}
}

// An interactive prompt above the prefill budget is served whole on a decode worker while every
// prefill worker it may use has at least its prompt's tokens in prefill (the staged path would
// wait longer for them than its own prefill takes), and goes in two stages while one has less.
func TestALongInteractivePromptIsServedLocallyBehindLongerPrefills(t *testing.T) {
	decodeWorker := func(id string) bool { return id == "w2" || id == "w3" }
	p, _ := newTestPool(t, Config{Workers: disaggWorkers()[:4], Disaggregation: DisaggregationConfig{PrefillPolicy: "round_robin", Protocol: ProtocolVLLM}})
	long := DefaultLowerPrefillTokens + 200
	// A batch prompt longer than the interactive one in prefill on each prefill worker.
	var batch []*Lease
	for range 2 {
		pre, dec, err := placeStages(p, false, long+100)
		if err != nil || dec == nil {
			t.Fatalf("batch: got %v; want two stages", err)
		}
		batch = append(batch, pre)
	}
	if batch[0].Worker == batch[1].Worker {
		t.Fatalf("both batch prefills went to %s; the test wants one on each prefill worker", batch[0].Worker.ID())
	}
	pre, dec, err := placeStages(p, true, long)
	if err != nil || dec != nil || !decodeWorker(pre.Worker.ID()) {
		t.Fatalf("behind longer prefills: got %s then %s, %v; want the whole request on w2 or w3", leaseWorker(pre), leaseWorker(dec), err)
	}
	pre.Release(Outcome{})
	// A prompt longer than what one prefill worker has ahead of it goes in two stages.
	pre, dec, err = placeStages(p, true, long+101)
	if err != nil || dec == nil || decodeWorker(pre.Worker.ID()) {
		t.Fatalf("longer than the prefills ahead: got %s then %s, %v; want two stages, the prefill on w0 or w1", leaseWorker(pre), leaseWorker(dec), err)
	}
	pre.Release(Outcome{})
	dec.Release(Outcome{})
}
