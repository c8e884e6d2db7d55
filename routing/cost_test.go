package routing

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// costLaw is a known engine: the times a request gets from its uncached prompt tokens and the
// load it was placed at, in the shape the model fits (see cost.go).
type costLaw struct {
	base, perKToken, perRunning, perQueued, perKPrefilling time.Duration // TTFT
	step, perSeq, perKPrefillingDecode, perKArrivals       time.Duration // TPOT
}

// steps is a law like the simulator's defaults: a 12 ms step, 100 µs per prompt token, a running
// sequence adding 0.5 ms to the steps of a prefill, 400 ms per request ahead in the queue.
var steps = costLaw{
	base: 15 * time.Millisecond, perKToken: 100 * time.Millisecond, perRunning: 500 * time.Microsecond,
	perQueued: 400 * time.Millisecond, perKPrefilling: 60 * time.Millisecond,
	step: 12 * time.Millisecond, perSeq: 300 * time.Microsecond, perKPrefillingDecode: 4 * time.Millisecond,
	perKArrivals: 1200 * time.Microsecond,
}

func (l costLaw) ttft(u float64, pl placement) time.Duration {
	return l.base + time.Duration(u/1000*float64(l.perKToken)) + time.Duration(pl.running*float64(l.perRunning)) +
		time.Duration(pl.queued*float64(l.perQueued)) + time.Duration(pl.prefilling/1000*float64(l.perKPrefilling))
}

func (l costLaw) tpot(pl placement) time.Duration {
	return l.step + time.Duration(pl.running*float64(l.perSeq)) + time.Duration(pl.prefilling/1000*float64(l.perKPrefillingDecode)) +
		time.Duration(pl.arrivals/1000*float64(l.perKArrivals))
}

// answer is the outcome of a streamed request of prompt tokens (cached of them) and outputs
// output tokens placed at pl under law, its times scaled by 1 ± noise.
func (l costLaw) answer(rng *rand.Rand, prompt, cached, outputs int, pl placement, noise float64) Outcome {
	jitter := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * (1 + noise*(2*rng.Float64()-1)))
	}
	ttft := jitter(l.ttft(float64(prompt-cached), pl))
	return Outcome{PromptTokens: prompt, CachedTokens: cached, CompletionTokens: outputs, CacheReported: true,
		TTFT: ttft, Answered: ttft + time.Duration(outputs-1)*jitter(l.tpot(pl))}
}

func randomPlacement(rng *rand.Rand) placement {
	pl := placement{running: float64(rng.IntN(8)), prefilling: float64(rng.IntN(3) * rng.IntN(2000)), arrivals: float64(rng.IntN(8000))}
	if pl.running == 7 {
		pl.queued = float64(rng.IntN(4))
	}
	return pl
}

// newCostWorker is a worker alone, with nothing in flight, for the cost model's tests.
func newCostWorker(now func() time.Time) *Worker {
	return &Worker{cost: newCostModel(now, 3*time.Second, DefaultKVHold)}
}

// within reports whether got is within tol (relative) of want.
func within(got, want time.Duration, tol float64) bool {
	return math.Abs(float64(got-want)) <= tol*float64(want)
}

func TestCostModelRecoversTheLaw(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := newCostWorker(time.Now)
	for range 2000 {
		prompt := 16 + rng.IntN(4000)
		cached := rng.IntN(prompt) * rng.IntN(2)
		pl := randomPlacement(rng)
		w.cost.observe(pl, pl.running, steps.answer(rng, prompt, cached, 2+rng.IntN(200), pl, 0.05))
	}
	k := w.cost.coefficients()
	wantTTFT := [ttftInputs]time.Duration{steps.base, steps.perKToken, steps.perRunning, steps.perQueued, steps.perKPrefilling}
	for i, want := range wantTTFT {
		// The small coefficients are judged against the step, the others against themselves.
		if got := msDuration(k.ttft[i]); math.Abs(float64(got-want)) > 0.1*float64(max(want, steps.base)) {
			t.Errorf("TTFT coefficient %d: got %v, want %v", i, got, want)
		}
	}
	for _, tt := range []struct {
		name           string
		prompt, cached int
		pl             placement
	}{
		{"short prompt, idle", 50, 0, placement{}},
		{"long prompt, idle", 3000, 0, placement{}},
		{"long prompt mostly cached", 3000, 2900, placement{}},
		{"beside a batch", 800, 0, placement{running: 6, prefilling: 1500, arrivals: 5000}},
		{"queued behind two", 800, 0, placement{running: 7, queued: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := w.cost.coefficients()
			got, ok := c.predict(uncached(tt.prompt, tt.cached), tt.pl)
			if !ok {
				t.Fatal("got no prediction after 2000 answers")
			}
			if want := steps.ttft(uncached(tt.prompt, tt.cached), tt.pl); !within(got.TTFT, want, 0.1) {
				t.Errorf("TTFT: got %v, want %v within 10%%", got.TTFT, want)
			}
			if want := steps.tpot(tt.pl); !within(got.TPOT, want, 0.1) {
				t.Errorf("TPOT: got %v, want %v within 10%%", got.TPOT, want)
			}
		})
	}
}

