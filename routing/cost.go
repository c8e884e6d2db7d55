package routing

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The cost model: one per worker, learnt online from the worker's own answers, in-process.
//
// Both kinds of engine run in steps. A step computes one token of every sequence decoding and a
// chunk of the prompts being prefilled (llama-server within --batch-size, vLLM within
// max_num_batched_tokens), and costs a fixed part (reading the weights, launching kernels,
// sampling) plus a part per sequence and per token in it. So, for a request placed on a worker:
//
//	TTFT = t0 + tp·U + tb·B + tq·Q + tc·C
//	TPOT = d0 + db·B' + dc·C + dr·R
//
// where U is the request's uncached prompt tokens (in thousands), B the sequences already running
// beside it when it was placed, Q its place in the engine's own queue (0 when it is admitted at
// once; k when k-1 requests wait before it), C the prompt tokens (thousands) of the other requests
// still in prefill there, and B' the sequences running beside it while it decodes (the mean of B
// at placement and at its end). In the TTFT law C is less what the engine has prefilled of them
// since the end of its last step usher saw, at the rate the law has learnt (tp): a request
// arriving late in a long prefill step waits only for the rest of it (prefilledSinceStep).
// t0 is a step and the HTTP round trip; tp the prefill time per
// uncached token (a long prompt's extra steps amortised in it); tb what each running sequence
// adds to the steps that prefill the prompt (and to the half step in progress it waits for); tq
// the wait per request ahead in the queue (about a request's service time over the engine's
// slots); tc what other prompts in prefill share of the same steps. d0 is a decode step alone,
// db what each sequence adds to it, dc and dr the prefill chunks of newcomers that share the
// steps: R is the prompt tokens (thousands, estimates) placed on the worker per second lately,
// of which a share of every second goes to prefill instead of decode.
//
// The idle step, which the default TPOT objectives are relative to (PredictIdle), is learnt apart
// from the TPOT law, from what a stream shows of the steps themselves:
//
//	step = s0 + s1·B'
//
// fitted to each streamed answer's median gap between events (Outcome.MedianGap): a decode step
// of its batch, the steps that prefilled other prompts beside it being the fewer. A worker that
// never idles (a batch flood) gives the TPOT law the same B', C and R in every answer, and the law
// cannot tell d0 from the flood's share of each second: it put much of the flood there
// (llama-server beside a prefill-heavy flood, whose TPOT alone measured 10-13 ms, learnt an idle
// step of 25-27 ms; the simulators 26 against 13). A decode step grows with the sequences it
// runs, not with the prompts prefilled in other steps: learnt so, the simulators' idle step
// beside the flood is the one alone. (A slot engine always full still runs its B' near one
// value, and s0 takes some of s1 B' there: llama-server's two slots, 19-22 ms against 11-12.)
//
// Where the engine's queue begins: an engine that reports slots (llama-server's /props
// total_slots) queues what is in flight beyond them; another (vLLM) admits while its KV cache has
// room and says how many wait on its /metrics, which counts when the reading is fresh and its
// cache nearly full (at least ConcurrencyConfig.KVHold, or its use unreported).
//
// The times learnt are the engine's: TTFT from sending the request to its first event
// (Outcome.TTFT, streamed answers only), and the rest of the answer (Outcome.Answered) per further
// output token; a whole answer teaches TPOT only, less the model's own TTFT.
//
// Each law is fitted by recursive least squares with exponential forgetting (costForget: the last
// few hundred answers count), robust to outliers (a residual beyond costHuber mean residuals
// counts only to there, and an answer far outside the inputs seen moves the fit by a bounded
// share), with a prior per coefficient held for good (each answer also learns that one
// coefficient is 0, with the weight of its prior, so a coefficient the inputs cannot tell apart
// stays near its prior instead of drifting), no variance grown past its prior, the per-unit
// coefficients kept non-negative as costs are (along the covariance, see nonNegative), and a fit
// that starts again when its residuals outgrow the times it learns (costLost). Memory is fixed
// (a few small arrays per worker); an answer costs a few hundred floating-point operations under
// the model's mutex (under a µs) and allocates nothing; a prediction reads the published
// coefficients without a lock.

