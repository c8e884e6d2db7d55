package routing

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"
)

// LimitSource says where a worker's concurrency limit comes from.
type LimitSource string

const (
	// LimitConfig: the worker's max_concurrency in the configuration fixes it; nothing is learned.
	LimitConfig LimitSource = "config"
	// LimitEngine: the engine reported its slots (llama.cpp's /props total_slots); the limit is
	// that count, under the ceiling.
	LimitEngine LimitSource = "engine"
	// LimitLearned: the engine does not report slots; the limit is adapted from its load signals
	// and the time to first token it delivers.
	LimitLearned LimitSource = "learned"
)

// ConcurrencyConfig sets how the pool learns each worker's concurrency limit: the number of
// requests it keeps in flight there, so the engine's own FIFO queue stays near empty and the
// waiting happens in usher's queue, where priority, fair share and deadlines apply. A worker
// with max_concurrency in its spec keeps that fixed value; the others learn it, never above
// routing.max_concurrency (the ceiling). The control law, run at every scrape of the worker,
// acts only on what is fresh: the scrape's own reading, the requests in flight since the last
// scrape, and the answers that came back since then. A worker nobody sends to keeps its limit.
//
//  1. An engine that reports its slots (GET PropsPath answering `total_slots`, as llama.cpp's
//     server does) gets exactly that many: more would only queue inside the engine.
//  2. Otherwise, when the engine reports requests waiting inside it at two scrapes in a row (one
//     may catch a request that just arrived, before the engine's next scheduling step), and, if
//     it reports its KV-cache use, with the cache at least KVHold full, the
//     limit drops at once to the requests it reports running (at least one less than before):
//     what it really runs. That
//     count is then a cap the limit does not probe above for CapHold, so a fixed-slot engine that
//     does not report its slots is not pushed into queueing again at every scrape.
//  3. When its KV cache is at least KVHigh full, the limit drops by one; between KVHold and
//     KVHigh it holds.
//  4. Otherwise, when the limit was binding (the worker's requests in flight, from every
//     replica, came within a fifth of it, at least one: the queue keeps a share of the pool for
//     interactive requests, queue.interactive_reserve, so standard and batch traffic alone
//     never fills a worker to its limit), it rises: doubling from Initial until the first drop,
//     then by one per scrape. An engine that reports its load (it answered a scrape with a
//     known load metric in the last minute) says itself when it is past its knee, by 2 and 3.
//     One that does not is judged by the time to first token of its streamed answers instead,
//     against the load each was measured at: each scrape that saw answers gives a point, their
//     mean TTFT at the peak requests in flight since the scrape before, and the limit drops by
//     a tenth (at least one), instead of rising, when answers came since the last scrape and
//     the least-squares line through the points of the last two minutes at loads up to the
//     present one puts TTFT at the present load above TTFTTolerance times TTFT at half of it.
//     At the default 2 that is the knee by Little's law: past it, throughput no longer rises
//     with the requests in flight and each added request only waits longer. A
//     continuous-batching engine's TTFT grows with its batch by design, less than in
//     proportion, so it is not cut for it; nor is noise at a steady load, which gives no slope.
//
// The worker's token limit (the prompt plus expected output of its requests in flight, which the
// queue's interactive reserve and every policy count too) is sized the same way, unless the
// worker's max_tokens_in_flight fixes it: an engine that states the size of its KV cache (vLLM's
// vllm:cache_config_info, SGLang's sglang:max_total_num_tokens) gets that many tokens times a
// ratio, so requests are sent only while the engine's cache can hold them all to their last
// token: it never has to queue or evict one, and the reserve left for interactive requests is
// room in the engine's cache, not only in its batch. The ratio starts at 1 and follows, once
// 20 answers came, the measured ratio of what requests were charged to the KV they
// really held (prompt tokens less those the engine found cached, plus completion tokens; moving
// averages of both over answers), so shared prefixes and answers shorter than max_tokens raise
// the limit: at once when the measure falls, at most a tenth per scrape when it rises, and never
// while the engine reports its cache KVHold full; at KVHigh, or with requests waiting beside a
// cache KVHold full, it drops by a tenth. It stays between 1/4 and 16, and
// routing.max_tokens_in_flight is the ceiling.
type ConcurrencyConfig struct {
	// Initial is the limit a learning worker starts with. Default 8.
	Initial int `yaml:"initial"`
	// PropsPath is where an engine reports its slots; default /props (llama.cpp).
	PropsPath string `yaml:"props_path"`
	// TTFTTolerance is how many times the time to first token of a worker whose engine does not
	// report its load may grow when the requests in flight double, before the limit drops.
	// Default 2.
	TTFTTolerance float64 `yaml:"ttft_tolerance"`
	// KVHold and KVHigh are the KV-cache usage fractions at which the limit stops rising and
	// drops. Defaults 0.9 and 0.97.
	KVHold float64 `yaml:"kv_hold"`
	KVHigh float64 `yaml:"kv_high"`
	// CapHold is how long the running count at which the engine last queued caps the limit.
	// Default 60s.
	CapHold time.Duration `yaml:"cap_hold"`
	// LowerPrefillTokens bounds, while interactive requests are present (see
	// InteractivePresence), the prompt tokens of standard and batch requests that one worker is
	// prefilling at once (sent, first token not yet back; at least one request): an
	// engine prefills the prompts it has in one step, and an interactive prompt that arrives
	// waits for the step in progress; while pieces are on (PrefillPieceTokens), at most one
	// piece. Default 512.
	LowerPrefillTokens int `yaml:"lower_prefill_tokens"`
	// InteractivePresence is the least time after the last interactive request that
	// LowerPrefillTokens and the pieces still apply; longer while interactive requests come
	// further apart: 8 times their mean gap lately, at most 2 minutes (see presence.go).
	// Default 10s.
	InteractivePresence time.Duration `yaml:"interactive_presence"`
	// ClearWithin is the removed clear lane's knob (it traded batch throughput for the
	// interactive tail, and was off by default; figures in docs/benchmarks.md). Kept only so
	// that a config that sets it is told so, not a parse error about an unknown field.
	ClearWithin time.Duration `yaml:"clear_within"`
	// PrefillPieceTokens is the size of the pieces in which a standard or batch prompt longer than
	// a piece and a half reaches an engine while interactive requests are present (see
	// Lease.PrefillPiece): the gateway has the engine prefill the prompt's leading pieces, one
	// request each, then sends the request, whose prompt the engine finds cached but for its last
	// piece. A piece counts against LowerPrefillTokens, which is then at most one piece, so a
	// worker prefills one lower-class piece at a time. Default 0: learnt, the average interactive
	// prompt (the default interactive objective's slack beyond the step in progress,
	// InteractiveObjectiveFactor - 1: an interactive prompt then waits for no more lower-class
	// prefill than that), at most LowerPrefillTokens, at least 64 tokens; either way at least a
	// sixteenth of the prompt. -1: off, prompts go whole.
	PrefillPieceTokens int `yaml:"prefill_piece_tokens"`
	// PiecesEverywhere is the knob of a removed choice: pieces went to one worker of several
	// while the others took long prompts whole. Pieces now go to every worker (the demo's
	// interactive p99 went from 2.0-2.7x to 1.4x its p99 alone; docs/benchmarks.md). Kept, and
	// ignored, so that a config that sets it still loads.
	PiecesEverywhere bool `yaml:"pieces_everywhere"`
}