func TestCostModelIdleUnaffectedByLoadedAnswers(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	busy := func(pl placement) Outcome {
		prompt := 100 + rng.IntN(3000)
		return steps.answer(rng, prompt, 0, 50, pl, 0.05)
	}
	w := newCostWorker(time.Now)
	// Nine answers in ten came from a loaded worker, far slower than an idle one: the load
	// explains it, and the idle prediction stays the idle law's.
	for i := range 2000 {
		pl := placement{}
		if i%10 != 0 {
			pl = placement{running: float64(2 + rng.IntN(6)), queued: float64(rng.IntN(3)), prefilling: float64(rng.IntN(4000))}
		}
		w.cost.observe(pl, pl.running, busy(pl))
	}
	for _, prompt := range []int{100, 1000, 3000} {
		got, ok := w.PredictIdle(prompt, 0)
		if !ok {
			t.Fatal("PredictIdle: got no prediction")
		}
		if want := steps.ttft(float64(prompt), placement{}); !within(got.TTFT, want, 0.1) {
			t.Errorf("PredictIdle(%d): got TTFT %v, want %v within 10%%", prompt, got.TTFT, want)
		}
		if want := steps.tpot(placement{}); !within(got.TPOT, want, 0.1) {
			t.Errorf("PredictIdle(%d): got TPOT %v, want %v within 10%%", prompt, got.TPOT, want)
		}
	}
}

func TestCostModelPredictsOnlyWhenItHasLearnt(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	w := newCostWorker(time.Now)
	ask := func() bool { _, ok := w.PredictIdle(500, 0); return ok }
	taught := func(o Outcome) { w.cost.observe(placement{}, 0, o) }
	good := func() Outcome { return steps.answer(rng, 100+rng.IntN(2000), 0, 20, placement{}, 0.05) }
	for range 100 {
		// None of these teaches anything: a failure, estimated usage, no usage, a whole answer
		// (no TTFT) before the model knows TTFT, a time of zero.
		for _, o := range []Outcome{
			func() Outcome { o := good(); o.Failed = true; return o }(),
			func() Outcome { o := good(); o.UsageEstimated = true; return o }(),
			{TTFT: 100 * time.Millisecond, Answered: time.Second},
			func() Outcome { o := good(); o.TTFT = 0; return o }(),
			func() Outcome { o := good(); o.TTFT, o.Answered = -time.Second, 0; return o }(),
		} {
			taught(o)
		}
	}
	if ask() {
		t.Fatal("got a prediction from answers that teach nothing")
	}
	for i := range costMinAnswers {
		if ask() {
			t.Fatalf("got a prediction after %d answers, want none before %d", i, costMinAnswers)
		}
		taught(good())
	}
	if !ask() {
		t.Fatalf("got no prediction after %d answers", costMinAnswers)
	}
	if _, ok := (&Lease{}).Predicted(Outcome{}); ok {
		t.Error("Lease.Predicted of an outcome without usage: got a prediction, want none")
	}
}