const (
	ttftInputs = 5 // 1, U, B, Q, C
	tpotInputs = 4 // 1, B', C, R
	stepInputs = 2 // 1, B'
	// arrivalWindow is the time constant of R, the prompt tokens placed per second.
	arrivalWindow = 10 * time.Second
	maxInputs     = ttftInputs

	// costForget is the weight each answer leaves on the ones before it: about 1/(1-0.998) =
	// 500 answers make the fit, so a worker whose engine changes is relearnt within minutes.
	costForget = 0.998
	// costHuber bounds a residual to this many mean absolute residuals once the fit has
	// costMinAnswers: one answer delayed by something the model does not see (a GC pause, a
	// preemption) moves it only so far.
	costHuber = 3.0
	// costLeverage bounds the share of the fit one answer may move once the fit has
	// costMinAnswers: an answer far outside the inputs seen so far (a prompt a thousand times
	// longer) counts as much as one that moves the fit by about a third, so one absurd usage
	// report cannot swing it; inputs that really moved there are learnt within a few answers.
	costLeverage = 0.5
	// costLost is the mean residual, over the mean time learnt, at which a fit is lost and
	// starts again.
	costLost = 2.0
	// costMinAnswers is how many answers the model needs before it predicts: several per
	// coefficient.
	costMinAnswers = 32
	// maxCostTokens bounds every token count the model reads, so hostile or absurd usage
	// cannot overflow or dominate a fit; maxCostDuration bounds the times it learns from.
	maxCostTokens   = 1 << 20
	maxCostDuration = time.Hour
	// maxCostLoad bounds the sequences running and queued the model reads: far beyond any
	// engine's batch, and small enough that one absurd report cannot swamp the fit's arithmetic.
	maxCostLoad = 1 << 12
)

// Prediction is what a worker's cost model expects of one request: the time to its first token
// and the time per output token after it. TPOT is 0 while the worker has not answered enough
// requests of two or more output tokens to say.
type Prediction struct {
	TTFT time.Duration
	TPOT time.Duration
}

// PredictIdle is what w's cost model, learnt from its answers, predicts for a request of
// promptTokens prompt tokens, cachedTokens of which the engine holds in its cache, on w with
// nothing else running: its TPOT is the idle step learnt from the streams' gaps once 32
// streamed answers taught it, until then the TPOT law's. ok is false while the model has not
// learnt enough to say (fewer than 32 streamed answers). Token counts are clamped to [0, 2^20]
// and cachedTokens to promptTokens. It does no I/O, takes no lock, allocates nothing, and is
// safe for concurrent use.
func (w *Worker) PredictIdle(promptTokens, cachedTokens int) (p Prediction, ok bool) {
	c := w.cost.coefficients()
	p, ok = c.predict(uncached(promptTokens, cachedTokens), placement{})
	if ok && c.stepOK {
		p.TPOT = max(msDuration(c.step[0]), minPrediction)
	}
	return p, ok
}

// Predict is what w's cost model predicts for a request of promptTokens prompt tokens,
// cachedTokens of which the engine holds, placed on w now beside the requests in flight there
// (this gateway's, and other clients' as the engine's last fresh load report says): they share
// its steps and may put it in the engine's queue. ok is false while the model has not learnt
// enough to say. Costs a dozen atomic loads and a clock read, and no allocation; safe for
// concurrent use.
func (w *Worker) Predict(promptTokens, cachedTokens int) (p Prediction, ok bool) {
	c := w.cost.coefficients()
	return c.predict(uncached(promptTokens, cachedTokens), w.placementNow(w.inFlight.Load()))
}

// Predicted is what the cost model of the lease's worker predicted, when the request was placed
// (the coefficients and the worker's load then), for the token counts of o, the outcome the
// request came back with: the model's error alone, apart from the gateway's estimate of the
// prompt. ok is false when the model could not say then or o carries no usage.
func (l *Lease) Predicted(o Outcome) (p Prediction, ok bool) {
	if o.PromptTokens <= 0 {
		return Prediction{}, false
	}
	return l.coef.predict(uncached(o.PromptTokens, o.CachedTokens), l.placed)
}

// uncached is the prompt tokens the engine must compute, both counts clamped to the model's range.
func uncached(promptTokens, cachedTokens int) float64 {
	p := min(max(promptTokens, 0), maxCostTokens)
	c := min(max(cachedTokens, 0), p)
	return float64(p - c)
}

// placement is a worker's load as a request placed on it sees it (see the laws above).
type placement struct {
	running    float64 // B: sequences running beside it
	queued     float64 // Q: its place in the engine's queue, 0 when admitted at once
	prefilling float64 // C: prompt tokens of the others in prefill (estimates)
	prefilled  float64 // of those, the tokens the engine has prefilled since its last step end
	arrivals   float64 // R: prompt tokens placed on the worker per second lately (estimates)
}

