package routing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func testLearner(ceiling int64) *learner {
	var cfg ConcurrencyConfig
	cfg.setDefaults()
	return newLearner(cfg, ceiling, DefaultMaxTokensInFlight)
}

// fitTo gives l the points of an engine without load signals: TTFT at20 with 20 requests in
// flight, at30 with 30, enough answers to judge, and one answer since, of TTFT at30 + (at30 -
// at20), which the next step takes at the load it reports.
func fitTo(l *learner, at20, at30 float64) {
	l.points = []ttftPoint{{load: 20, ttft: at20, answers: minTTFTSamples}, {load: 30, ttft: at30, answers: minTTFTSamples}}
	l.newTTFT, l.newAnswers = 2*at30-at20, 1
}

func TestLearnerLaw(t *testing.T) {
	tests := []struct {
		name  string
		setup func(l *learner)
		limit int64
		sig   loadSignals
		want  int64
	}{
		{name: "engine slots win", setup: func(l *learner) { l.setSlots(2) }, limit: 8,
			sig: loadSignals{fresh: true, inFlight: 8}, want: 2},
		{name: "engine slots under the ceiling", setup: func(l *learner) { l.setSlots(1000) }, limit: 8, want: 256},
		{name: "binding limit doubles in slow start", limit: 8, sig: loadSignals{fresh: true, running: 8, inFlight: 8}, want: 16},
		{name: "binding limit rises by one after a drop", setup: func(l *learner) { l.slowStart = false }, limit: 8,
			sig: loadSignals{fresh: true, running: 8, inFlight: 8}, want: 9},
		{name: "rising stops at the ceiling", limit: 200, sig: loadSignals{fresh: true, inFlight: 200}, want: 256},
		{name: "limit not binding holds", limit: 8, sig: loadSignals{fresh: true, running: 3, inFlight: 3}, want: 8},
		// The queue keeps lower classes out of the interactive reserve (a tenth of the pool by
		// default), so standard and batch traffic alone never fill a worker to its limit.
		{name: "within a fifth of the limit binds", limit: 10, sig: loadSignals{fresh: true, running: 8, inFlight: 8}, want: 20},
		{name: "more than a fifth below the limit holds", limit: 10, sig: loadSignals{fresh: true, running: 7, inFlight: 7}, want: 10},
		{name: "a limit of one binds only with a request in flight", limit: 1, sig: loadSignals{fresh: true}, want: 1},
		{name: "one scrape with a queue is not enough (a request just arrived)", limit: 16,
			sig: loadSignals{fresh: true, running: 5, waiting: 3, inFlight: 8}, want: 16},
		{name: "engine queue cuts to what it runs", setup: func(l *learner) { l.sawWaiting = true }, limit: 16, sig: loadSignals{fresh: true, running: 5, waiting: 3, inFlight: 8}, want: 5},
		{name: "engine queue lowers by one at least", setup: func(l *learner) { l.sawWaiting = true }, limit: 4, sig: loadSignals{fresh: true, running: 6, waiting: 2, inFlight: 8}, want: 3},
		{name: "a queue beside a KV cache with room is arrivals, not saturation (the limit binds, it rises)", setup: func(l *learner) { l.sawWaiting = true }, limit: 16,
			sig: loadSignals{fresh: true, running: 12, waiting: 2, kvUsage: 0.5, inFlight: 14}, want: 32},
		{name: "a queue beside a full KV cache cuts", setup: func(l *learner) { l.sawWaiting = true }, limit: 16,
			sig: loadSignals{fresh: true, running: 7, waiting: 9, kvUsage: 0.95, inFlight: 16}, want: 7},
		{name: "never below one", setup: func(l *learner) { l.sawWaiting = true }, limit: 1, sig: loadSignals{fresh: true, running: 0, waiting: 2, inFlight: 1}, want: 1},
		{name: "full KV cache lowers", limit: 10, sig: loadSignals{fresh: true, running: 10, kvUsage: 0.99, inFlight: 10}, want: 9},
		{name: "nearly full KV cache holds", limit: 10, sig: loadSignals{fresh: true, running: 10, kvUsage: 0.92, inFlight: 10}, want: 10},
		{name: "stale reading: only our own counts", limit: 8, sig: loadSignals{waiting: 9, kvUsage: 1, inFlight: 8}, want: 16},
		{name: "TTFT past the knee of an engine without load signals lowers by a tenth", setup: func(l *learner) {
			fitTo(l, 0.1, 0.3) // then 0.5 at 40: TTFT 5x at twice the load
		}, limit: 40, sig: loadSignals{inFlight: 40}, want: 36},
		{name: "TTFT growing less than the load lets it rise", setup: func(l *learner) {
			fitTo(l, 0.1, 0.12) // then 0.14 at 40
			l.slowStart = false
		}, limit: 40, sig: loadSignals{inFlight: 40}, want: 41},
		{name: "an engine that reports its load is not judged by TTFT", setup: func(l *learner) {
			fitTo(l, 0.1, 0.3)
			l.slowStart = false
		}, limit: 40, sig: loadSignals{fresh: true, running: 40, inFlight: 40}, want: 41},
		{name: "no answer since the last scrape: no judgement", setup: func(l *learner) {
			fitTo(l, 0.1, 0.3)
			l.newAnswers, l.newTTFT, l.slowStart = 0, 0, false
		}, limit: 40, sig: loadSignals{inFlight: 40}, want: 41},
		{name: "too few TTFT samples to judge", setup: func(l *learner) {
			fitTo(l, 0.1, 0.3)
			l.points[0].answers, l.points[1].answers, l.slowStart = 1, 1, false
		}, limit: 40, sig: loadSignals{inFlight: 40}, want: 41},
		{name: "TTFT past the knee with the limit not binding holds", setup: func(l *learner) {
			fitTo(l, 0.1, 0.3)
		}, limit: 40, sig: loadSignals{inFlight: 30}, want: 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLearner(256)
			if tt.setup != nil {
				tt.setup(l)
			}
			if got := l.step(tt.limit, tt.sig); got != tt.want {
				t.Errorf("step(%d, %+v) = %d, want %d", tt.limit, tt.sig, got, tt.want)
			}
		})
	}
}