func TestCostModelHostileNumbers(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	w := newCostWorker(time.Now)
	hostile := []Outcome{
		{PromptTokens: math.MaxInt, CachedTokens: math.MinInt, CompletionTokens: math.MaxInt, TTFT: time.Millisecond, Answered: math.MaxInt64},
		{PromptTokens: math.MaxInt, CachedTokens: math.MaxInt, CompletionTokens: -5, TTFT: math.MaxInt64, Answered: math.MinInt64},
		{PromptTokens: 1, CachedTokens: -1 << 40, CompletionTokens: 1 << 40, TTFT: 1, Answered: 2},
		{PromptTokens: 1 << 30, CompletionTokens: 2, TTFT: time.Nanosecond, Answered: time.Nanosecond},
		{PromptTokens: 10, CompletionTokens: 10, TTFT: 0, Answered: 0},
	}
	hostilePlacement := placement{running: 1e300, queued: -1e300, prefilling: math.Inf(1)}
	good := func() {
		pl := randomPlacement(rng)
		w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(4000), 0, 50, pl, 0.05))
	}
	bad := func() {
		w.cost.observe(placement{}, math.NaN(), hostile[rng.IntN(len(hostile))])
		w.cost.observe(hostilePlacement, math.Inf(-1), hostile[rng.IntN(len(hostile))])
	}
	checkBounded := func(when string) {
		t.Helper()
		for _, prompt := range []int{math.MinInt, -1, 0, 1, math.MaxInt} {
			for _, cached := range []int{math.MinInt, 0, math.MaxInt} {
				p, ok := w.PredictIdle(prompt, cached)
				if ok && (p.TTFT < 0 || p.TTFT > maxCostDuration || p.TPOT < 0 || p.TPOT > maxCostDuration) {
					t.Errorf("%s: PredictIdle(%d, %d): got %+v, want a prediction within [0, %v]", when, prompt, cached, p, maxCostDuration)
				}
			}
		}
	}
	idleWithin := func(when string, tol float64) {
		t.Helper()
		want := steps.ttft(1000, placement{})
		if got, ok := w.PredictIdle(1000, 0); !ok || !within(got.TTFT, want, tol) {
			t.Errorf("%s: PredictIdle(1000): got %v, %v; want %v within %.0f%%", when, got.TTFT, ok, want, 100*tol)
		}
	}
	// From the first answer on, absurd ones among the good: the predictions stay in range.
	for i := range 1000 {
		if i%3 == 0 {
			bad()
		} else {
			good()
		}
	}
	checkBounded("hostile answers from the start")
	// Good answers alone then relearn the law.
	for range 2000 {
		good()
	}
	idleWithin("2000 good answers after hostile ones", 0.1)
	// Once it has learnt, a third of absurd answers moves it only a little.
	for i := range 3000 {
		if i%3 == 0 {
			bad()
		} else {
			good()
		}
	}
	checkBounded("hostile answers after learning")
	idleWithin("hostile answers after learning", 0.35)
}

func TestCostModelPlacement(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tt := range []struct {
		name    string
		slots   int64
		others  int64
		report  *LoadReport
		want    placement
		prefill int64
	}{
		{name: "idle", want: placement{}},
		{name: "slots free", slots: 4, others: 3, want: placement{running: 3}},
		{name: "slots full: first in the queue", slots: 4, others: 4, want: placement{running: 4, queued: 1}},
		{name: "two ahead in the queue", slots: 4, others: 6, want: placement{running: 4, queued: 3}},
		{name: "engine reports waiting", others: 10, report: &LoadReport{Running: 7, Waiting: 3, At: now}, want: placement{running: 7, queued: 4}},
		{name: "cache with room: the waiting are admitted at the next step", others: 10, report: &LoadReport{Running: 7, Waiting: 3, KVUsage: 0.4, At: now},
			want: placement{running: 10}},
		{name: "cache nearly full: the waiting are a queue", others: 10, report: &LoadReport{Running: 7, Waiting: 3, KVUsage: 0.95, At: now},
			want: placement{running: 7, queued: 4}},
		{name: "stale report ignored", others: 10, report: &LoadReport{Running: 7, Waiting: 3, At: now.Add(-time.Minute)}, want: placement{running: 10}},
		{name: "prompts in prefill", others: 2, prefill: 1500, want: placement{running: 2, prefilling: 1500}},
		{name: "hostile counts", slots: 4, others: math.MaxInt64, prefill: -5, want: placement{running: 4, queued: maxCostLoad}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newCostWorker(func() time.Time { return now })
			w.slots.Store(tt.slots)
			w.promptsInPrefill.Store(tt.prefill)
			if tt.report != nil {
				w.load.store(*tt.report)
			}
			if got := w.placementNow(tt.others); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestPoolLearnsCostFromReleases drives the model through Pick and Release: a lease records the
// load it was placed at and the fit then, and its outcome teaches the worker's model.
func TestPoolLearnsCostFromReleases(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(1, "m")})
	w := modelWorkers(t, p, "m")[0]
	w.slots.Store(2)
	rng := rand.New(rand.NewPCG(9, 10))
	pick := func(prompt int) *Lease {
		l, err := p.Pick(context.Background(), &Request{Model: "m", PromptTokens: prompt, Tokens: prompt + 100})
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		return l
	}
	if _, ok := w.PredictIdle(100, 0); ok {
		t.Fatal("a fresh worker: got a prediction, want none")
	}
	var last *Lease
	for range 300 {
		// One request alone, or three at once: the third waits for a slot.
		n := 1 + 2*rng.IntN(2)
		leases := make([]*Lease, n)
		for i := range leases {
			leases[i] = pick(100 + rng.IntN(2000))
		}
		if n == 3 {
			if got := leases[2].placed; got.running != 2 || got.queued != 1 {
				t.Fatalf("third request on two slots: got placement %+v, want 2 running and 1st in the queue", got)
			}
		}
		for _, l := range leases {
			prompt := int(l.prefillPrompt)
			l.Release(steps.answer(rng, prompt, 0, 20, l.placed, 0.02))
		}
		last = leases[0]
	}
	if w.promptsInPrefill.Load() != 0 || w.InFlight() != 0 {
		t.Errorf("after every release: got %d prompt tokens in prefill and %d in flight, want 0", w.promptsInPrefill.Load(), w.InFlight())
	}
	got, ok := w.PredictIdle(1000, 0)
	if want := steps.ttft(1000, placement{}); !ok || !within(got.TTFT, want, 0.1) {
		t.Errorf("PredictIdle(1000): got %v, %v; want %v within 10%%", got.TTFT, ok, want)
	}
	o := steps.answer(rng, 1000, 0, 20, last.placed, 0)
	if got, ok := last.Predicted(o); !ok || !within(got.TTFT, o.TTFT, 0.1) {
		t.Errorf("Lease.Predicted: got %v, %v; want %v within 10%%", got.TTFT, ok, o.TTFT)
	}
	// Predict sees the load now: a worker with both slots taken puts the next request in queue.
	a, b := pick(100), pick(100)
	defer a.Release(Outcome{})
	defer b.Release(Outcome{})
	loaded, _ := w.Predict(1000, 0)
	idle, _ := w.PredictIdle(1000, 0)
	if loaded.TTFT < idle.TTFT+steps.perQueued/2 {
		t.Errorf("Predict with both slots taken: got %v, want at least the idle %v plus half a queued request's wait %v", loaded.TTFT, idle.TTFT, steps.perQueued/2)
	}
}

func TestCostModelConcurrentUse(t *testing.T) {
	w := newCostWorker(time.Now)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for range 500 {
				pl := randomPlacement(rng)
				w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.05))
				if p, ok := w.Predict(500, 0); ok && (p.TTFT <= 0 || p.TTFT > maxCostDuration) {
					t.Errorf("Predict: got %v", p.TTFT)
					return
				}
			}
		}()
	}
	wg.Wait()
	if got, ok := w.PredictIdle(1000, 0); !ok || !within(got.TTFT, steps.ttft(1000, placement{}), 0.1) {
		t.Errorf("PredictIdle(1000) after 4000 concurrent answers: got %v, %v; want %v within 10%%", got.TTFT, ok, steps.ttft(1000, placement{}))
	}
}