// placementNow is w's load for a request placed beside others of this gateway's requests.
func (w *Worker) placementNow(others int64) placement {
	others = min(max(others, 0), maxSlots)
	t := w.cost.now()
	now := t.UnixNano()
	var waiting int64
	if at := w.load.at.Load(); at != 0 && now-at <= int64(w.cost.maxAge) {
		others += min(max(w.load.others.Load(), 0), maxSlots)
		// An engine that reports its KV cache (vLLM, SGLang) admits at every step while the cache
		// has room: what waits then arrived since the last step and is admitted at the next,
		// beside the request, not before it (the learner reads it so too, see
		// ConcurrencyConfig). Counted as a queue, a scrape that caught one arrival put every
		// request placed in the next seconds behind it.
		if kv := math.Float64frombits(w.load.kvUsage.Load()); !(kv > 0) || kv >= w.cost.kvHold {
			waiting = min(max(w.load.waiting.Load(), 0), maxSlots)
		}
	}
	pl := placement{prefilling: float64(min(max(w.promptsInPrefill.Load(), 0), maxCostTokens)),
		arrivals: w.cost.arrivals.perSecond(t)}
	if pl.prefilling > 0 {
		pl.prefilled = w.prefilledSinceStep(now)
	}
	if slots := w.slots.Load(); slots > 0 {
		pl.running = float64(min(others, slots, maxCostLoad))
		pl.queued = float64(min(max(others+1-slots, 0), maxCostLoad))
		return pl
	}
	if waiting > 0 {
		pl.queued = float64(min(waiting+1, maxCostLoad))
	}
	pl.running = float64(min(max(others-waiting, 0), maxCostLoad))
	return pl
}

// bounded is pl with each count in the model's range: [0, maxCostLoad] sequences and [0,
// maxCostTokens] tokens.
func (pl placement) bounded() placement {
	return placement{running: bounded(pl.running, maxCostLoad), queued: bounded(pl.queued, maxCostLoad),
		prefilling: bounded(pl.prefilling, maxCostTokens), prefilled: bounded(pl.prefilled, maxCostTokens),
		arrivals: bounded(pl.arrivals, maxCostTokens)}
}

// bounded is v within [0, most], 0 when it is not a number.
func bounded(v, most float64) float64 {
	if !(v > 0) {
		return 0
	}
	return min(v, most)
}

// prefilledSinceStep is how many prompt tokens w's engine has prefilled since the end of its last
// step usher saw (stepAt), at the rate its TTFT law has learnt: the prompts in prefill when a
// request is placed went into the step in progress, which it waits for only as long as that
// step has yet to run. (Prompts placed since that step began wait for the next one beside the
// request; they are read as begun too, so the progress is over-read by at most them.) 0 while
// the law does not predict or no step end was seen. No lock.
func (w *Worker) prefilledSinceStep(now int64) float64 {
	at := w.stepAt.Load()
	perK, ok := w.cost.prefillCost()
	if at == 0 || now <= at || !ok || !(perK > 0) {
		return 0
	}
	return min(float64(now-at)/float64(time.Millisecond)/perK*1000, maxCostTokens)
}

// stepEnded records that w's engine ended a step at now (unix ns), unless one was recorded
// within stepGrain before: the sequences of one step come back within microseconds of each other.
// A mark ahead of now (the wall clock set back) is replaced.
func (w *Worker) stepEnded(now int64) {
	if d := now - w.stepAt.Load(); d >= int64(stepGrain) || d < 0 {
		w.stepAt.Store(now)
	}
}

// stepGrain is the least time between two step ends a worker records: shorter than any engine
// step, and long enough that the streams of one step do not each write the mark.
const stepGrain = 100 * time.Microsecond

func (pl placement) ttftInputs(u float64) [maxInputs]float64 {
	return [maxInputs]float64{1, u / 1000, pl.running, pl.queued, max(pl.prefilling-pl.prefilled, 0) / 1000}
}

func (pl placement) tpotInputs(running float64) [maxInputs]float64 {
	return [maxInputs]float64{1, running, pl.prefilling / 1000, pl.arrivals / 1000}
}

