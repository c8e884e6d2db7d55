package routing

import (
	"context"
	"fmt"
	"slices"
)

// Prefill/decode disaggregation. A model is served disaggregated when at least one of its
// workers has role prefill and one has role decode: its requests are prefilled on one worker,
// which hands the prompt's KV cache to another that decodes (vLLM's KV connectors, SGLang's
// bootstrap flow). Each stage has its own pool of workers and its own policy: the prefill pool
// holds the workers of role prefill or both, the decode pool those of role decode or both (a
// worker of role both is an engine that takes either side, as vLLM's kv_both; with SGLang,
// whose engines take one side or none, it serves whole requests only), and
// a request that is not split (embeddings, a batch of prompts) goes whole to a worker of role
// both; with the vLLM protocol and no such worker, to any of the model's workers, which serves
// it in place. A model whose workers are not of both roles is routed as one pool, whatever
// their roles.

// Role says which stages of a disaggregated model's requests a worker serves.
type Role string

// Roles of WorkerSpec.Role.
const (
	RoleBoth    Role = "both"    // prefill and decode, and whole requests; the default ("")
	RolePrefill Role = "prefill" // prefills prompts and hands their KV to a decode worker
	RoleDecode  Role = "decode"  // decodes from KV a prefill worker computed
)

// valid reports whether r is a role ("" included, which is RoleBoth).
func (r Role) valid() bool { return r == "" || r == RoleBoth || r == RolePrefill || r == RoleDecode }

// serves reports whether a worker of role r takes requests of stage s in a disaggregated model.
func (r Role) serves(s Stage) bool {
	switch s {
	case StagePrefill:
		return r != RoleDecode
	case StageDecode:
		return r != RolePrefill
	}
	return r == "" || r == RoleBoth
}

// Stage is the part of a request's service a pick places (Request.Stage).
type Stage uint8

// Stages of a request.
const (
	// StageWhole: the whole request on one worker, as every request of a model that is not
	// disaggregated.
	StageWhole Stage = iota
	// StagePrefill: the prompt's prefill, on the prefill pool of a disaggregated model. Its
	// lease counts the prompt (Request.Tokens: prompt and one output token) until its answer.
	StagePrefill
	// StageDecode: the decode from the KV the prefill handed over, on the decode pool. Its
	// lease holds no prefill: the prefill protections (budget, pieces, interactive spread) do
	// not apply to it.
	StageDecode
	// StageLocal: the whole request on the decode pool, prefilled where it is decoded, as a
	// vLLM engine with a KV connector serves a request without kv_transfer_params. PickStages
	// places an interactive request so when the prefill pool would make its prompt wait (see
	// there); its lease holds its prefill as a whole request's does.
	StageLocal
)

// String is the stage's name in metrics and logs.
func (s Stage) String() string {
	switch s {
	case StagePrefill:
		return "prefill"
	case StageDecode:
		return "decode"
	case StageLocal:
		return "local"
	}
	return "whole"
}

// DefaultBootstrapPort is SGLang's default --disaggregation-bootstrap-port.
const DefaultBootstrapPort = 8998

// Bootstrap is where a decode worker fetches the KV of a prompt this worker prefilled in
// SGLang's flow: the host of its URL and its WorkerSpec.BootstrapPort (default 8998).
func (w *Worker) Bootstrap() (host string, port int) {
	port = w.spec.BootstrapPort
	if port == 0 {
		port = DefaultBootstrapPort
	}
	return w.url.Hostname(), port
}

// Protocol is how the gateway hands a request from its prefill worker to its decode worker.
type Protocol string