func TestLearnerDropEndsSlowStart(t *testing.T) {
	l := testLearner(256)
	limit := l.step(8, loadSignals{fresh: true, running: 8, inFlight: 8}) // 16
	l.sawWaiting = true                                                   // the scrape before saw a queue too
	limit = l.step(limit, loadSignals{fresh: true, running: 12, waiting: 4, inFlight: 16})
	if limit != 12 {
		t.Fatalf("after the engine queued: limit %d, want 12", limit)
	}
	later := time.Unix(0, 0).Add(2 * DefaultCapHold) // past the cap the queueing set
	if got := l.step(limit, loadSignals{now: later, fresh: true, running: 12, inFlight: 12}); got != 13 {
		t.Errorf("after a drop: limit %d, want 13 (additive, not doubling)", got)
	}
}

func TestLearnerHoldsTheCapWhereTheEngineQueued(t *testing.T) {
	l := testLearner(256)
	now := time.Unix(1000, 0)
	l.step(8, loadSignals{now: now, fresh: true, running: 6, waiting: 2, inFlight: 8})
	limit := l.step(8, loadSignals{now: now, fresh: true, running: 6, waiting: 2, inFlight: 8})
	if limit != 6 {
		t.Fatalf("engine queueing at 6 running: limit %d, want 6", limit)
	}
	for i := range 10 {
		now = now.Add(2 * time.Second)
		if limit = l.step(limit, loadSignals{now: now, fresh: true, running: 6, inFlight: 6}); limit != 6 {
			t.Fatalf("scrape %d after the cut: limit %d, want it held at 6", i, limit)
		}
	}
	now = now.Add(DefaultCapHold)
	if limit = l.step(limit, loadSignals{now: now, fresh: true, running: 6, inFlight: 6}); limit != 7 {
		t.Errorf("after the hold: limit %d, want 7 (probing again)", limit)
	}
}