// The prior variance of each coefficient (ms², per unit of its input), ttft's then tpot's: wide
// against real costs (a CPU engine may take seconds per thousand prompt tokens), so the answers
// decide; but narrower for what a running sequence adds to a step than for the step itself, so
// that while the load does not vary (a worker always full) the fit puts the time it sees in the
// step, not in a load it cannot tell apart, and predicts for another load what it saw rather
// than an extrapolation.
var (
	ttftPrior = [maxInputs]float64{1e6, 1e8, 1e4, 1e8, 1e6}
	tpotPrior = [maxInputs]float64{1e4, 1e3, 1e4, 1e4}
	stepPrior = [maxInputs]float64{1e4, 1e3}
)

// costCoefficients is a snapshot of a cost model's fit.
type costCoefficients struct {
	ttft, tpot, step       [maxInputs]float64 // ms per unit of each input
	ttftOK, tpotOK, stepOK bool
}

func (c *costCoefficients) predict(u float64, pl placement) (Prediction, bool) {
	if !c.ttftOK {
		return Prediction{}, false
	}
	// A learnt law that fits at or below zero (an engine faster than the clock tells, as a test's
	// canned answers) predicts the least time there is, not 0, which would read as "not learnt".
	p := Prediction{TTFT: max(msDuration(dot(&c.ttft, pl.ttftInputs(u), ttftInputs)), minPrediction)}
	if c.tpotOK {
		p.TPOT = max(msDuration(dot(&c.tpot, pl.tpotInputs(pl.running), tpotInputs)), minPrediction)
	}
	return p, true
}

func dot(theta *[maxInputs]float64, x [maxInputs]float64, n int) float64 {
	var s float64
	for i := range n {
		s += theta[i] * x[i]
	}
	return s
}

// msDuration turns a prediction in ms into a duration, at least 0 and at most maxCostDuration.
// minPrediction is the least time a learnt law predicts.
const minPrediction = time.Microsecond

func msDuration(ms float64) time.Duration {
	if !(ms > 0) {
		return 0
	}
	return time.Duration(min(ms*float64(time.Millisecond), float64(maxCostDuration)))
}

// costModel is one worker's cost model. observe is called from any goroutine (each Release);
// coefficients reads the published fit without the lock.
type costModel struct {
	now    func() time.Time
	maxAge time.Duration // a load report older than this is not used (ScrapeConfig.MaxAge)
	// kvHold is the KV-cache use (ConcurrencyConfig.KVHold) below which the requests an engine
	// reports waiting are not a queue (see placementNow).
	kvHold float64

	mu               sync.Mutex // guards ttft, tpot and step
	ttft, tpot, step costFit
	// largestPrompt is the largest uncached prompt among the worker's answers lately (each answer
	// discounts it by costForget), meanPrompt a moving mean of them (tokens); both guarded by mu.
	largestPrompt, meanPrompt float64
	// longestGap is the longest time between two events of a stream among the worker's streamed
	// answers lately (ms, each streamed answer discounts it by costForget; 0: none seen); guarded
	// by mu.
	longestGap float64
	// arrivals measures R, the prompt tokens placed on the worker per second (see Pool.lease).
	arrivals arrivalRate
	// meanOutput is a moving mean of the output tokens of the worker's answers (math.Float64bits;
	// 0: none seen), as placements read it without the lock.
	meanOutput atomic.Uint64
	// warnedAt is when Pool.checkObjective last warned of the worker (unix ns; 0: never).
	warnedAt atomic.Int64

	// ttftPub, tpotPub and stepPub are the fits as of the last answer, as predictions read them.
	ttftPub, tpotPub, stepPub publishedFit
}

// publishedFit is a fit as predictions read it, without the lock its model learns under: its
// coefficients as math.Float64bits, and whether it has learnt from costMinAnswers answers.
type publishedFit struct {
	theta [maxInputs]atomic.Uint64
	ok    atomic.Bool
}

// publish makes the first n coefficients of f, and whether it has learnt enough, visible to
// load; the caller holds the lock f is learnt under.
func (p *publishedFit) publish(f *costFit, n int) {
	for i := range n {
		p.theta[i].Store(math.Float64bits(f.theta[i]))
	}
	p.ok.Store(f.answers >= costMinAnswers)
}

// load is the first n coefficients published and whether they predict. No lock.
func (p *publishedFit) load(n int) (theta [maxInputs]float64, ok bool) {
	ok = p.ok.Load()
	for i := range n {
		theta[i] = math.Float64frombits(p.theta[i].Load())
	}
	return theta, ok
}

