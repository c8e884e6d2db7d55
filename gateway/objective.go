package gateway

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Every call that reached a queue is judged at settle against its latency objectives: the tier's
// for its class (tenants.Objective), tightened by the client's headers, or, where the tier states
// none, the defaults below, relative to what a typical worker of the model predicts for the
// prompt on it idle (routing.Pool.PredictIdleTypical). The verdicts go to the metrics, the usage
// ledger and the access log.

// Headers a client tightens its objectives with, in milliseconds: a value above the tier's
// objective is the tier's (a client may tighten its promise, never loosen it).
const (
	headerTTFTObjectiveMs = "X-Usher-TTFT-Objective-Ms"
	headerTPOTObjectiveMs = "X-Usher-TPOT-Objective-Ms"
	// The same as net/http stores them.
	canonicalTTFTObjectiveMs = "X-Usher-Ttft-Objective-Ms"
	canonicalTPOTObjectiveMs = "X-Usher-Tpot-Objective-Ms"
)

// The default objectives, for a class whose tier states none.
//
// Interactive: TTFT within 2x the predicted time on an idle worker plus one engine step there
// (routing.TTFTObjective); TPOT within 3x the idle step. A person is waiting; 2x leaves room for
// one prompt of the same size prefilled beside it, or a batch share of the engine's steps, which
// is what a loaded but healthy worker costs, and no more: a request queued behind a second one, or placed
// away from its cached prefix, misses. The step is the engine's: it does not stop a step in
// progress, so on a busy worker every prompt may wait for one, wherever the gateway places it.
// Measured (docs/benchmarks.md, "The default objective, 2026-12-05"), 1.5x without the step left
// 12-53% of interactive requests missed beside a batch flood on simulated vLLM-like engines with
// nothing waiting in usher: their misses were that step and their share of the engine's steps.
// Standard: 3x plus the step, room for the queue of a busy pool (a couple of requests ahead)
// without calling that a failure; TPOT 4x. Batch: none; its promise is its deadline.
//
// TPOT allows one more idle step than TTFT's factor (routing.InteractiveTPOTFactor): a prompt
// pays a busy engine's step once, a decode the lower classes' share of every step.
//
// Until the workers' cost models have learnt their steps there is no default TPOT objective (the
// answer's TPOT is unjudged), as there is no TTFT one until they predict: judged by the floor
// below, 28 of 31 interactive answers missed in the first seconds of a simulator run.
//
// The floors keep a tiny prediction (a short prompt on a fast engine, the simulator) from
// turning noise into misses: on loopback a Go scheduler delay, a GC pause or an SSE flush on a
// shared two-core machine costs tens of milliseconds; 50 ms before the first token and 10 ms per
// token (100 tokens/s, faster than anyone reads) are below what a person notices, so they weaken
// no promise anyone could check.
//
// The interactive TTFT default is routing's, which warns of workers whose engine steps make it
// unreachable.
const (
	interactiveObjectiveFactor = routing.InteractiveObjectiveFactor
	standardObjectiveFactor    = routing.StandardObjectiveFactor
	minTPOTObjective           = 10 * time.Millisecond
)

// objective is what one call is judged against; a zero field: none, that part is unjudged.
type objective struct {
	ttft, tpot time.Duration
}

// askedObjectives reads the objective headers: each a positive number of milliseconds; a value
// beyond the bound of objectives (or of int64) is held to the bound, and then to the tier's.
func (cl *call) askedObjectives(h http.Header) error {
	for _, f := range [...]struct {
		name, key string
		bound     time.Duration
		to        *time.Duration
	}{
		{headerTTFTObjectiveMs, canonicalTTFTObjectiveMs, tenants.MaxObjectiveTTFT, &cl.askedTTFT},
		{headerTPOTObjectiveMs, canonicalTPOTObjectiveMs, tenants.MaxObjectiveTPOT, &cl.askedTPOT},
	} {
		v := headerValue(h, f.key)
		if v == "" {
			continue
		}
		ms, err := strconv.ParseUint(v, 10, 64)
		if errors.Is(err, strconv.ErrRange) {
			ms, err = math.MaxUint64, nil
		}
		if err != nil || ms == 0 {
			return BadRequest("", "%s must be a positive whole number of milliseconds", f.name)
		}
		*f.to = time.Duration(min(ms, uint64(f.bound.Milliseconds()))) * time.Millisecond
	}
	return nil
}

// defaultFactors are the multiples a class's default objectives allow: of the idle prediction
// for TTFT, of the idle step for TPOT; 0: the class has no default objective.
func defaultFactors(c queue.Class) (ttft, tpot float64) {
	switch c {
	case queue.Interactive:
		return interactiveObjectiveFactor, routing.InteractiveTPOTFactor
	case queue.Standard:
		return standardObjectiveFactor, routing.StandardTPOTFactor
	}
	return 0, 0
}