// BenchmarkPredict is the price of one candidate's prediction (issue 31: at most 2 µs, no
// allocation), on a worker that has learnt and has requests in flight.
func BenchmarkPredict(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := newCostWorker(time.Now)
	w.slots.Store(4)
	w.inFlight.Store(3)
	w.promptsInPrefill.Store(800)
	for range 500 {
		pl := randomPlacement(rng)
		w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.05))
	}
	w.stepEnded(time.Now().UnixNano()) // a step under way: the prompts in prefill read less its progress
	b.ReportAllocs()
	var sink time.Duration
	for i := 0; b.Loop(); i++ {
		p, _ := w.Predict(100+i&1023, i&63)
		sink += p.TTFT
	}
	_ = sink
}

// BenchmarkCostObserve is the price of learning from one answer, paid in Lease.Release.
func BenchmarkCostObserve(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	w := newCostWorker(time.Now)
	outcomes := make([]Outcome, 256)
	places := make([]placement, len(outcomes))
	for i := range outcomes {
		places[i] = randomPlacement(rng)
		outcomes[i] = steps.answer(rng, 16+rng.IntN(3000), 0, 20, places[i], 0.05)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w.cost.observe(places[i&255], 2, outcomes[i&255])
	}
}

// TestCostModelLoadItCannotTellApart: a worker always full (four running, as a slot engine under
// a steady flood) says nothing of what one running sequence costs. The model predicts what it saw
// for that load, and for an idle worker nothing below the idle law nor above what it saw; and
// after thousands of such answers its uncertainty about the load it never saw has not wound up.
func TestCostModelLoadItCannotTellApart(t *testing.T) {
	rng := rand.New(rand.NewPCG(12, 13))
	w := newCostWorker(time.Now)
	full := placement{running: 4}
	for range 10000 {
		w.cost.observe(full, 4, steps.answer(rng, 16+rng.IntN(3000), 0, 30, full, 0.05))
	}
	k := w.cost.coefficients()
	got, ok := k.predict(1000, full)
	if want := steps.ttft(1000, full); !ok || !within(got.TTFT, want, 0.1) {
		t.Errorf("at the load it saw: got %v, %v; want %v within 10%%", got.TTFT, ok, want)
	}
	idle, _ := w.PredictIdle(1000, 0)
	if lo, hi := steps.ttft(1000, placement{}), steps.ttft(1000, full); idle.TTFT < lo*9/10 || idle.TTFT > hi*11/10 {
		t.Errorf("idle: got %v, want within [%v, %v]", idle.TTFT, lo, hi)
	}
	for i := range ttftInputs {
		if v := w.cost.ttft.p[i][i]; !(v <= ttftPrior[i]) {
			t.Errorf("TTFT variance %d: got %g, want at most its prior %g", i, v, ttftPrior[i])
		}
	}
}