func newCostModel(now func() time.Time, maxAge time.Duration, kvHold float64) *costModel {
	c := &costModel{now: now, maxAge: maxAge, kvHold: kvHold}
	c.ttft.reset(ttftInputs, &ttftPrior)
	c.tpot.reset(tpotInputs, &tpotPrior)
	c.step.reset(stepInputs, &stepPrior)
	return c
}

// prefillCost is the TTFT law's prefill time per thousand uncached prompt tokens (ms, tp), and
// whether the law predicts. Two atomic loads.
func (c *costModel) prefillCost() (float64, bool) {
	return math.Float64frombits(c.ttftPub.theta[1].Load()), c.ttftPub.ok.Load()
}

// decodeCost is what one more sequence adds to each of the worker's steps (ms, the TPOT law's
// coefficient of a running sequence, 0 while it does not predict) and the mean output tokens of
// its answers lately (0: none seen). Three atomic loads.
func (c *costModel) decodeCost() (perSequence, meanOutput float64) {
	if c.tpotPub.ok.Load() {
		perSequence = max(math.Float64frombits(c.tpotPub.theta[1].Load()), 0)
	}
	return perSequence, math.Float64frombits(c.meanOutput.Load())
}

func (c *costModel) coefficients() costCoefficients {
	var k costCoefficients
	k.ttft, k.ttftOK = c.ttftPub.load(ttftInputs)
	k.tpot, k.tpotOK = c.tpotPub.load(tpotInputs)
	k.step, k.stepOK = c.stepPub.load(stepInputs)
	return k
}

// observe learns from one answer of a request placed at pl, with running sequences beside it
// when it ended. An answer that failed, or whose usage the gateway estimated, or that took no
// measurable time, teaches nothing.
func (c *costModel) observe(pl placement, runningAtEnd float64, o Outcome) {
	c.observeStage(pl, runningAtEnd, o, nil)
}

// observeStage is observe for an answer of a decode stage when handoff is not nil: the fit, when
// placed, of its worker's hand-off model (handoff.go). The first token of a decode comes after
// the KV transfer, not after a prefill of its uncached tokens (one), so a whole answer's TPOT is
// what follows the hand-off that model predicts; while it cannot say, the answer teaches no
// TPOT. The TTFT law has no say there: it is learnt from the prompts the worker prefills
// itself, and its extrapolation to one token taught a decode worker serving interactive prompts
// whole (StageLocal) beside batch decodes a TPOT below its decode step.
func (c *costModel) observeStage(pl placement, runningAtEnd float64, o Outcome, handoff *handoffCoefficients) {
	if o.Failed || o.UsageEstimated || o.PromptTokens <= 0 {
		return
	}
	u := uncached(o.PromptTokens, o.CachedTokens)
	pl = pl.bounded()
	runningAtEnd = bounded(runningAtEnd, maxCostLoad)
	ttft := validDuration(o.TTFT)
	answered := validDuration(o.Answered)
	outputs := min(max(o.CompletionTokens, 0), maxCostTokens)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.largestPrompt = max(u, c.largestPrompt*costForget)
	c.meanPrompt += (u - c.meanPrompt) / 32
	if outputs > 0 {
		mean := math.Float64frombits(c.meanOutput.Load())
		c.meanOutput.Store(math.Float64bits(mean + (float64(outputs)-mean)/32))
	}
	if gap := validDuration(o.LongestGap); gap > 0 {
		c.longestGap = max(ms(gap), c.longestGap*costForget)
	}
	if gap := validDuration(o.MedianGap); gap > 0 {
		x := [maxInputs]float64{1, (pl.running + runningAtEnd) / 2}
		c.step.update(&x, ms(gap))
	}
	if ttft > 0 {
		x := pl.ttftInputs(u)
		c.ttft.update(&x, ms(ttft))
	}
	if outputs >= 2 && answered > 0 {
		first := ms(ttft)
		switch {
		case ttft > 0:
		case handoff != nil:
			// A decode's whole answer: its first token came after the hand-off.
			h, ok := handoff.predict(o.PromptTokens, pl.running)
			if !ok {
				c.publish()
				return
			}
			first = ms(h)
		default:
			// A whole answer: its first token came when the model says it would.
			if c.ttft.answers < costMinAnswers {
				c.publish()
				return
			}
			first = dot(&c.ttft.theta, pl.ttftInputs(u), ttftInputs)
		}
		if decode := ms(answered) - first; decode > 0 {
			x := pl.tpotInputs((pl.running + runningAtEnd) / 2)
			c.tpot.update(&x, decode/float64(outputs-1))
		}
	}
	c.publish()
}