// stated reports whether the call has an objective at all, predictable or not: the tier's, a
// default relative one, or the client's.
func (cl *call) stated() (ttft, tpot bool) {
	o := cl.tier.Objective(cl.class.String())
	f, _ := defaultFactors(cl.class)
	relative := f > 0
	return o.TTFT > 0 || relative || cl.askedTTFT > 0, o.TPOT > 0 || relative || cl.askedTPOT > 0
}

// objective resolves the call's objective: the tier's for its class, else the default relative to
// the model's idle prediction for the prompt with what the engine found cached (none when the
// call was never placed or the model cannot predict yet), each tightened by the client's.
func (s *Server) objective(cl *call) objective {
	return cl.objectiveGiven(s.predictIdle(cl))
}

// predictIdle is what a typical worker of the set that served the call (the model's workers, or
// a disaggregated model's stage's) predicts for it on an idle worker (routing's
// PredictIdleTypical), from the prompt the engine reported (else usher's estimate) and what it
// found cached; ok is false when the call was never placed or the model cannot predict yet. A
// two-staged call's first token comes after its prefill, on another worker, and the hand-off of
// its KV to the decode worker: its TTFT is the prefill pool's prediction plus the decode
// worker's hand-off (routing's PredictHandoffIdle), so that a disaggregated fleet is held to the
// time its clients wait; until the decode worker has learnt its hand-offs (from 32 streamed
// decodes), the prefill's alone. Its TPOT is the decode pool's.
func (s *Server) predictIdle(cl *call) (routing.Prediction, bool) {
	if cl.lease == nil {
		return routing.Prediction{}, false
	}
	prompt := cl.usage.PromptTokens
	if prompt == 0 {
		prompt = cl.promptTokens
	}
	p, ok := s.pool.PredictIdleTypical(cl.model, cl.lease.Stage(), cl.lease.Worker, prompt, cl.usage.cachedTokens())
	if cl.prefilledOn != nil && ok {
		pre, preOK := s.pool.PredictIdleTypical(cl.model, routing.StagePrefill, cl.prefilledOn, prompt, cl.usage.cachedTokens())
		p.TTFT, ok = pre.TTFT, preOK
		// The lease is the prefill's when no decode was sent: no hand-off then.
		if h, learnt := cl.lease.Worker.PredictHandoffIdle(prompt); learnt && cl.lease.Worker != cl.prefilledOn {
			p.TTFT += h
		}
	}
	return p, ok
}

// objectiveGiven is the call's objective given the idle prediction p (ok false: none).
func (cl *call) objectiveGiven(p routing.Prediction, ok bool) objective {
	o := cl.tier.Objective(cl.class.String())
	out := objective{ttft: o.TTFT, tpot: o.TPOT}
	if f, tpotFactor := defaultFactors(cl.class); f > 0 && ok {
		if out.ttft == 0 {
			out.ttft = routing.TTFTObjective(p, f, tenants.MaxObjectiveTTFT)
		}
		if out.tpot == 0 && p.TPOT > 0 {
			// p.TPOT 0: the workers have not learnt their steps; no default to judge by yet.
			out.tpot = max(scaled(p.TPOT, tpotFactor, tenants.MaxObjectiveTPOT), minTPOTObjective)
		}
	}
	out.ttft, out.tpot = tighter(out.ttft, cl.askedTTFT), tighter(out.tpot, cl.askedTPOT)
	return out
}

// scaled is d times f, at most bound.
func scaled(d time.Duration, f float64, bound time.Duration) time.Duration {
	return time.Duration(min(max(float64(d)*f, 0), float64(bound)))
}

// tighter is the tighter of two objectives, 0 being none.
func tighter(a, b time.Duration) time.Duration {
	if a == 0 || b > 0 && b < a {
		return b
	}
	return a
}

// verdicts is how one call fared: its objective and a verdict on each part. judged is false for
// a call not judged at all (the client's own error, an embedding): it counts in no attainment.
type verdicts struct {
	judged     bool
	objective  objective
	ttft, tpot tenants.Verdict
}