// TestCostModelIdleStepUnderAFlood: a slot engine never idle, a prefill-heavy flood in both its
// slots (the same load in every answer, its prefills taking three fifths of its time), still
// predicts its idle step from the gaps of its streams, and its worker's gauge says so: the
// default TPOT objective and the pace of pieces read that step. The TPOT law alone, which cannot
// tell the step from the flood, put much of the flood there (on llama-server 25-27 ms against
// 10-13 measured alone).
func TestCostModelIdleStepUnderAFlood(t *testing.T) {
	const step, perSeq = 13 * time.Millisecond, 600 * time.Microsecond
	for seed := range uint64(3) {
		rng := rand.New(rand.NewPCG(seed, 21))
		p, reg := newTestPool(t, Config{Policy: "round_robin", Workers: testWorkers(1, "m")})
		w := modelWorkers(t, p, "m")[0]
		for range 3000 {
			running := float64(1 + rng.IntN(2))
			pl := placement{running: running, prefilling: float64(rng.IntN(2) * 500), arrivals: 300 * (0.95 + 0.1*rng.Float64())}
			decodeStep := step + time.Duration(running*float64(perSeq))
			outputs := 7 + rng.IntN(2)*9
			o := steps.answer(rng, 100+rng.IntN(900), 0, outputs, pl, 0.1)
			// Three fifths of every second prefill: each token waits 2.5 decode steps.
			o.Answered = o.TTFT + time.Duration(outputs-1)*time.Duration(float64(decodeStep)*2.5*(0.9+0.2*rng.Float64()))
			o.MedianGap = time.Duration(float64(decodeStep) * (0.95 + 0.1*rng.Float64()))
			w.cost.observe(pl, running, o)
		}
		idle, ok := w.PredictIdle(1, 0)
		if !ok || !within(idle.TPOT, step, 0.15) {
			t.Errorf("seed %d: idle TPOT: got %v, %v; want %v within 15%% (TPOT under the flood about %v)",
				seed, idle.TPOT, ok, step, step*5/2)
		}
		if got := gauge(t, reg, "usher_routing_worker_idle_step_seconds"); got != idle.TPOT.Seconds() {
			t.Errorf("seed %d: usher_routing_worker_idle_step_seconds: got %v, want %v", seed, got, idle.TPOT.Seconds())
		}
	}
}

// gauge is the value of the one series of the gauge name that reg gathers.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s: want one series, got none or more", name)
	return 0
}

func TestArrivalRate(t *testing.T) {
	var a arrivalRate
	now := time.Unix(1000, 0)
	if got := a.perSecond(now); got != 0 {
		t.Fatalf("no arrivals: got %v tokens/s, want 0", got)
	}
	// 500 tokens every 100 ms for a minute, six time constants: 5,000 tokens/s.
	for range 600 {
		now = now.Add(100 * time.Millisecond)
		a.add(now, 500)
	}
	if got := a.perSecond(now); math.Abs(got-5000) > 0.05*5000 {
		t.Errorf("steady arrivals: got %.0f tokens/s, want 5000 within 5%%", got)
	}
	// An arrival stamped before the last (a clock read out of order) still counts, and the
	// rate never grows with time alone.
	a.add(now.Add(-time.Second), 500)
	before := a.perSecond(now)
	if later := a.perSecond(now.Add(time.Minute)); later > before/100 {
		t.Errorf("a minute without arrivals: got %.0f tokens/s, want under 1%% of %.0f", later, before)
	}
	a.add(now, math.Inf(1))
	if got := a.perSecond(now); math.IsInf(got, 0) || math.IsNaN(got) {
		t.Errorf("after an absurd arrival: got %v tokens/s, want a number", got)
	}
}