// Defaults of ConcurrencyConfig.
const (
	DefaultInitialConcurrency  = 8
	DefaultPropsPath           = "/props"
	DefaultTTFTTolerance       = 2.0
	DefaultKVHold              = 0.9
	DefaultKVHigh              = 0.97
	DefaultCapHold             = time.Minute
	DefaultLowerPrefillTokens  = 512
	DefaultInteractivePresence = 10 * time.Second
)

func (c *ConcurrencyConfig) setDefaults() {
	setDefaultValue(&c.Initial, DefaultInitialConcurrency)
	setDefaultValue(&c.PropsPath, DefaultPropsPath)
	setDefaultValue(&c.TTFTTolerance, DefaultTTFTTolerance)
	setDefaultValue(&c.KVHold, DefaultKVHold)
	setDefaultValue(&c.KVHigh, DefaultKVHigh)
	setDefaultValue(&c.CapHold, DefaultCapHold)
	setDefaultValue(&c.LowerPrefillTokens, DefaultLowerPrefillTokens)
	setDefaultValue(&c.InteractivePresence, DefaultInteractivePresence)
}

func setDefaultValue[T comparable](field *T, value T) {
	var zero T
	if *field == zero {
		*field = value
	}
}

func (c ConcurrencyConfig) validate() []error {
	var errs []error
	if c.Initial < 1 {
		errs = append(errs, fmt.Errorf("routing.concurrency.initial: must be at least 1, got %d", c.Initial))
	}
	if c.TTFTTolerance <= 1 || math.IsNaN(c.TTFTTolerance) || math.IsInf(c.TTFTTolerance, 0) {
		errs = append(errs, fmt.Errorf("routing.concurrency.ttft_tolerance: must be a number above 1, got %v", c.TTFTTolerance))
	}
	if !(c.KVHold > 0 && c.KVHold <= c.KVHigh && c.KVHigh <= 1) {
		errs = append(errs, fmt.Errorf("routing.concurrency: want 0 < kv_hold <= kv_high <= 1, got %v and %v", c.KVHold, c.KVHigh))
	}
	if c.CapHold < 0 {
		errs = append(errs, fmt.Errorf("routing.concurrency.cap_hold: must not be negative, got %v", c.CapHold))
	}
	if c.LowerPrefillTokens < 1 {
		errs = append(errs, fmt.Errorf("routing.concurrency.lower_prefill_tokens: must be at least 1, got %d", c.LowerPrefillTokens))
	}
	if c.PrefillPieceTokens < -1 {
		errs = append(errs, fmt.Errorf("routing.concurrency.prefill_piece_tokens: must be -1 (off), 0 (learnt) or a size in tokens, got %d", c.PrefillPieceTokens))
	}
	if c.ClearWithin != 0 {
		errs = append(errs, fmt.Errorf("routing.concurrency.clear_within: the clear lane was removed (it traded batch throughput for the interactive tail, off by default); delete the setting"))
	}
	if c.InteractivePresence < 0 {
		errs = append(errs, fmt.Errorf("routing.concurrency.interactive_presence: must not be negative, got %v", c.InteractivePresence))
	}
	if c.PropsPath == "" || c.PropsPath[0] != '/' {
		errs = append(errs, fmt.Errorf("routing.concurrency.props_path: must start with '/', got %q", c.PropsPath))
	}
	return errs
}