// judge gives the call's verdicts at end, the call having ended with err.
//
//   - Answered, streamed: TTFT is the time from arrival to the first byte the client got (queue
//     wait included); TPOT is (end - first byte) / (completion tokens - 1), unjudged below two
//     tokens.
//   - Answered whole (not streamed): the client sees no first token, so the whole answer's time
//     is judged against TTFT objective + TPOT objective x (completion tokens - 1), and that one
//     verdict is both the TTFT's and (from two tokens, with a TPOT objective) the TPOT's.
//   - Failed by usher or the worker (a 5xx: no worker, the worker's error, the queue deadline
//     passed): missed, for every objective the call has, predictable or not; no answer keeps a
//     latency promise.
//   - The client left: what was seen is judged (TTFT once a first byte was sent; before it, a
//     miss only when the TTFT objective had passed already); TPOT is unjudged.
//   - Refused for the client's own doing (a 4xx: its limits, budget, queue cap, a bad header)
//     and embeddings: not judged.
func (s *Server) judge(cl *call, err error, end time.Time) verdicts {
	if cl.ep.embed || !cl.classed {
		return verdicts{}
	}
	gone := errors.Is(err, errClientGone)
	if err != nil && !gone {
		if ErrorFor(err).Status < http.StatusInternalServerError {
			return verdicts{}
		}
		v := verdicts{judged: true, objective: s.objective(cl)}
		if ttft, tpot := cl.stated(); ttft || tpot {
			v.ttft, v.tpot = missedIf(ttft), missedIf(tpot)
		}
		return v
	}
	v := verdicts{judged: true, objective: s.objective(cl)}
	o, n := v.objective, cl.usage.CompletionTokens
	switch {
	case gone && cl.ttft == 0:
		if o.ttft > 0 && end.Sub(cl.start) > o.ttft {
			v.ttft = tenants.VerdictMissed
		}
	case cl.stream:
		v.ttft = within(cl.ttft, o.ttft)
		if !gone && n >= 2 && o.tpot > 0 {
			v.tpot = within(end.Sub(cl.start.Add(cl.ttft))/time.Duration(n-1), o.tpot)
		}
	case gone:
		v.ttft = within(cl.ttft, o.ttft)
	default:
		if o.ttft > 0 {
			whole := cl.ttft
			if whole == 0 {
				whole = end.Sub(cl.start)
			}
			v.ttft = within(whole, o.ttft+perToken(o.tpot, n-1))
			if n >= 2 && o.tpot > 0 {
				v.tpot = v.ttft
			}
		}
	}
	return v
}

// teachPiece tells the pool an interactive call's TTFT verdict, which the size of the pieces
// lower-class prompts go in follows (routing.Pool.JudgedInteractive): a met one, and a missed
// one that a piece may have made: placed behind a lower-class prefill on its worker, it waited
// in usher's queue for less than a quarter of its objective. A miss that waited longer in
// usher's queue is the queue's, one placed with no lower-class prefill there the engine's own;
// a smaller piece would shorten neither. A call whose client tightened its TTFT objective is
// not told: the piece is every tenant's, and a tenant asking 1 ms would otherwise shrink it for
// all the batch served.
func (s *Server) teachPiece(cl *call, v verdicts) {
	if cl.class != queue.Interactive || cl.worker == "" || cl.askedTTFT > 0 {
		return
	}
	switch v.ttft {
	case tenants.VerdictMet:
	case tenants.VerdictMissed:
		if !cl.behindLower || cl.queued >= v.objective.ttft/4 {
			return
		}
	default:
		return
	}
	s.pool.JudgedInteractive(v.ttft == tenants.VerdictMet, interactivePercentile(cl))
}

// interactivePercentile is the percentile of the interactive objective of the call's tier (the
// default one when it names none): the share of verdicts the learnt piece and pace aim to meet.
func interactivePercentile(cl *call) float64 {
	if p := cl.tier.Objective(queue.Interactive.String()).Percentile; p != 0 {
		return p
	}
	return tenants.DefaultPercentile
}

// teachPace tells the pool an interactive call's TPOT verdict when its answer decoded beside a
// lower-class piece on its worker (routing.Lease.DecodedBesidePieces): the pace of pieces beside
// interactive decodes follows those (routing.Pool.JudgedDecode). A call whose client tightened
// its TPOT objective is not told: the pace is every tenant's batch's, and a tenant asking 1 ms
// would otherwise slow it for all.
func (s *Server) teachPace(cl *call, v verdicts) {
	if cl.class != queue.Interactive || cl.lease == nil || cl.askedTPOT > 0 ||
		v.tpot != tenants.VerdictMet && v.tpot != tenants.VerdictMissed || !cl.lease.DecodedBesidePieces() {
		return
	}
	s.pool.JudgedDecode(v.tpot == tenants.VerdictMet, interactivePercentile(cl))
}

// perToken is d times n (n below 1: 0), saturating at a day.
func perToken(d time.Duration, n int) time.Duration {
	if n < 1 || d <= 0 {
		return 0
	}
	if int64(n) > int64(24*time.Hour)/int64(d) {
		return 24 * time.Hour
	}
	return d * time.Duration(n)
}

