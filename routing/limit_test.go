package routing

import (
	"context"
	"fmt"
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
		{name: "one scrape with a queue is not enough (a request just arrived)", limit: 16,
			sig: loadSignals{fresh: true, running: 5, waiting: 3, inFlight: 8}, want: 16},
		{name: "engine queue cuts to what it runs", setup: func(l *learner) { l.sawWaiting = true }, limit: 16, sig: loadSignals{fresh: true, running: 5, waiting: 3, inFlight: 8}, want: 5},
		{name: "engine queue lowers by one at least", setup: func(l *learner) { l.sawWaiting = true }, limit: 4, sig: loadSignals{fresh: true, running: 6, waiting: 2, inFlight: 8}, want: 3},
		{name: "a queue beside a KV cache with room is arrivals, not saturation", setup: func(l *learner) { l.sawWaiting = true }, limit: 16,
			sig: loadSignals{fresh: true, running: 12, waiting: 2, kvUsage: 0.5, inFlight: 14}, want: 16},
		{name: "a queue beside a full KV cache cuts", setup: func(l *learner) { l.sawWaiting = true }, limit: 16,
			sig: loadSignals{fresh: true, running: 7, waiting: 9, kvUsage: 0.95, inFlight: 16}, want: 7},
		{name: "never below one", setup: func(l *learner) { l.sawWaiting = true }, limit: 1, sig: loadSignals{fresh: true, running: 0, waiting: 2, inFlight: 1}, want: 1},
		{name: "full KV cache lowers", limit: 10, sig: loadSignals{fresh: true, running: 10, kvUsage: 0.99, inFlight: 10}, want: 9},
		{name: "nearly full KV cache holds", limit: 10, sig: loadSignals{fresh: true, running: 10, kvUsage: 0.92, inFlight: 10}, want: 10},
		{name: "stale reading: only our own counts", limit: 8, sig: loadSignals{waiting: 9, kvUsage: 1, inFlight: 8}, want: 16},
		{name: "inflated TTFT lowers by a tenth", setup: func(l *learner) {
			l.baseline, l.ttft, l.samples = 0.1, 0.35, minTTFTSamples
		}, limit: 40, sig: loadSignals{fresh: true, inFlight: 40}, want: 36},
		{name: "TTFT near its baseline lets it rise", setup: func(l *learner) {
			l.baseline, l.ttft, l.samples, l.slowStart = 0.1, 0.15, minTTFTSamples, false
		}, limit: 40, sig: loadSignals{fresh: true, inFlight: 40}, want: 41},
		{name: "too few TTFT samples to judge", setup: func(l *learner) {
			l.baseline, l.ttft, l.samples, l.slowStart = 0.1, 0.9, 2, false
		}, limit: 40, sig: loadSignals{fresh: true, inFlight: 40}, want: 41},
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

func TestLearnerBaselineFollowsTheFastest(t *testing.T) {
	l := testLearner(256)
	for range 10 {
		l.observeTTFT(100 * time.Millisecond)
	}
	l.step(8, loadSignals{})
	for range 20 {
		l.observeTTFT(150 * time.Millisecond)
	}
	if got := l.step(8, loadSignals{fresh: true, inFlight: 8}); got != 16 {
		t.Errorf("TTFT 1.5x its baseline: limit %d, want it to rise to 16", got)
	}
	for range 20 {
		l.observeTTFT(time.Second)
	}
	if got := l.step(16, loadSignals{fresh: true, inFlight: 16}); got >= 16 {
		t.Errorf("TTFT 10x its baseline: limit %d, want it below 16", got)
	}
}

// slotEngine serves /props and /metrics as llama.cpp's server does.
type slotEngine struct {
	propsDown        atomic.Bool  // /props closes the connection unanswered
	slots            atomic.Int64 // 0: no /props (404)
	running, waiting atomic.Int64
	propsCalls       atomic.Int64
	kvBlocks         atomic.Int64 // >0: /metrics states a KV cache of that many 16-token blocks, as vLLM
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
	srv := httptest.NewServer(eng)
	t.Cleanup(srv.Close)
	p, err := NewPool(Config{Workers: []WorkerSpec{{ID: "w", URL: srv.URL, Models: []string{"m"}}}}, Options{})
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
		{Initial: -1}, {TTFTTolerance: 0.5}, {KVHold: 0.99, KVHigh: 0.9}, {KVHigh: 1.5}, {PropsPath: "props"}, {ClearWithin: -1},
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
	p, err := NewPool(Config{Workers: []WorkerSpec{{ID: "w", URL: "http://127.0.0.1:1", Models: []string{"m"}, MaxConcurrency: 10}},
		Concurrency: ConcurrencyConfig{PrefillPieceTokens: -1}},
		Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	k := picker{t, p, "m"}
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