const (
	// The fit of TTFT against load: how long a point counts, the most points kept (a scrape
	// interval under 2s keeps fewer than fitMemory), the answers it needs before it judges, and
	// the least variance of the loads (requests squared) that tells a slope from noise.
	fitMemory       = 2 * time.Minute
	maxFitPoints    = 64
	minTTFTSamples  = 5
	minLoadVariance = 0.2
	// loadReportMemory is how long after its last scrape with a known load metric an engine
	// still counts as one that reports its load (a scrape may time out under load).
	loadReportMemory = time.Minute
	// propsRetry is how often an engine that did not answer its slots is asked again (it may have
	// been starting, or restarted with other flags).
	propsRetry = 30 * time.Second
	// The ratio of what requests are charged to the KV they hold: the weight of one answer in the
	// moving averages, the answers needed before the measure counts, its bounds, and how fast
	// it rises and drops at a scrape.
	kvRatioWeight   = 0.05
	minUsageSamples = 20
	minKVRatio      = 0.25
	maxKVRatio      = 16
	kvRatioStep     = 0.1
	// tokenLimitStep is the relative change of the token limit worth announcing: smaller drifts
	// of the ratio do not resize the queue at every scrape.
	tokenLimitStep = 0.02
)

// learner adapts one worker's limit by the law of ConcurrencyConfig. observeTTFT is called from
// any goroutine; step and setSlots only from the worker's scrape goroutine. mu guards every
// field below it.
type learner struct {
	cfg          ConcurrencyConfig
	ceiling      int64
	tokenCeiling int64

	mu        sync.Mutex
	slots     int64 // the engine's reported slots; 0: not reported
	slowStart bool
	// newTTFT and newAnswers: the sum (seconds) and count of the times to first token observed
	// since the last step; points: the steps that had some, within fitMemory, oldest first.
	newTTFT    float64
	newAnswers int
	points     []ttftPoint
	// reported: the engine answered a scrape with a known load metric, the last at reportedAt.
	reported   bool
	reportedAt time.Time
	probedAt   time.Time // last /props request
	sawWaiting bool      // the last scrape saw requests waiting inside the engine
	cap        int64     // the running count when the engine last queued; 0: none
	capUntil   time.Time // when cap stops holding
	kvTokens   int64     // the KV cache size the engine states; 0: none
	kvRatio    float64   // the ratio applied: the token limit is kvTokens x kvRatio
	// charged and held are moving averages of what an answered request was charged and the KV
	// it held; usageSamples counts the answers they saw.
	charged, held float64
	usageSamples  int
}