// within is the verdict on took against limit (0: none, unjudged).
func within(took, limit time.Duration) tenants.Verdict {
	switch {
	case limit == 0:
		return tenants.VerdictUnjudged
	case took <= limit:
		return tenants.VerdictMet
	}
	return tenants.VerdictMissed
}

func missedIf(b bool) tenants.Verdict {
	if b {
		return tenants.VerdictMissed
	}
	return tenants.VerdictUnjudged
}

// attainment are the objectives' series: each judged call counted once in each, by tier, tenant,
// class, model and verdict. Tenants' series are deleted with the tenant (Server.ForgetTenant),
// so their number is bounded by the tenants that exist; tiers, classes and served models are
// the config's.
type attainment struct {
	ttft, tpot, requests *prometheus.CounterVec

	// calls caches the series of the calls whose model is served, by everything but the
	// verdict: a call finds its three series with one lookup.
	mu    sync.RWMutex // guards calls
	calls map[attainmentKey]*attainmentSeries
}

// attainmentKey is the labels of a call's attainment series but the verdict.
type attainmentKey struct {
	tier, tenant, model string
	class               queue.Class
}

// attainmentSeries are the children of the attainment vectors for one attainmentKey, by
// verdict, each created the first time it is used.
type attainmentSeries struct {
	ttft, tpot, requests [tenants.VerdictMissed + 1]child[prometheus.Counter]
}

func newAttainment() *attainment {
	labels := []string{"tier", "tenant", "class", "model", "verdict"}
	return &attainment{
		calls: map[attainmentKey]*attainmentSeries{},
		ttft: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_objective_ttft_total",
			Help: "Answered inference requests (and those usher or the worker failed) judged against their TTFT objective: verdict met, missed or unjudged (no objective could be stated, or nothing to measure)."},
			labels),
		tpot: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_objective_tpot_total",
			Help: "The same requests judged against their time-per-output-token objective: verdict met, missed or unjudged (no objective, or fewer than two output tokens)."},
			labels),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "usher_objective_requests_total",
			Help: "The same requests judged as a whole: met (missed neither objective and met one at least: rate() of it is goodput), missed (either), unjudged (neither judged)."},
			labels),
	}
}

func (a *attainment) collectors() []prometheus.Collector {
	return []prometheus.Collector{a.ttft, a.tpot, a.requests}
}

// count records one judged call.
func (a *attainment) count(cl *call, v verdicts) {
	if !v.judged {
		return
	}
	k := attainmentKey{tier: cl.tier.Name, tenant: cl.principal.TenantID, model: cl.model, class: cl.class}
	both := tenants.Both(v.ttft, v.tpot)
	if !cl.classed || !knownVerdict(v.ttft) || !knownVerdict(v.tpot) || !knownVerdict(both) {
		a.inc(a.ttft, k, v.ttft)
		a.inc(a.tpot, k, v.tpot)
		a.inc(a.requests, k, both)
		return
	}
	s := a.seriesOf(k)
	s.ttft[v.ttft].get(func() prometheus.Counter { return a.with(a.ttft, k, v.ttft) }).Inc()
	s.tpot[v.tpot].get(func() prometheus.Counter { return a.with(a.tpot, k, v.tpot) }).Inc()
	s.requests[both].get(func() prometheus.Counter { return a.with(a.requests, k, both) }).Inc()
}

// knownVerdict says v has a place in attainmentSeries.
func knownVerdict(v tenants.Verdict) bool { return int(v) < len(attainmentSeries{}.ttft) }

// with is the child of vec labelled by k and v.
func (a *attainment) with(vec *prometheus.CounterVec, k attainmentKey, v tenants.Verdict) prometheus.Counter {
	return vec.WithLabelValues(k.tier, k.tenant, k.class.String(), k.model, v.String())
}

// inc counts one call in the child of vec labelled by k and v, without the cache.
func (a *attainment) inc(vec *prometheus.CounterVec, k attainmentKey, v tenants.Verdict) {
	a.with(vec, k, v).Inc()
}

// seriesOf returns the series of k, creating them on first use. Cost: a map lookup under a read
// lock.
func (a *attainment) seriesOf(k attainmentKey) *attainmentSeries {
	a.mu.RLock()
	s := a.calls[k]
	a.mu.RUnlock()
	if s != nil {
		return s
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if s = a.calls[k]; s == nil {
		s = &attainmentSeries{}
		a.calls[k] = s
	}
	return s
}

// forget deletes a tenant's series.
func (a *attainment) forget(tenant string) {
	a.mu.Lock()
	for k := range a.calls {
		if k.tenant == tenant {
			delete(a.calls, k)
		}
	}
	a.mu.Unlock()
	for _, c := range []*prometheus.CounterVec{a.ttft, a.tpot, a.requests} {
		c.DeletePartialMatch(prometheus.Labels{"tenant": tenant})
	}
}