// Protocols of DisaggregationConfig.Protocol.
const (
	// ProtocolVLLM is vLLM's KV-connector flow (NixlConnector and the others, as vLLM's
	// toy_proxy_server.py drives it): the prefill worker is sent the request with
	// kv_transfer_params {"do_remote_decode": true}, max_tokens 1 and no stream; its answer's
	// kv_transfer_params go with the request to the decode worker, which pulls the KV.
	ProtocolVLLM Protocol = "vllm"
	// ProtocolSGLang is SGLang's bootstrap flow: bootstrap_host, bootstrap_port and
	// bootstrap_room sent to both workers at once.
	ProtocolSGLang Protocol = "sglang"
)

// Defaults of DisaggregationConfig.
const (
	// DefaultPrefillPolicy: a prefill worker's work is the prompt less what its prefix cache
	// holds, and the decode worker receives the KV whatever it holds, so the prefill pool is
	// where cache affinity pays; cache_aware weighs it against load (see docs/routing.md).
	DefaultPrefillPolicy = "cache_aware"
	// DefaultDecodePolicy: a decode worker's load is its running sequences and their KV, which
	// power_of_two balances at the cost of two loads read.
	DefaultDecodePolicy = "power_of_two"
)

// DisaggregationConfig sets how disaggregated models are routed (`routing.disaggregation`, and
// per model `routing.models[m].disaggregation`, whose fields set there override these). Each
// stage's policy takes its parameters from the model's config (`routing.models[m].cache_aware`
// and so on).
type DisaggregationConfig struct {
	// PrefillPolicy routes the prefill stage; default cache_aware.
	PrefillPolicy string `yaml:"prefill_policy"`
	// DecodePolicy routes the decode stage; default power_of_two.
	DecodePolicy string `yaml:"decode_policy"`
	// Protocol is the hand-off the engines speak: vllm (default) or sglang.
	Protocol Protocol `yaml:"protocol"`
}

// setDefaults fills the zero fields of dc with the package defaults.
func (dc *DisaggregationConfig) setDefaults() {
	if dc.PrefillPolicy == "" {
		dc.PrefillPolicy = DefaultPrefillPolicy
	}
	if dc.DecodePolicy == "" {
		dc.DecodePolicy = DefaultDecodePolicy
	}
	if dc.Protocol == "" {
		dc.Protocol = ProtocolVLLM
	}
}

// over is dc with its zero fields taken from base.
func (dc DisaggregationConfig) over(base DisaggregationConfig) DisaggregationConfig {
	if dc.PrefillPolicy == "" {
		dc.PrefillPolicy = base.PrefillPolicy
	}
	if dc.DecodePolicy == "" {
		dc.DecodePolicy = base.DecodePolicy
	}
	if dc.Protocol == "" {
		dc.Protocol = base.Protocol
	}
	return dc
}

// validate reports the problems of dc, each naming its field below prefix. Zero fields pass (a
// model's take the routing section's).
func (dc DisaggregationConfig) validate(prefix string) []error {
	var errs []error
	for _, f := range []struct{ field, name string }{{"prefill_policy", dc.PrefillPolicy}, {"decode_policy", dc.DecodePolicy}} {
		if f.name == "" {
			continue
		}
		if !knownPolicy(f.name) {
			errs = append(errs, fieldError(prefix, f.field, "unknown policy %q (known: %s)", f.name, policyNames()))
		} else if f.name == "sticky_session" || f.name == "manual" {
			// Their pins name one worker for a key, for every request of the model; a stage's
			// pool is a part of its workers.
			errs = append(errs, fieldError(prefix, f.field, "%s pins a key to one worker of the model and cannot route one stage", f.name))
		}
	}
	switch dc.Protocol {
	case "", ProtocolVLLM, ProtocolSGLang:
	default:
		errs = append(errs, fieldError(prefix, "protocol", "must be vllm or sglang, got %q", dc.Protocol))
	}
	return errs
}

// disaggregation is the config of model's disaggregation: the model's own fields over the routing
// section's.
func (p *Pool) disaggregation(model string) DisaggregationConfig {
	return p.cfg.Models[model].Disaggregation.over(p.cfg.Disaggregation)
}