func newLearner(cfg ConcurrencyConfig, ceiling, tokenCeiling int64) *learner {
	return &learner{cfg: cfg, ceiling: ceiling, tokenCeiling: tokenCeiling, slowStart: true, kvRatio: 1}
}

// observeUsage feeds one answer's usage, for a request that was charged tokens, into the
// measure of charge over KV held. Estimated usage (the engine reported none) says nothing about
// the engine and is ignored.
func (l *learner) observeUsage(charged int64, o Outcome) {
	if o.UsageEstimated || o.PromptTokens <= 0 || charged <= 0 {
		return
	}
	held := max(1, int64(o.PromptTokens)-int64(max(o.CachedTokens, 0))+int64(max(o.CompletionTokens, 0)))
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.usageSamples == 0 {
		l.charged, l.held = float64(charged), float64(held)
	} else {
		l.charged += kvRatioWeight * (float64(charged) - l.charged)
		l.held += kvRatioWeight * (float64(held) - l.held)
	}
	l.usageSamples++
}

// stepKVRatio moves the applied ratio once, at a scrape, by the law of ConcurrencyConfig.
func (l *learner) stepKVRatio(sig loadSignals) {
	l.mu.Lock()
	defer l.mu.Unlock()
	full := sig.fresh && (sig.kvUsage >= l.cfg.KVHigh || sig.waiting > 0 && sig.kvUsage >= l.cfg.KVHold)
	switch {
	case full:
		l.kvRatio *= 1 - kvRatioStep
	case l.usageSamples < minUsageSamples:
	default:
		measured := l.charged / l.held
		if measured < l.kvRatio {
			l.kvRatio = measured
		} else if !(sig.fresh && sig.kvUsage >= l.cfg.KVHold) {
			l.kvRatio = min(measured, l.kvRatio*(1+kvRatioStep))
		}
	}
	l.kvRatio = min(max(l.kvRatio, minKVRatio), maxKVRatio)
}

// setKVTokens records the KV cache size the engine stated at its last scrape (0: none).
func (l *learner) setKVTokens(n int64) {
	l.mu.Lock()
	l.kvTokens = n
	l.mu.Unlock()
}

func (l *learner) statedKVTokens() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.kvTokens
}

// tokenLimit is the token limit the law gives now: the ceiling, or the engine's KV cache times
// the learned ratio under it.
func (l *learner) tokenLimit() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.kvTokens <= 0 {
		return l.tokenCeiling
	}
	return max(1, min(l.tokenCeiling, int64(float64(l.kvTokens)*l.kvRatio)))
}

// initial is the limit before anything is learned.
func (l *learner) initial() int64 { return min(int64(l.cfg.Initial), l.ceiling) }

// observeTTFT feeds one streamed answer's time to first token; the next step counts it.
func (l *learner) observeTTFT(d time.Duration) {
	if d <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.newTTFT += d.Seconds()
	l.newAnswers++
}

// ttftPoint is one step's evidence of the time to first token: the mean (seconds) of the
// answers that came back since the step before, at the peak requests in flight then (load).
type ttftPoint struct {
	at         time.Time
	load, ttft float64
	answers    int
}

// loadSignals is what one scrape tells the learner.
type loadSignals struct {
	now              time.Time
	fresh            bool // the engine answered this scrape with known load metrics
	running, waiting int64
	kvUsage          float64
	inFlight         int64 // every replica's requests on the worker: ours plus others'
}