// TestCostModelSlotEngineDecode is a slot engine's TPOT as a gateway sees it: one to three
// sequences beside a request (of few slots), the prompts arriving per second rising with the
// offered load, and noisy times. The fit once held a coefficient that noise pushed below 0 at 0
// alone: the step and the running sequences, which such inputs hardly tell apart, then chased
// each other's correction, and the predictions of a slot engine's TPOT grew past 1e10 ms within
// a hundred answers. Every prediction must stay near the law, for TTFT as for TPOT.
func TestCostModelSlotEngineDecode(t *testing.T) {
	for seed := range uint64(5) {
		rng := rand.New(rand.NewPCG(seed, 15))
		law := costLaw{base: 18 * time.Millisecond, perKToken: 100 * time.Millisecond,
			step: 13 * time.Millisecond, perSeq: 600 * time.Microsecond, perKArrivals: 300 * time.Microsecond}
		w := newCostWorker(time.Now)
		for i := range 300 {
			pl := placement{running: float64(1 + rng.IntN(3)), arrivals: float64(i) * 8 * (0.9 + 0.2*rng.Float64())}
			w.cost.observe(pl, float64(1+rng.IntN(3)), law.answer(rng, 100+rng.IntN(800), 0, 10+rng.IntN(100), pl, 0.2))
			k := w.cost.coefficients()
			got, ok := k.predict(500, pl)
			if !ok {
				continue
			}
			if want := law.ttft(500, pl); !within(got.TTFT, want, 0.25) {
				t.Fatalf("seed %d, after %d answers: got TTFT %v, want %v within 25%%", seed, i+1, got.TTFT, want)
			}
			if want := law.tpot(pl); got.TPOT > 0 && !within(got.TPOT, want, 0.25) {
				t.Fatalf("seed %d, after %d answers: got TPOT %v, want %v within 25%%", seed, i+1, got.TPOT, want)
			}
		}
		if !w.cost.tpotPub.ok.Load() {
			t.Errorf("seed %d: no TPOT prediction after 300 answers", seed)
		}
	}
}

// TestCostFitNonNegative: a coefficient pushed below 0 is set to 0 along the covariance, so the
// fit's prediction where it learnt stays put instead of jumping by the coefficient's share.
func TestCostFitNonNegative(t *testing.T) {
	var f costFit
	f.reset(2, &[maxInputs]float64{1e4, 1e4})
	// Two inputs that moved together: the fit cannot tell them apart, and puts a negative
	// coefficient on the second.
	f.theta = [maxInputs]float64{20, -2}
	f.p[0][0], f.p[0][1], f.p[1][0], f.p[1][1] = 4, -1.6, -1.6, 1
	x := [maxInputs]float64{1, 2.5}
	before := dot(&f.theta, x, 2)
	f.nonNegative(&x)
	if f.theta[1] != 0 {
		t.Fatalf("second coefficient: got %g, want 0", f.theta[1])
	}
	if got := dot(&f.theta, x, 2); math.Abs(got-before) > 0.2*before {
		t.Errorf("prediction at the inputs it learnt: got %g, want about %g", got, before)
	}
}

// TestUnreachableObjectiveWarnsOnce: at its scrapes, a worker whose engine prefills a long prompt
// in one step slower than the default interactive objective allows is warned of once, with its
// figures and the setting to change, and again only an hour later; a fast worker beside it never.
func TestUnreachableObjectiveWarnsOnce(t *testing.T) {
	// slow: 20 ms + 100 ms per thousand prompt tokens (a CPU engine), prompts up to 4000 tokens
	// in one step (400 ms), against an objective of 2 x 40 ms for 200 tokens plus a 12 ms step.
	// fast: 10 ms per thousand, the same prompts' step is 40 ms, within its objective of 56 ms.
	slow := costLaw{base: 20 * time.Millisecond, perKToken: 100 * time.Millisecond, step: 12 * time.Millisecond}
	fast := costLaw{base: 20 * time.Millisecond, perKToken: 10 * time.Millisecond, step: 12 * time.Millisecond}
	c := newObjectiveCheck(t, map[string]func(rng *rand.Rand, prompt int) Outcome{
		"slow": func(rng *rand.Rand, prompt int) Outcome { return slow.answer(rng, prompt, 0, 20, placement{}, 0.02) },
		"fast": func(rng *rand.Rand, prompt int) Outcome { return fast.answer(rng, prompt, 0, 20, placement{}, 0.02) },
	})
	c.scrapes(10 * time.Minute)
	got := c.warnings()
	if len(got) != 1 {
		t.Fatalf("after 10 minutes of scrapes: got %d warnings, want 1 (the slow worker's):\n%s", len(got), c.log.String())
	}
	w := got[0]
	if w["worker"] != "slow" {
		t.Errorf("warning of worker %v, want slow", w["worker"])
	}
	// The objective is 2 x the idle TTFT of 200 tokens (40 ms) plus a step (12 ms): 92 ms, 40 ms
	// beside the prompt's own time and the step, which 100 ms per thousand tokens spends on 400
	// tokens; the step of 4000 tokens takes 400 ms.
	for key, want := range map[string]float64{"ttft_objective_ms": 92, "step_ms": 400, "step_tokens_within_objective": 400, "largest_prompt_tokens": 4000} {
		if v, _ := w[key].(float64); math.Abs(v-want) > 0.1*want {
			t.Errorf("warning's %s: got %v, want about %v", key, w[key], want)
		}
	}
	if fix, _ := w["fix"].(string); !bytes.Contains([]byte(fix), []byte("llama-server -b")) || !bytes.Contains([]byte(fix), []byte("--max-num-batched-tokens")) {
		t.Errorf("warning's fix: got %q, want the llama-server and vLLM settings", fix)
	}
	c.scrapes(time.Hour)
	if got = c.warnings(); len(got) != 2 || got[1]["worker"] != "slow" {
		t.Errorf("an hour later: got %d warnings, want a second one of the slow worker:\n%s", len(got), c.log.String())
	}
}