// publish makes the fit visible to coefficients; c.mu is held.
func (c *costModel) publish() {
	c.ttftPub.publish(&c.ttft, ttftInputs)
	c.tpotPub.publish(&c.tpot, tpotInputs)
	c.stepPub.publish(&c.step, stepInputs)
}

func validDuration(d time.Duration) time.Duration {
	if d <= 0 || d > maxCostDuration {
		return 0
	}
	return d
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// costFit is one law's recursive least squares: theta the coefficients, p their covariance
// (over the first n inputs), absResidual a moving mean of the absolute residual, answers the
// answers learnt from (saturating). A fit whose residuals grow larger than the times it learns
// explains nothing (absurd answers taught it, or the engine changed beyond recognition): it
// starts again.
type costFit struct {
	n           int
	prior       *[maxInputs]float64 // the prior variances, immutable
	theta       [maxInputs]float64
	p           [maxInputs][maxInputs]float64
	absResidual float64
	absValue    float64 // a moving mean of the times learnt, ms
	answers     int
}

func (f *costFit) reset(n int, prior *[maxInputs]float64) {
	*f = costFit{n: n, prior: prior}
	for i := range n {
		f.p[i][i] = prior[i]
	}
}

// update learns y (ms) at inputs x.
func (f *costFit) update(x *[maxInputs]float64, y float64) {
	n := f.n
	var px [maxInputs]float64
	var xpx float64
	for i := range n {
		for j := range n {
			px[i] += f.p[i][j] * x[j]
		}
		xpx += x[i] * px[i]
	}
	forget := costForget
	e := y - dot(&f.theta, *x, n)
	residual := math.Abs(e)
	weight := 1.0
	if f.answers >= costMinAnswers {
		// The scale learns from residuals bounded too, so that a steady share of absurd
		// answers cannot inflate it, and with it the bound, without end.
		residual = min(residual, 2*f.absResidual)
		if f.absResidual > 0 {
			bound := costHuber * f.absResidual
			e = max(-bound, min(e, bound))
		}
		if xpx > costLeverage {
			weight = costLeverage / xpx
		}
	}
	denom := forget/weight + xpx
	for i := range n {
		f.theta[i] += px[i] / denom * e
	}
	for i := range n {
		for j := i; j < n; j++ {
			// Symmetric by construction: rounding cannot make the covariance lopsided.
			f.p[i][j] = (f.p[i][j] - px[i]*px[j]/denom) / forget
			f.p[j][i] = f.p[i][j]
		}
	}
	// Forgetting inflates the covariance in the directions the inputs do not move in (a worker
	// always idle says nothing of its load), which would wind up without bound: no variance
	// grows past its prior. Scaling row and column i alike keeps the covariance positive.
	var scale [maxInputs]float64
	for i := range n {
		scale[i] = 1
		if f.p[i][i] > f.prior[i] {
			scale[i] = math.Sqrt(f.prior[i] / f.p[i][i])
		}
	}
	for i := range n {
		for j := range n {
			f.p[i][j] *= scale[i] * scale[j]
		}
	}
	moved := f.nonNegative(x)
	if f.answers == 0 {
		f.absResidual, f.absValue = residual, math.Abs(y)
	} else {
		f.absResidual += (residual - f.absResidual) / 32
		f.absValue += (math.Abs(y) - f.absValue) / 32
	}
	f.answers = min(f.answers+1, math.MaxInt32)
	moved += f.regularise(f.answers%n, x)
	// A fit whose costs could be kept non-negative only by moving its prediction where it just
	// learnt further than the times it learns is lost as well (absurd answers taught it).
	if !f.finite() || moved > costLost*f.absValue || f.answers >= costMinAnswers && f.absResidual > costLost*f.absValue {
		f.reset(n, f.prior)
	}
}

// regularise learns that coefficient i is 0, with the weight that, repeated every n answers
// under forgetting, holds the prior on it for good: forgetting discounts the prior with the
// answers, and a coefficient the inputs cannot tell apart from another (the load of a worker
// always full, beside its step) would otherwise drift where noise takes it. It returns how far
// keeping the costs non-negative then moved the prediction at x.
func (f *costFit) regularise(i int, x *[maxInputs]float64) (moved float64) {
	weight := float64(f.n) * (1 - costForget) / f.prior[i]
	denom := 1/weight + f.p[i][i]
	var pi [maxInputs]float64
	for j := range f.n {
		pi[j] = f.p[j][i]
	}
	e := -f.theta[i]
	for j := range f.n {
		f.theta[j] += pi[j] / denom * e
	}
	for j := range f.n {
		for k := j; k < f.n; k++ {
			f.p[j][k] -= pi[j] * pi[k] / denom
			f.p[k][j] = f.p[j][k]
		}
	}
	return f.nonNegative(x)
}

// nonNegative holds the per-unit coefficients at 0 or above, as costs are, and returns how far
// that moved the fit's prediction at x (ms). A coefficient that noise pushed below 0 is set to 0
// along the covariance: the others move by what they share with it, as a fit that knew it was 0
// would have them, so the fit's predictions where it learnt stay about where they were. Set to 0
// alone, a coefficient whose input barely varies beside another (the sequences running on a
// slot engine, two or three, beside the step) would leave the other off by its share at every
// answer, and the fit would chase its own correction without end (it did: a slot engine's TPOT
// fit grew past 1e10 ms within a hundred answers). The most negative goes first; a move can push
// another below 0, so at most n passes, then any left is held at 0.
func (f *costFit) nonNegative(x *[maxInputs]float64) (moved float64) {
	before := dot(&f.theta, *x, f.n)
	for range f.n {
		worst := 0
		for i := 1; i < f.n; i++ {
			if f.theta[i] < 0 && (worst == 0 || f.theta[i] < f.theta[worst]) {
				worst = i
			}
		}
		if worst == 0 {
			break
		}
		if d := f.p[worst][worst]; d > 0 {
			k := f.theta[worst] / d
			for j := range f.n {
				f.theta[j] -= f.p[j][worst] * k
			}
		}
		f.theta[worst] = 0
	}
	for i := 1; i < f.n; i++ {
		f.theta[i] = max(f.theta[i], 0)
	}
	return math.Abs(dot(&f.theta, *x, f.n) - before)
}

func (f *costFit) finite() bool {
	for i := range f.n {
		if math.IsNaN(f.theta[i]) || math.IsInf(f.theta[i], 0) {
			return false
		}
		for j := range f.n {
			if math.IsNaN(f.p[i][j]) || math.IsInf(f.p[i][j], 0) {
				return false
			}
		}
	}
	return !math.IsNaN(f.absResidual) && !math.IsInf(f.absResidual, 0) && !math.IsNaN(f.absValue) && !math.IsInf(f.absValue, 0)
}

// arrivalRate is a rate of tokens per second, each arrival weighted by exp(-age/arrivalWindow):
// the recent rate, in fixed memory. Safe for concurrent use: mu serialises add; perSecond reads
// without it (a reading between add's two stores is off by one arrival's decay, no more).
type arrivalRate struct {
	mu   sync.Mutex
	rate atomic.Uint64 // tokens per second as of at, math.Float64bits
	at   atomic.Int64  // unix ns; 0: no arrival yet
}

// add counts tokens arriving at now.
func (a *arrivalRate) add(now time.Time, tokens float64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rate.Store(math.Float64bits(a.perSecond(now) + bounded(tokens, maxCostTokens)/arrivalWindow.Seconds()))
	if t := now.UnixNano(); t > a.at.Load() {
		a.at.Store(t)
	}
}

// perSecond is the rate at now.
func (a *arrivalRate) perSecond(now time.Time) float64 {
	rate, at := math.Float64frombits(a.rate.Load()), a.at.Load()
	if at == 0 || now.UnixNano() <= at {
		return rate
	}
	return rate * math.Exp(-float64(now.UnixNano()-at)/float64(arrivalWindow))
}

// An engine runs in steps and does not stop one: an interactive prompt that arrives while a
// step prefills a long lower-class prompt waits for that step, then needs its own prefill. So
// the default interactive TTFT objective (InteractiveObjective: a factor of the idle prediction
// plus one step) holds only while one step prefills no more than the objective leaves beside the
// interactive prompt's own time: with TTFT = t0 + tp·U on an idle worker, a step of s, and an
// objective of f·TTFT + s, a step of k prompt tokens costs about s + tp·k, so k must stay within
// (f-1)·TTFT/tp. A step's prompt tokens are bounded by the engine (llama-server --batch-size and
// --ubatch-size, vLLM max_num_batched_tokens), which the gateway cannot read. Two things bound a
// step as seen: the largest prompt the worker prefilled lately (its whole prefill in one step,
// as an engine that does not chunk runs it), and the longest pause between two events of the
// streams it answered lately (a chunking engine's step: each of its steps decodes the running
// streams beside a piece of prefill). The step is the smaller: a pause can be longer than a step
// only when the gateway itself was slow to read (a slow client), so it never raises the bound;
// while no stream was seen, the prompt alone bounds it. The check runs at every scrape of the
// worker and warns at most once per costWarnEvery.

// costWarnEvery is the least time between two warnings of one worker's unreachable objective.
const costWarnEvery = time.Hour

// objectiveReach is what a worker's cost model says of the interactive objective there.
type objectiveReach struct {
	prompt    int           // a typical interactive prompt, uncached tokens
	idle      time.Duration // its predicted TTFT on an idle worker
	objective time.Duration // its default objective
	largest   int           // the largest prompt prefilled lately, uncached tokens
	step      time.Duration // one engine step as seen: what an interactive prompt waits for
	// stepSeen: step is the longest pause of a stream lately, shorter than the prefill of
	// largest in one step (which step is otherwise).
	stepSeen bool
	perK     time.Duration // prefill time per thousand uncached prompt tokens (tp)
	chunk    int           // the most prompt tokens a step may prefill for the objective to hold
}

// unreachable reports whether one engine step as seen alone takes longer than the objective.
func (r objectiveReach) unreachable() bool { return r.step > r.objective }

// reach is what the model says of the default interactive objective for an interactive prompt
// of prompt tokens (the worker's mean prompt when prompt is not positive). ok is false while the
// model cannot predict or has learnt no prefill time. Takes the model's mutex; no allocation.
func (c *costModel) reach(prompt int) (r objectiveReach, ok bool) {
	c.mu.Lock()
	largest, mean, gap := c.largestPrompt, c.meanPrompt, c.longestGap
	c.mu.Unlock()
	k := c.coefficients()
	if prompt <= 0 {
		prompt = int(mean)
	}
	tp := k.ttft[1] // ms per thousand uncached tokens
	if !k.ttftOK || prompt <= 0 || !(tp > 0) {
		return objectiveReach{}, false
	}
	r = objectiveReach{prompt: min(prompt, maxCostTokens), largest: int(largest), perK: msDuration(tp)}
	idle, _ := k.predict(float64(r.prompt), placement{})
	r.idle = idle.TTFT
	r.objective = InteractiveObjective(idle)
	r.step = msDuration(tp * largest / 1000)
	if seen := msDuration(gap); gap > 0 && seen < r.step {
		r.step, r.stepSeen = seen, true
	}
	r.chunk = int(max(ms(r.objective-r.idle-max(idle.TPOT, 0)), 0) / tp * 1000)
	return r, true
}

// checkObjective, run at every scrape of w, warns at most once per costWarnEvery when w's cost
// model says the default interactive TTFT objective cannot hold there: one engine step as seen
// (see objectiveReach) would alone take longer. The warning names the
// worker, the figures and the engine setting to lower.
func (p *Pool) checkObjective(w *Worker) {
	r, ok := w.cost.reach(int(p.interactivePrompt.Load()))
	if !ok || !r.unreachable() {
		return
	}
	now := p.now().UnixNano()
	if last := w.cost.warnedAt.Load(); last != 0 && now-last < int64(costWarnEvery) || !w.cost.warnedAt.CompareAndSwap(last, now) {
		return
	}
	fix := fmt.Sprintf("cap the engine's prefill step at about %d tokens: llama-server -b %d -ub %d, vLLM --max-num-batched-tokens %d "+
		"(chunked prefill); or state the tier's interactive objective", r.chunk, r.chunk, r.chunk, r.chunk)
	if r.chunk < minPrefillPiece {
		fix = "no step size keeps it: the engine prefills too slowly for the default objective; state the tier's interactive objective, or serve interactive requests from a faster worker"
	}
	p.logger.Warn("interactive TTFT objective unreachable on worker: one engine step of a long prompt takes longer",
		"worker", w.spec.ID, "interactive_prompt_tokens", r.prompt, "idle_ttft_ms", r.idle.Milliseconds(),
		"ttft_objective_ms", r.objective.Milliseconds(), "largest_prompt_tokens", r.largest, "step_ms", r.step.Milliseconds(),
		"step_seen_in_streams", r.stepSeen,
		"prefill_ms_per_1k_tokens", float64(r.perK.Microseconds())/1000, "step_tokens_within_objective", r.chunk, "fix", fix)
}