// step applies the control law once and returns the new limit.
func (l *learner) step(limit int64, sig loadSignals) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The answers since the last step are one point of the fit, at the peak load they came
	// back under; then they are spent: no later step acts on them again.
	answered := l.newAnswers > 0
	if answered {
		l.addPoint(ttftPoint{at: sig.now, load: float64(sig.inFlight), ttft: l.newTTFT / float64(l.newAnswers), answers: l.newAnswers})
		l.newTTFT, l.newAnswers = 0, 0
	}
	if sig.fresh {
		l.reported, l.reportedAt = true, sig.now
	}
	if l.slots > 0 {
		return min(l.slots, l.ceiling)
	}
	// A request that has just arrived waits inside the engine until its next scheduling step,
	// so one scrape that sees a queue proves nothing; two in a row do. An engine that reports
	// its KV cache (vLLM, SGLang) admits every step while its cache has room, so there a queue
	// counts only once the cache is nearly full (kv_hold): under steady churn nearly every
	// scrape catches an arrival.
	waiting := sig.fresh && sig.waiting > 0 && (sig.kvUsage == 0 || sig.kvUsage >= l.cfg.KVHold)
	queueing := waiting && l.sawWaiting
	l.sawWaiting = waiting
	next := limit
	switch {
	case queueing:
		next = min(limit-1, sig.running)
		l.cap, l.capUntil = max(1, next), sig.now.Add(l.cfg.CapHold)
	case sig.fresh && sig.kvUsage >= l.cfg.KVHigh:
		next = limit - 1
	case sig.fresh && sig.kvUsage >= l.cfg.KVHold:
	case sig.inFlight < max(1, limit-(limit+4)/5):
	case answered && !l.reportsLoad(sig.now) && l.pastKnee(sig.inFlight):
		next = limit - max(1, limit/10)
	case l.slowStart:
		next = limit * 2
	default:
		next = limit + 1
	}
	if next < limit {
		l.slowStart = false
	}
	if next > limit && l.cap > 0 && sig.now.Before(l.capUntil) {
		next = max(limit, l.cap)
	}
	return max(1, min(next, l.ceiling))
}

// reportsLoad says whether the engine answered a scrape with a known load metric within
// loadReportMemory of now: its own queue and KV cache, not TTFT, then say when it is past its
// knee. l.mu is held.
func (l *learner) reportsLoad(now time.Time) bool {
	return l.reported && now.Sub(l.reportedAt) < loadReportMemory
}

// addPoint keeps p and forgets the points older than fitMemory. l.mu is held.
func (l *learner) addPoint(p ttftPoint) {
	i := 0
	for i < len(l.points) && p.at.Sub(l.points[i].at) > fitMemory {
		i++
	}
	l.points = append(l.points[i:], p)
	if len(l.points) > maxFitPoints {
		l.points = l.points[len(l.points)-maxFitPoints:]
	}
}

// pastKnee says whether the present load n is past the engine's knee, by the least-squares line
// of TTFT against load through the points at loads up to n (TTFT at higher loads says nothing
// of n): it is when, with enough answers and loads spread enough to tell a slope from noise,
// the line has TTFT at n above TTFTTolerance times TTFT at n/2. Call it right after addPoint,
// which forgets the points past fitMemory. l.mu is held.
func (l *learner) pastKnee(n int64) bool {
	var w, sx, sy, sxx, sxy float64
	answers := 0
	for _, p := range l.points {
		if p.load > float64(n) {
			continue
		}
		w++
		sx += p.load
		sy += p.ttft
		sxx += p.load * p.load
		sxy += p.load * p.ttft
		answers += p.answers
	}
	if answers < minTTFTSamples {
		return false
	}
	mx, my := sx/w, sy/w
	vx := sxx/w - mx*mx
	if vx < minLoadVariance {
		return false
	}
	slope := (sxy/w - mx*my) / vx
	at := func(x float64) float64 { return my + slope*(x-mx) }
	return at(float64(n)) > l.cfg.TTFTTolerance*at(float64(n)/2)
}

// setSlots records the slots the engine reported (0: it reported none).
func (l *learner) setSlots(n int64) {
	l.mu.Lock()
	l.slots = n
	l.mu.Unlock()
}