// An engine without load signals is judged by its TTFT against the load it was measured at: a
// continuous-batching engine, whose TTFT grows with its batch less than in proportion, is
// allowed what its clients ask; one that queues past its slots (TTFT growing by a service time
// for each slot's worth of requests beyond them) is held at its slots, or one above while
// the law probes, whether the clients' demand rose slowly or came at once.
func TestLearnerJudgesTTFTAgainstLoad(t *testing.T) {
	queueing := func(slots int64) func(int64) time.Duration {
		return func(n int64) time.Duration {
			return 50*time.Millisecond + time.Duration(max(0, n-slots))*time.Second/time.Duration(slots)
		}
	}
	tests := []struct {
		name            string
		ttft            func(inFlight int64) time.Duration
		demand          func(scrape int) int64
		atLeast, atMost int64
	}{
		{name: "batching engine", ttft: func(n int64) time.Duration { return 40*time.Millisecond + time.Duration(n)*2*time.Millisecond },
			demand: func(int) int64 { return 64 }, atLeast: 64, atMost: 256},
		{name: "engine queueing past 4 slots, demand rising", ttft: queueing(4),
			demand: func(i int) int64 { return int64(min(64, 1+i/2)) }, atLeast: 4, atMost: 5},
		{name: "engine queueing past 16 slots, demand at once", ttft: queueing(16),
			demand: func(int) int64 { return 64 }, atLeast: 16, atMost: 17},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := testLearner(256)
			now := time.Unix(1000, 0)
			limit := l.initial()
			for i := range 300 {
				n := min(limit, tt.demand(i))
				for range 5 {
					l.observeTTFT(tt.ttft(n))
				}
				now = now.Add(2 * time.Second)
				limit = l.step(limit, loadSignals{now: now, inFlight: n})
			}
			if limit < tt.atLeast || limit > tt.atMost {
				t.Errorf("after 300 scrapes: limit %d, want %d to %d", limit, tt.atLeast, tt.atMost)
			}
		})
	}
}

// A vLLM-like engine's TTFT grows with its batch by design: while it reports no queue and its
// KV cache has room, the limit rises to what the clients ask, however its TTFT grows; once it
// reports requests waiting beside a full cache, the limit is cut to what it runs, as before.
func TestLearnerLetsABatchingEngineRunItsBatch(t *testing.T) {
	const demand = 64
	l := testLearner(256)
	now := time.Unix(1000, 0)
	limit := l.initial()
	for i := range 30 {
		n := min(limit, demand)
		for range 10 {
			l.observeTTFT(40*time.Millisecond + time.Duration(n)*5*time.Millisecond) // 4.5x at 64 in flight what it is at 8
		}
		now = now.Add(2 * time.Second)
		if next := l.step(limit, loadSignals{now: now, fresh: true, running: n, kvUsage: 0.5, inFlight: n}); next < limit {
			t.Fatalf("scrape %d: limit cut from %d to %d with no queue in the engine", i, limit, next)
		} else {
			limit = next
		}
	}
	if limit < demand {
		t.Fatalf("limit %d, want at least the %d requests asked", limit, demand)
	}
	for range 2 {
		now = now.Add(2 * time.Second)
		limit = l.step(limit, loadSignals{now: now, fresh: true, running: 48, waiting: 16, kvUsage: 0.95, inFlight: demand})
	}
	if limit != 48 {
		t.Errorf("engine queueing beside a full cache with 48 running: limit %d, want 48", limit)
	}
}

// Noise in the TTFT of a worker that is not loaded moves no limit, whether its engine reports
// its load or not; nor does noise that does not follow the load while the limit binds.
func TestLearnerIgnoresNoisyTTFT(t *testing.T) {
	for _, reports := range []bool{false, true} {
		t.Run(fmt.Sprintf("engine reports its load: %v", reports), func(t *testing.T) {
			rnd := rand.New(rand.NewPCG(1, 2))
			l := testLearner(256)
			now := time.Unix(1000, 0)
			for i := range 300 { // ten minutes of scrapes
				for range rnd.IntN(4) {
					l.observeTTFT(time.Duration(50+rnd.IntN(450)) * time.Millisecond)
				}
				inFlight := 1 + rnd.Int64N(3)
				now = now.Add(2 * time.Second)
				if got := l.step(8, loadSignals{now: now, fresh: reports, running: inFlight, inFlight: inFlight}); got != 8 {
					t.Fatalf("scrape %d, %d in flight: limit %d, want 8 kept", i, inFlight, got)
				}
			}
			limit := int64(8)
			for i := range 100 { // the limit binds: 2x the load never doubles TTFT
				for range 5 {
					l.observeTTFT(time.Duration(50+rnd.IntN(450)) * time.Millisecond)
				}
				now = now.Add(2 * time.Second)
				next := l.step(limit, loadSignals{now: now, fresh: reports, running: limit, inFlight: limit})
				if next < limit {
					t.Fatalf("binding scrape %d: limit cut from %d to %d", i, limit, next)
				}
				limit = next
			}
		})
	}
}