// Disaggregated reports whether model is served disaggregated now (at least one worker of role
// prefill and one of role decode serve it), and with which hand-off protocol. Costs a map read.
func (p *Pool) Disaggregated(model string) (Protocol, bool) {
	ms := p.snap.Load().models[model]
	if ms == nil || ms.prefill == nil {
		return "", false
	}
	return ms.protocol, true
}

// splitStages builds the prefill and decode sets of a disaggregated model from ms, whose
// workers are still all of the model's, and leaves ms with those of role both for whole
// requests. It does nothing for a model that is not disaggregated. p.mu must be held.
func (p *Pool) splitStages(model string, ms *modelSet) error {
	hasRole := func(r Role) bool {
		return slices.ContainsFunc(ms.workers, func(w *Worker) bool { return w.spec.Role == r })
	}
	if !hasRole(RolePrefill) || !hasRole(RoleDecode) {
		return nil
	}
	ms.protocol = p.disaggregation(model).Protocol
	all := ms.workers
	stageOf := func(stage Stage, set *modelSet) {
		for _, w := range all {
			// An SGLang engine serves one side of a hand-off or none: a worker of role both
			// there is an engine not in a disaggregation mode, for whole requests only.
			both := w.spec.Role == "" || w.spec.Role == RoleBoth
			if w.spec.Role.serves(stage) && (stage == StageWhole || !both || ms.protocol != ProtocolSGLang) {
				set.workers = append(set.workers, w)
				set.byID[w.spec.ID] = w
			}
		}
	}
	for _, stage := range []Stage{StagePrefill, StageDecode} {
		pol, err := p.policyFor(model, stage)
		if err != nil {
			return err
		}
		set := &modelSet{policyName: pol.name, policy: pol.Policy, byID: make(map[string]*Worker)}
		stageOf(stage, set)
		if stage == StagePrefill {
			ms.prefill = set
		} else {
			ms.decode = set
		}
	}
	ms.workers, ms.byID = nil, make(map[string]*Worker)
	stageOf(StageWhole, ms)
	if len(ms.workers) == 0 && ms.protocol == ProtocolVLLM {
		// A vLLM engine with a KV connector serves a request without kv_transfer_params as
		// any engine does, prefill and decode in place; an SGLang engine in a disaggregation
		// mode refuses one without a bootstrap room.
		ms.workers = all
		for _, w := range all {
			ms.byID[w.spec.ID] = w
		}
	}
	return nil
}

// stageSet is the set of ms that r's stage picks from: ms itself for a whole request, else the
// model's prefill or decode set; nil when r asks for a stage of a model that is not
// disaggregated.
func (ms *modelSet) stageSet(s Stage) *modelSet {
	switch s {
	case StagePrefill:
		return ms.prefill
	case StageDecode, StageLocal:
		return ms.decode
	}
	return ms
}