// TestChunkingEngineObjectiveWarning: the step an interactive prompt waits for is what the
// streams saw. An engine that prefills the same long prompts in pieces (its streams never paused
// longer than 30 ms, within the 92 ms objective) is not warned of; one whose streams paused
// 200 ms (steps of about 2000 prompt tokens) is, with the step seen rather than the 400 ms
// prefill of its largest prompt.
func TestChunkingEngineObjectiveWarning(t *testing.T) {
	law := costLaw{base: 20 * time.Millisecond, perKToken: 100 * time.Millisecond, step: 12 * time.Millisecond}
	paused := func(gap time.Duration) func(rng *rand.Rand, prompt int) Outcome {
		return func(rng *rand.Rand, prompt int) Outcome {
			o := law.answer(rng, prompt, 0, 20, placement{}, 0.02)
			o.LongestGap = gap
			return o
		}
	}
	c := newObjectiveCheck(t, map[string]func(rng *rand.Rand, prompt int) Outcome{
		"chunked": paused(30 * time.Millisecond), "coarse": paused(200 * time.Millisecond)})
	c.scrapes(10 * time.Minute)
	got := c.warnings()
	if len(got) != 1 || got[0]["worker"] != "coarse" {
		t.Fatalf("got %d warnings, want 1, of the coarse worker:\n%s", len(got), c.log.String())
	}
	if got[0]["step_ms"] != 200.0 || got[0]["step_seen_in_streams"] != true {
		t.Errorf("warning: step_ms %v, step_seen_in_streams %v, want 200 and true", got[0]["step_ms"], got[0]["step_seen_in_streams"])
	}
}

// objectiveCheck is a pool of workers of model m whose cost models learnt 200 answers each
// (prompts of 100 to 4000 tokens, 4000 once), with a JSON log and a clock the test moves.
type objectiveCheck struct {
	t       *testing.T
	pool    *Pool
	workers []*Worker
	log     bytes.Buffer
	now     time.Time
}