// probeDue reports whether the engine's slots should be asked (again) now, and marks the ask.
func (l *learner) probeDue(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.probedAt.IsZero() && now.Sub(l.probedAt) < propsRetry {
		return false
	}
	l.probedAt = now
	return true
}

// probeFailed makes the next probeDue true: the last ask got no answer.
func (l *learner) probeFailed() {
	l.mu.Lock()
	l.probedAt = time.Time{}
	l.mu.Unlock()
}

func (l *learner) source() LimitSource {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slots > 0 {
		return LimitEngine
	}
	return LimitLearned
}

// maxSlots bounds a reported slot count, so an absurd answer cannot overflow anything.
const maxSlots = 1 << 20

// engineSlots asks w's engine for its slots: llama.cpp's server answers GET /props with
// `total_slots`. 0 with a nil error means the engine answered but reports none.
func (p *Pool) engineSlots(ctx context.Context, w *Worker) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Scrape.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url.JoinPath(p.cfg.Concurrency.PropsPath).String(), nil)
	if err != nil {
		return 0, err
	}
	w.Authorize(req.Header)
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return 0, nil
	}
	var props struct {
		TotalSlots int64 `json:"total_slots"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&props); err != nil {
		return 0, nil
	}
	return min(max(props.TotalSlots, 0), maxSlots), nil
}

// learnLimit runs after every scrape of w: it sizes w's token limit unless the config fixes it,
// asks the engine's slots when due and, unless the config fixes w's concurrency limit, applies
// the control law and announces a changed limit.
func (p *Pool) learnLimit(ctx context.Context, w *Worker, fresh bool) {
	l := w.learner
	if !w.tokensFixed {
		p.sizeTokenLimit(w, fresh)
	}
	// A fixed limit's engine is asked too: whether it runs fixed slots decides how a whole
	// answer is asked of it (Worker.SlotEngine).
	if l.probeDue(p.now()) {
		n, err := p.engineSlots(ctx, w)
		if err != nil {
			// No answer (the engine is busy or starting): ask again at the next scrape, not
			// in propsRetry, so a slot engine is not sent more than its slots for long.
			l.probeFailed()
		} else {
			l.setSlots(n)
			w.slots.Store(n)
		}
	}
	if w.fixed {
		return
	}
	sig := loadSignals{now: p.now(), fresh: fresh, inFlight: max(w.peak.Swap(w.InFlight()), w.InFlight())}
	if fresh {
		r := w.Load()
		sig.running, sig.waiting, sig.kvUsage = r.Running, r.Waiting, r.KVUsage
		sig.inFlight += w.load.others.Load()
	}
	old := w.limit.Load()
	next := l.step(old, sig)
	if next != old {
		w.limit.Store(next)
		p.logger.Info("worker concurrency limit", "worker", w.spec.ID, "from", old, "to", next, "source", l.source(),
			"running", sig.running, "waiting", sig.waiting, "kv_usage", sig.kvUsage)
		p.changes.notify()
	}
}

// sizeTokenLimit sets w's token limit from the KV cache its engine stated at the last scrape
// (when fresh) and the ratio stepped by its load then, and announces a change worth it
// (tokenLimitStep, or the engine starting or stopping to state its cache).
func (p *Pool) sizeTokenLimit(w *Worker, fresh bool) {
	l := w.learner
	sig := loadSignals{fresh: fresh}
	if fresh {
		r := w.Load()
		l.setKVTokens(r.KVTokens)
		sig.waiting, sig.kvUsage = r.Waiting, r.KVUsage
	}
	l.stepKVRatio(sig)
	old, next := w.tokenLimit.Load(), l.tokenLimit()
	if next == old || (next == l.tokenCeiling) == (old == l.tokenCeiling) && math.Abs(float64(next-old)) < tokenLimitStep*float64(old) {
		return
	}
	w.tokenLimit.Store(next)
	p.logger.Info("worker token limit", "worker", w.spec.ID, "from", old, "to", next, "source", w.TokenLimitSource(),
		"kv_tokens", l.statedKVTokens(), "kv_usage", sig.kvUsage, "waiting", sig.waiting)
	p.changes.notify()
}