// allWorkers is every worker of ms's model, whatever its role.
func (ms *modelSet) allWorkers() []*Worker {
	if ms.prefill == nil {
		return ms.workers
	}
	out := slices.Clone(ms.prefill.workers)
	for _, w := range ms.decode.workers {
		if !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// PickStages places both stages of a request of a disaggregated model at once: prefill (whose
// Stage must be StagePrefill) on the prefill pool and decode (StageDecode) on the decode pool,
// so that a request released from its queue has room for its whole service and never waits a
// second time between its stages. It fails as Pick fails for either stage (an error wrapping
// ErrNoRoom when either pool is only full) and then holds nothing: a lease it took for the
// other stage is given back as though never placed, without telling OnRoom's function, so it may
// be called under a lock that function takes (the queue's). A decode request naming in
// TargetWorker a worker of the prefill pool only picks by policy, and the reverse.
//
// An interactive request may instead be served whole on the decode pool (see servedLocally):
// then pre is its lease (Stage StageLocal, on a decode worker) and dec is nil.
func (p *Pool) PickStages(ctx context.Context, prefill, decode *Request) (pre, dec *Lease, err error) {
	if prefill.Stage != StagePrefill || decode.Stage != StageDecode {
		return nil, nil, fmt.Errorf("model %q: PickStages needs a prefill and a decode request: %w", prefill.Model, ErrNoWorker)
	}
	if p.servedLocally(prefill) {
		local := *decode
		local.Stage = StageLocal
		if l, err := p.Pick(ctx, &local); err == nil {
			return l, nil, nil
		}
		// No decode worker has room: neither stage could be placed either.
	}
	// The decode pool first: its leases last the whole answer, so it is the pool more often
	// full, and a prefill picked in vain would have taught its policy a prompt it never saw.
	dec, err = p.Pick(ctx, decode)
	if err != nil {
		return nil, nil, err
	}
	pre, err = p.Pick(ctx, prefill)
	if err != nil {
		dec.cancel()
		return nil, nil, err
	}
	return pre, dec, nil
}

// servedLocally reports whether prefill, the prefill stage of a request of a disaggregated
// model, is to be served whole on the decode pool, prefilled there (StageLocal): an interactive
// request of the vLLM protocol, when no prefill worker it may use is free of prompts in prefill,
// and either its prompt is within ConcurrencyConfig.LowerPrefillTokens or every prefill worker it
// may use (one at least) has at least its prompt's tokens in prefill.
//
// An engine does not stop a step: on a prefill worker busy with other prompts (a batch flood
// keeps every one busy, back to back) an interactive prompt waits for the step in progress,
// up to a whole lower-class prompt's prefill, and its hand-off comes after that; a decode
// worker's steps are one token per sequence, a few milliseconds, so there it waits for little
// more than its own prefill. What that costs the decode worker's sequences is one step longer
// by this prompt's prefill, which the bound on the prompt keeps within what the prefill budget
// lets a lower-class prompt cost an interactive one. NVIDIA Dynamo's disaggregated serving
// decides the same way, prefilling in the decode engine a short prompt or one the prefill
// queue would delay. SGLang's engines in a disaggregation mode refuse a request without a
// bootstrap room, so its protocol never does.
//
// A longer prompt goes whole to a decode worker only where the staged path would wait at
// least as long as its own prefill for the prompts ahead of it: its time to first token would
// then be more than twice its prefill, past the objective (twice the idle prediction), while on
// a decode worker it is little more than its prefill. (The prompts in prefill are counted whole
// until their first token, so this may send a prompt locally whose wait would have been shorter;
// the lower-class budget keeps a prefill worker to one lower-class prompt at a time beside
// interactive traffic.) Cost: a few atomic loads per prefill worker.
func (p *Pool) servedLocally(prefill *Request) bool {
	if !prefill.Interactive || prefill.TargetWorker != "" {
		return false
	}
	ms := p.snap.Load().models[prefill.Model]
	if ms == nil || ms.prefill == nil || ms.protocol != ProtocolVLLM {
		return false
	}
	long := prefill.PromptTokens > p.cfg.Concurrency.LowerPrefillTokens
	eligible := false
	for _, w := range ms.prefill.workers {
		if !prefill.Eligible(w) {
			continue
		}
		eligible = true
		ahead := w.promptsInPrefill.Load()
		if ahead <= 0 || long && ahead < int64(prefill.PromptTokens) {
			return false
		}
	}
	return eligible || !long
}

// cancel gives back a lease whose request was never sent, as though it had not been placed:
// its counts, its prefill and a half-open probe it held, without an outcome, metrics or a call
// to OnRoom's function. Later calls, and Release after it, do nothing.
func (l *Lease) cancel() {
	if !l.released.CompareAndSwap(false, true) {
		return
	}
	l.Worker.release(l.tokens)
	l.endPrefill()
	if l.probe {
		l.Worker.breaker.probing.Store(false)
	}
}