// newObjectiveCheck makes the pool of one worker per entry of answers (sorted by ID), each
// worker's answers made by its function, for interactive prompts of 200 tokens.
func newObjectiveCheck(t *testing.T, answers map[string]func(rng *rand.Rand, prompt int) Outcome) *objectiveCheck {
	t.Helper()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Write([]byte("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(engine.Close)
	c := &objectiveCheck{t: t, now: time.Unix(1_700_000_000, 0)}
	ids := slices.Sorted(maps.Keys(answers))
	cfg := Config{Policy: "round_robin"}
	for _, id := range ids {
		cfg.Workers = append(cfg.Workers, WorkerSpec{ID: id, URL: engine.URL, Models: []string{"m"}, MaxConcurrency: 4})
	}
	cfg.SetDefaults()
	p, err := NewPool(cfg, Options{Logger: slog.New(slog.NewJSONHandler(&c.log, nil)), Now: func() time.Time { return c.now }})
	if err != nil {
		t.Fatal(err)
	}
	c.pool = p
	p.observeInteractivePrompt(200)
	c.workers = modelWorkers(t, p, "m")
	rng := rand.New(rand.NewPCG(16, 17))
	for i := range 200 {
		prompt := 100 + rng.IntN(3900)
		if i == 100 {
			prompt = 4000
		}
		for _, w := range c.workers {
			w.cost.observe(placement{}, 0, answers[w.spec.ID](rng, prompt))
		}
	}
	return c
}

// warnings are the pool's WARN lines so far.
func (c *objectiveCheck) warnings() (lines []map[string]any) {
	for _, l := range bytes.Split(bytes.TrimSpace(c.log.Bytes()), []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil && m["level"] == "WARN" {
			lines = append(lines, m)
		}
	}
	return lines
}

// scrapes scrapes every worker every 20 s for d: fewer scrapes than a worker gets, enough.
func (c *objectiveCheck) scrapes(d time.Duration) {
	for end := c.now.Add(d); c.now.Before(end); c.now = c.now.Add(20 * time.Second) {
		for _, w := range c.workers {
			c.pool.scrapeOnce(context.Background(), w)
		}
	}
}

// TestTheStepInProgressShortensTheWait: the prompts in prefill on a worker went into the step its
// engine is running, so a request placed later in that step waits for less of them. The model
// reads how far the step has come from the last step end usher saw and the prefill rate it has
// learnt (tp).
func TestTheStepInProgressShortensTheWait(t *testing.T) {
	now := time.Unix(1000, 0)
	w := newCostWorker(func() time.Time { return now })
	// Learnt: 10 ms a step, 100 ms per thousand prompt tokens, 50 ms per thousand in prefill.
	learnt := costFit{answers: costMinAnswers, theta: [maxInputs]float64{10, 100, 0, 0, 50}}
	w.cost.ttftPub.publish(&learnt, ttftInputs)
	w.promptsInPrefill.Store(2000)
	predict := func() time.Duration {
		t.Helper()
		p, ok := w.Predict(500, 0)
		if !ok {
			t.Fatal("Predict: no prediction")
		}
		return p.TTFT
	}
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

	if got, want := predict(), ms(10+50+100); got != want {
		t.Errorf("no step end seen: got %v, want %v (every prompt in prefill ahead)", got, want)
	}
	w.stepEnded(now.UnixNano())
	now = now.Add(50 * time.Millisecond)
	if got := w.placementNow(0).prefilled; got != 500 {
		t.Errorf("50 ms into the step: prefilled %v tokens, want 500", got)
	}
	if got, want := predict(), ms(10+50+75); got != want {
		t.Errorf("50 ms into the step: got %v, want %v", got, want)
	}
	now = now.Add(time.Hour)
	if got, want := predict(), ms(10+50); got != want {
		t.Errorf("long past the prompts' prefill: got %v, want %v (none left ahead)", got, want)
	}
	w.stepEnded(now.UnixNano())
	if got, want := predict(), ms(10+50+100); got != want {
		t.Errorf("at a step end: got %v, want %v", got, want)
	}
	// The streams of one step come back within microseconds: they do not move the mark.
	now = now.Add(50 * time.Microsecond)
	w.stepEnded(now.UnixNano())
	now = now.Add(50 * time.Millisecond)
	if got := w.placementNow(0).prefilled; math.Abs(got-500.5) > 1e-6 {
		t.Errorf("a second stream of the same step: prefilled %v tokens 50.05 ms on, want 500.5", got)
	}
	// A mark ahead of the clock (the wall clock set back) counts no progress, and the next step
	// end replaces it.
	w.stepAt.Store(now.Add(time.Second).UnixNano())
	if got := w.placementNow(0).prefilled; got != 0 {
		t.Errorf("a step end ahead of the clock: prefilled %v, want 0", got)
	}
	w.stepEnded(now.UnixNano())
	if got := w.stepAt.Load(); got != now.UnixNano() {
		t.Errorf("a step end behind a mark ahead of the clock: mark %v, want %v", time.Unix(0, got), now)
	}
	// A law that does not predict yet, or learnt no prefill cost, reads no progress.
	w.stepAt.Store(now.Add(-time.Second).UnixNano())
	for _, fit := range []costFit{{answers: costMinAnswers - 1, theta: learnt.theta}, {answers: costMinAnswers, theta: [maxInputs]float64{10}}} {
		w.cost.ttftPub.publish(&fit, ttftInputs)
		if got := w.placementNow(0).prefilled; got != 0 {
			t.Errorf("fit %+v: prefilled %v, want 0", fit.theta, got)
		}
	}
}

// TestLeasesMarkTheEnginesSteps: a request placed on an idle worker begins a step there, and the
// bytes of an answer end one.
func TestLeasesMarkTheEnginesSteps(t *testing.T) {
	clock := newFakeClock()
	p, _ := newTestPoolWith(t, Config{Policy: "round_robin", Workers: testWorkers(1, "m")}, Options{Now: clock.Now})
	w := modelWorkers(t, p, "m")[0]
	pick := func() *Lease {
		t.Helper()
		l, err := p.Pick(context.Background(), &Request{Model: "m", PromptTokens: 100, Tokens: 200})
		if err != nil {
			t.Fatalf("Pick: %v", err)
		}
		return l
	}
	began := clock.Now()
	first := pick()
	if got := w.stepAt.Load(); got != began.UnixNano() {
		t.Fatalf("placed on an idle worker: step mark %v, want %v", time.Unix(0, got), began)
	}
	clock.Advance(30 * time.Millisecond)
	second := pick()
	if got := w.stepAt.Load(); got != began.UnixNano() {
		t.Errorf("placed beside another request: the mark moved to %v", time.Unix(0, got))
	}
	clock.Advance(10 * time.Millisecond)
	first.Heard()
	if got := w.stepAt.Load(); got != clock.Now().UnixNano() {
		t.Errorf("an answer's bytes: step mark %v, want %v", time.Unix(0, got), clock.Now())
	}
	first.Release(Outcome{})
	second.Release(Outcome{})
}