// slotEngine serves /props and /metrics as llama.cpp's server does.
type slotEngine struct {
	propsDown        atomic.Bool  // /props closes the connection unanswered
	slots            atomic.Int64 // 0: no /props (404)
	running, waiting atomic.Int64
	propsCalls       atomic.Int64
	kvBlocks         atomic.Int64 // >0: /metrics states a KV cache of that many 16-token blocks, as vLLM
	noMetrics        atomic.Bool  // /metrics answers 404: the engine reports no load
}

func (e *slotEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/props":
		e.propsCalls.Add(1)
		if e.propsDown.Load() {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		if e.slots.Load() == 0 {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"default_generation_settings":{"n_ctx":4096},"total_slots":%d,"model_path":"m.gguf"}`, e.slots.Load())
	case "/metrics":
		if e.noMetrics.Load() {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "llamacpp:requests_processing %d\nllamacpp:requests_deferred %d\n", e.running.Load(), e.waiting.Load())
		if n := e.kvBlocks.Load(); n > 0 {
			fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",num_gpu_blocks=\"%d\",num_cpu_blocks=\"0\"} 1.0\n", n)
		}
	default:
		http.NotFound(w, r)
	}
}

// newEnginePool is a pool of one learning worker "w" of model m in front of eng.
func newEnginePool(t *testing.T, eng *slotEngine) (*Pool, *Worker) {
	t.Helper()
	return newEnginePoolWith(t, eng, Options{})
}

// newEnginePoolWith is newEnginePool with opts.
func newEnginePoolWith(t *testing.T, eng *slotEngine, opts Options) (*Pool, *Worker) {
	t.Helper()
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	p, err := NewPool(Config{Workers: []WorkerSpec{{ID: "w", URL: srv.URL, Models: []string{"m"}}}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := p.find("w")
	return p, w
}

func TestPoolLearnsSlotsFromTheEngine(t *testing.T) {
	eng := &slotEngine{}
	eng.slots.Store(2)
	p, w := newEnginePool(t, eng)
	if got, src := w.MaxConcurrency(), w.LimitSource(); got != DefaultInitialConcurrency || src != LimitLearned {
		t.Fatalf("before any scrape: limit %d from %s, want %d learned", got, src, DefaultInitialConcurrency)
	}
	changed := p.Changes()
	p.scrapeOnce(context.Background(), w)
	if got, src := w.MaxConcurrency(), w.LimitSource(); got != 2 || src != LimitEngine {
		t.Errorf("after a scrape: limit %d from %s, want 2 from the engine", got, src)
	}
	select {
	case <-changed:
	default:
		t.Error("the limit changed but Changes did not fire")
	}
	if st, _ := p.Worker("w"); st.MaxConcurrency != 2 || st.LimitSource != LimitEngine {
		t.Errorf("status: %d from %s, want 2 from the engine", st.MaxConcurrency, st.LimitSource)
	}
	p.scrapeOnce(context.Background(), w)
	if n := eng.propsCalls.Load(); n != 1 {
		t.Errorf("/props asked %d times in two scrapes, want once (then every %v)", n, propsRetry)
	}
}

func TestPoolLearnsLimitWithoutSlots(t *testing.T) {
	eng := &slotEngine{}
	p, w := newEnginePool(t, eng)
	ctx := context.Background()
	var leases []*Lease
	for range DefaultInitialConcurrency {
		l, err := p.Pick(ctx, &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	if _, err := p.Pick(ctx, &Request{Model: "m"}); err == nil {
		t.Fatal("a pick above the initial limit succeeded")
	}
	eng.running.Store(DefaultInitialConcurrency)
	p.scrapeOnce(ctx, w)
	if got := w.MaxConcurrency(); got != 2*DefaultInitialConcurrency {
		t.Fatalf("binding limit, engine not queueing: limit %d, want %d", got, 2*DefaultInitialConcurrency)
	}
	eng.running.Store(6)
	eng.waiting.Store(2)
	p.scrapeOnce(ctx, w)
	p.scrapeOnce(ctx, w)
	if got := w.MaxConcurrency(); got != 6 {
		t.Errorf("engine queueing with 6 running at two scrapes: limit %d, want 6", got)
	}
	if _, err := p.Pick(ctx, &Request{Model: "m"}); err == nil {
		t.Error("a pick above the lowered limit succeeded")
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// A worker nobody sends to keeps its limit: after a busy spell whose answers came back slower
// than the first ones, ten idle minutes of scrapes leave the limit where the spell left it,
// whether the engine reports its load (vLLM) or not.
func TestPoolKeepsAnIdleWorkersLimit(t *testing.T) {
	for _, reports := range []bool{true, false} {
		t.Run(fmt.Sprintf("engine reports its load: %v", reports), func(t *testing.T) {
			eng := &slotEngine{}
			eng.kvBlocks.Store(1 << 16)
			eng.noMetrics.Store(!reports)
			now := time.Unix(1_000_000, 0)
			p, w := newEnginePoolWith(t, eng, Options{Now: func() time.Time { return now }})
			ctx := context.Background()
			for i := range 10 { // the busy spell: every slot the limit gives taken, TTFT 0.1s then 1s
				var leases []*Lease
				for {
					l, err := p.Pick(ctx, &Request{Model: "m"})
					if err != nil {
						break
					}
					leases = append(leases, l)
				}
				eng.running.Store(int64(len(leases)))
				ttft := 100 * time.Millisecond
				if i >= 3 {
					ttft = time.Second
				}
				for _, l := range leases {
					l.Release(Outcome{TTFT: ttft})
				}
				now = now.Add(2 * time.Second)
				p.scrapeOnce(ctx, w)
			}
			eng.running.Store(0)
			now = now.Add(2 * time.Second)
			p.scrapeOnce(ctx, w) // the last answers are judged here, once
			limit := w.MaxConcurrency()
			for i := range 300 {
				now = now.Add(2 * time.Second)
				p.scrapeOnce(ctx, w)
				if got := w.MaxConcurrency(); got != limit {
					t.Fatalf("idle for %v: limit %d, want %d kept", time.Duration(i+1)*2*time.Second, got, limit)
				}
			}
		})
	}
}

func TestLearnerTokenLimit(t *testing.T) {
	l := testLearner(256)
	l.tokenCeiling = 100_000
	if got := l.tokenLimit(); got != 100_000 {
		t.Fatalf("no KV cache stated: token limit %d, want the ceiling 100000", got)
	}
	l.setKVTokens(4096)
	if got := l.tokenLimit(); got != 4096 {
		t.Fatalf("a 4096-token KV cache stated, nothing learned: token limit %d, want 4096", got)
	}
	scrapes := func(n int, sig loadSignals) {
		for range n {
			l.stepKVRatio(sig)
		}
	}
	quiet := loadSignals{fresh: true, kvUsage: 0.5}
	// Each request charged 1,000 tokens held 300 in the engine: 500 of its 700 prompt tokens
	// were cached and it stopped after 100 of its 300 expected tokens.
	for range minUsageSamples - 1 {
		l.observeUsage(1000, Outcome{PromptTokens: 700, CachedTokens: 500, CompletionTokens: 100})
	}
	scrapes(5, quiet)
	if got := l.tokenLimit(); got != 4096 {
		t.Errorf("before %d answers: token limit %d, want 4096 still", minUsageSamples, got)
	}
	l.observeUsage(1000, Outcome{PromptTokens: 700, CachedTokens: 500, CompletionTokens: 100})
	l.stepKVRatio(quiet)
	if got := l.tokenLimit(); got != 4096*11/10 {
		t.Errorf("one scrape after the measure counts: token limit %d, want a tenth more, %d", got, 4096*11/10)
	}
	scrapes(1, loadSignals{fresh: true, kvUsage: 0.92})
	if got := l.tokenLimit(); got != 4096*11/10 {
		t.Errorf("cache 92%% full: token limit %d, want it held at %d", got, 4096*11/10)
	}
	scrapes(30, quiet)
	if got := l.tokenLimit(); got < 4096*10/3-1 || got > 4096*10/3+1 {
		t.Errorf("requests holding 3/10 of their charge: token limit %d, want %d", got, 4096*10/3)
	}
	for range 200 {
		l.observeUsage(1000, Outcome{PromptTokens: 100_000, UsageEstimated: true})
		l.observeUsage(1000, Outcome{CompletionTokens: 100_000})
	}
	scrapes(1, quiet)
	if got := l.tokenLimit(); got < 4096*10/3-1 {
		t.Errorf("estimated or promptless usage moved the ratio: token limit %d", got)
	}
	scrapes(1, loadSignals{fresh: true, kvUsage: 0.99})
	if got := l.tokenLimit(); got < 4096*3-1 || got > 4096*3+1 {
		t.Errorf("cache 99%% full: token limit %d, want a tenth less, %d", got, 4096*3)
	}
	scrapes(1, loadSignals{fresh: true, kvUsage: 0.9, waiting: 2})
	if got := l.tokenLimit(); got > 4096*27/10+1 {
		t.Errorf("requests waiting beside a cache 90%% full: token limit %d, want a tenth less, %d", got, 4096*27/10)
	}
	for range 400 {
		l.observeUsage(1000, Outcome{PromptTokens: 1_000_000, CompletionTokens: 1_000_000})
	}
	scrapes(1, quiet)
	if got := l.tokenLimit(); got != 4096/4 {
		t.Errorf("requests holding far more than charged: token limit %d, want the floor 4096/4 at once", got)
	}
	for range 400 {
		l.observeUsage(1_000_000, Outcome{PromptTokens: 1, CachedTokens: 1})
	}
	scrapes(100, quiet)
	if got := l.tokenLimit(); got != 4096*16 {
		t.Errorf("requests holding nothing: token limit %d, want the cap 16 x 4096", got)
	}
	l.tokenCeiling = 10_000
	if got := l.tokenLimit(); got != 10_000 {
		t.Errorf("ceiling 10000 below what the engine holds: token limit %d", got)
	}
}

// An engine that states its KV cache gets that many tokens in flight, no more: the queue's
// capacity and every policy's room check follow, and the worker's status says where it came from.
func TestPoolSizesTokenLimitFromTheEnginesKVCache(t *testing.T) {
	eng := &slotEngine{}
	eng.kvBlocks.Store(256) // 4096 tokens
	p, w := newEnginePool(t, eng)
	if got, src := w.MaxTokensInFlight(), w.TokenLimitSource(); got != DefaultMaxTokensInFlight || src != LimitConfig {
		t.Fatalf("before any scrape: token limit %d from %s, want %d from the config", got, src, DefaultMaxTokensInFlight)
	}
	changed := p.Changes()
	p.scrapeOnce(context.Background(), w)
	if got, src := w.MaxTokensInFlight(), w.TokenLimitSource(); got != 4096 || src != LimitEngine {
		t.Fatalf("after a scrape: token limit %d from %s, want 4096 from the engine", got, src)
	}
	select {
	case <-changed:
	default:
		t.Error("the token limit changed but Changes did not fire")
	}
	if st, _ := p.Worker("w"); st.MaxTokensInFlight != 4096 || st.TokenLimitSource != LimitEngine || st.Load.KVTokens != 4096 {
		t.Errorf("status: %d tokens from %s, KV %d; want 4096 from the engine", st.MaxTokensInFlight, st.TokenLimitSource, st.Load.KVTokens)
	}
	ctx := context.Background()
	l, err := p.Pick(ctx, &Request{Model: "m", Tokens: 3000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Pick(ctx, &Request{Model: "m", Tokens: 1200}); err == nil {
		t.Error("a pick past the engine's KV cache (3000 + 1200 > 4096) succeeded")
	}
	l2, err := p.Pick(ctx, &Request{Model: "m", Tokens: 1000})
	if err != nil {
		t.Errorf("a pick within the engine's KV cache (3000 + 1000): %v", err)
	} else {
		l2.Release(Outcome{})
	}
	l.Release(Outcome{})

	// A worker whose config fixes its tokens keeps them.
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	fixed, err := NewPool(Config{Workers: []WorkerSpec{{ID: "w", URL: srv.URL, Models: []string{"m"}, MaxTokensInFlight: 50_000}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fw, _ := fixed.find("w")
	fixed.scrapeOnce(ctx, fw)
	if got, src := fw.MaxTokensInFlight(), fw.TokenLimitSource(); got != 50_000 || src != LimitConfig {
		t.Errorf("fixed by the config: token limit %d from %s, want 50000 from the config", got, src)
	}

	// The engine stops stating its cache (restarted as another engine): back to the ceiling.
	eng.kvBlocks.Store(0)
	p.scrapeOnce(ctx, w)
	if got := w.MaxTokensInFlight(); got != DefaultMaxTokensInFlight {
		t.Errorf("the engine no longer states its cache: token limit %d, want the ceiling %d", got, DefaultMaxTokensInFlight)
	}
}

func TestConcurrencyConfigValidate(t *testing.T) {
	bad := []ConcurrencyConfig{
		{Initial: -1}, {TTFTTolerance: 0.5}, {KVHold: 0.99, KVHigh: 0.9}, {KVHigh: 1.5}, {PropsPath: "props"}, {ClearWithin: 30 * time.Millisecond},
	}
	for _, c := range bad {
		c.setDefaults()
		if errs := c.validate(); len(errs) == 0 {
			t.Errorf("%+v: no error", c)
		}
	}
	var good ConcurrencyConfig
	good.setDefaults()
	if errs := good.validate(); len(errs) > 0 {
		t.Errorf("defaults: %v", errs)
	}
}

// An engine too busy (or too new) to answer /props is asked again at the next scrape, not in
// propsRetry: until then a slot engine may be sent more than its slots.
func TestPoolAsksForSlotsAgainAfterNoAnswer(t *testing.T) {
	eng := &slotEngine{}
	eng.slots.Store(2)
	eng.propsDown.Store(true)
	p, w := newEnginePool(t, eng)
	p.scrapeOnce(context.Background(), w)
	if src := w.LimitSource(); src != LimitLearned {
		t.Fatalf("no answer: source %s, want learned", src)
	}
	eng.propsDown.Store(false)
	p.scrapeOnce(context.Background(), w)
	if got, src := w.MaxConcurrency(), w.LimitSource(); got != 2 || src != LimitEngine {
		t.Errorf("the next scrape: limit %d from %s, want 2 from the engine", got, src)
	}
}

// An interactive request being prefilled holds the other classes off its worker until its first
// token; while interactive requests are present, the others' prompts in prefill on one worker
// stay within LowerPrefillTokens (at least one request); without interactive traffic for
// InteractivePresence, they do not.
func TestPrefillBudgetYieldsToInteractive(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	// Prompts go whole here (pieces off); TestPiecesCountAgainstThePrefillBudget has pieces.
	p, k := wholePromptPool(t, &now)
	batch := func(prompt int) Request { return Request{PromptTokens: prompt, Tokens: prompt + 10} }

	before := k.pick("a batch request with no interactive traffic", batch(5000))
	inter := k.pick("an interactive request", Request{Interactive: true, PromptTokens: 100})
	k.refused("a batch request while an interactive prompt is prefilled", batch(10))
	k.pick("a second interactive request beside the first", Request{Interactive: true, PromptTokens: 100}).Release(Outcome{})
	room := make(chan string, 1)
	p.OnRoom(func(model string) { room <- model })
	inter.Prefilled()
	select {
	case m := <-room:
		if m != "m" {
			t.Errorf("room told for model %q, want m", m)
		}
	default:
		t.Error("the interactive prefill ended, but OnRoom's function was not told for the requests held back")
	}
	p.OnRoom(nil)
	inter.Prefilled() // twice is harmless
	k.refused("a batch request beside 5000 prompt tokens in prefill, interactive present", batch(10))
	before.Prefilled()
	b1 := k.pick("the first batch prompt in prefill, whatever its size", batch(400))
	k.refused("a batch prompt past the budget (400 + 200 > 512)", batch(200))
	b2 := k.pick("a batch prompt within the budget (400 + 100)", batch(100))
	b1.Release(Outcome{})
	b2.Prefilled()
	b3 := k.pick("a batch prompt once the first ended", batch(400))
	now = now.Add(DefaultInteractivePresence)
	b4 := k.pick("a batch prompt past the budget with no interactive request for 10s", batch(5000))
	for _, l := range []*Lease{inter, before, b2, b3, b4} {
		l.Release(Outcome{})
	}
	w, _ := p.find("w")
	if n, tok := w.interactivePrefills.Load(), w.prefill.tokens.Load(); n != 0 || tok != 0 {
		t.Errorf("after every lease ended: %d interactive prefills, %d other prompt tokens in prefill; want 0 and 0", n, tok)
	}
}
