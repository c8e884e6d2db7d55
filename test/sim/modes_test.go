package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// virtualClock runs a scheduler's steps back to back on engine time (the sum of the steps'
// costs), without waiting any of it out, and records when each sequence got its first token.
type virtualClock struct {
	s     *scheduler
	now   time.Duration
	first map[*sequence]time.Duration
}

func newVirtualClock(s *scheduler) *virtualClock {
	return &virtualClock{s: s, first: make(map[*sequence]time.Duration)}
}

// step runs one step and reports whether there was one.
func (v *virtualClock) step() bool {
	p := v.s.schedule()
	if p.empty() {
		return false
	}
	v.now += p.cost
	seqs := slices.Clone(p.seqs)
	v.s.apply(p)
	for _, q := range seqs {
		if _, seen := v.first[q]; !seen && q.generated > 0 {
			v.first[q] = v.now
		}
	}
	return true
}

// until steps until cond holds, failing the test if the engine runs dry or takes too many steps.
func (v *virtualClock) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 100_000 {
		if cond() {
			return
		}
		if !v.step() {
			t.Fatalf("engine idle before %s", what)
		}
	}
	t.Fatalf("%s never happened", what)
}

func TestSlotsModeHoldsASlotPerRequestAndDefersTheRestFIFO(t *testing.T) {
	s, c := testScheduler(Config{Mode: ModeSlots, Slots: 2, KVCacheTokens: 2 * 256})
	var seqs []*sequence
	for i := range 5 {
		q := newSequence(uint64(i+1), tokenize(words(fmt.Sprint("r", i, "-"), 40)), 100+10*i, 0)
		seqs = append(seqs, q)
		s.add(q)
	}
	v := newVirtualClock(s)
	v.step()
	if got, want := c.running.Load(), int64(2); got != want {
		t.Fatalf("running after the first step: got %d, want %d (the slots)", got, want)
	}
	if got, want := c.waiting.Load(), int64(3); got != want {
		t.Fatalf("waiting after the first step: got %d, want %d", got, want)
	}
	var order []int
	done := func() bool {
		for i, q := range seqs {
			if q.state == stateDone && !slices.Contains(order, i) {
				order = append(order, i)
			}
		}
		return len(order) == len(seqs)
	}
	admitted := make(map[*sequence]int)
	for !done() {
		for _, q := range s.running {
			if _, ok := admitted[q]; !ok {
				admitted[q] = len(admitted)
			}
		}
		if int(c.running.Load()) > 2 {
			t.Fatalf("running: got %d, want at most the 2 slots", c.running.Load())
		}
		if !v.step() {
			t.Fatal("engine idle with requests unfinished")
		}
	}
	for i, q := range seqs {
		if admitted[q] != i {
			t.Errorf("request %d admitted %d-th, want in arrival order", i, admitted[q])
		}
	}
	if got := c.preemptions.Load(); got != 0 {
		t.Errorf("preemptions: got %d, want 0 (a slot is held until the request ends)", got)
	}
}

func TestSlotsModeBatchesBusySlotsUnderTheBatchSize(t *testing.T) {
	// Two slots prefilling 3,000-token prompts at llama-server's default batch of 2,048: the
	// first takes the whole first step, and the second starts in the step after.
	s, _ := testScheduler(Config{Mode: ModeSlots, Slots: 2, KVCacheTokens: 2 * 4096})
	a := newSequence(1, tokenize(words("a", 3000)), 2, 0)
	b := newSequence(2, tokenize(words("b", 3000)), 2, 0)
	s.add(a)
	s.add(b)
	p := s.schedule()
	if got, want := fmt.Sprint(p.n), "[2048]"; got != want {
		t.Fatalf("first step: got %s tokens, want %s", got, want)
	}
	s.apply(p)
	p = s.schedule()
	if got, want := fmt.Sprint(p.n), "[952 1096]"; got != want {
		t.Fatalf("second step: got %s tokens, want %s (a's rest, then b's first chunk)", got, want)
	}
	s.apply(p)
}

func TestKVModeAdmissionIsBoundByFreeBlocks(t *testing.T) {
	// 256 batch slots but 40 blocks of KV: 100-token prompts take 7 blocks each, so 5 fit
	// and the rest wait although the batch has room, as in vLLM.
	s, c := testScheduler(Config{Mode: ModeKV, MaxNumSeqs: 256, KVCacheTokens: 40 * 16})
	for i := range 12 {
		s.add(newSequence(uint64(i+1), tokenize(words(fmt.Sprint("k", i, "-"), 100)), 200, 0))
	}
	s.apply(s.schedule())
	if got, want := c.running.Load(), int64(5); got != want {
		t.Fatalf("running: got %d, want %d (bound by KV blocks, not max_num_seqs)", got, want)
	}
	if got, want := c.waiting.Load(), int64(7); got != want {
		t.Fatalf("waiting: got %d, want %d", got, want)
	}
	if got := c.kvUsage(); got < 0.85 {
		t.Errorf("kv usage: got %g, want nearly full", got)
	}
	// As they decode they need more blocks than there are: the last admitted are preempted
	// and recomputed later, and every request still finishes.
	v := newVirtualClock(s)
	v.until(t, "every request finished", func() bool { return c.completed.Load() == 12 })
	if got := c.preemptions.Load(); got == 0 {
		t.Error("preemptions: got 0, want some once decoding outgrows the cache")
	}
	if got := c.kvUsage(); got != 0 {
		t.Errorf("kv usage when idle: got %g, want 0", got)
	}
}

func TestKVModeTTFTGrowsWithTheTokensSharingSteps(t *testing.T) {
	// A 260-token interactive prompt arriving behind n batch prompts of 520 tokens: under a
	// budget of 2,048 tokens per step and a cost per prefilled token, its first token comes
	// later the more batch prefill shares its steps.
	ttft := func(batch int) time.Duration {
		s, _ := testScheduler(Config{Mode: ModeKV, MaxNumBatchedTokens: 2048})
		v := newVirtualClock(s)
		for i := range batch {
			s.add(newSequence(uint64(i+1), tokenize(words(fmt.Sprint("b", i, "-"), 520)), 7, 0))
		}
		probe := newSequence(uint64(batch+1), tokenize(words("probe", 260)), 16, 0)
		s.add(probe)
		v.until(t, "the probe's first token", func() bool { _, ok := v.first[probe]; return ok })
		return v.first[probe]
	}
	var got []time.Duration
	for _, n := range []int{0, 4, 16} {
		got = append(got, ttft(n))
	}
	if !(got[0] < got[1] && got[1] < got[2]) {
		t.Errorf("probe TTFT behind 0, 4, 16 batch prompts (engine time): got %v, want strictly rising", got)
	}
	// Unscaled defaults: a 260-token prefill alone is one step of 12 ms + 30 us + 26 ms.
	if want := 12*time.Millisecond + 30*time.Microsecond + 260*100*time.Microsecond; got[0] != want {
		t.Errorf("probe TTFT alone: got %v, want %v", got[0], want)
	}
}

func TestSlotsModeHTTPSurface(t *testing.T) {
	cfg := fastConfig()
	cfg.Mode, cfg.Slots, cfg.KVCacheTokens = ModeSlots, 2, 2*1024
	e, srv := startEngine(t, cfg)

	resp, err := srv.Client().Get(srv.URL + "/props")
	if err != nil {
		t.Fatal(err)
	}
	p := decodeJSON[props](t, resp)
	if p.TotalSlots != 2 || p.DefaultGenerationSettings.NCtx != 1024 || p.ModelAlias != "demo-7b" {
		t.Errorf("/props: got total_slots %d, n_ctx %d, model_alias %q, want 2, 1024, demo-7b",
			p.TotalSlots, p.DefaultGenerationSettings.NCtx, p.ModelAlias)
	}
	health, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	if body, _ := io.ReadAll(health.Body); health.StatusCode != http.StatusOK || string(body) != `{"status":"ok"}` {
		t.Errorf("/health: got %d %q, want 200 {\"status\":\"ok\"}", health.StatusCode, body)
	}
	health.Body.Close()

	// Three long streams on two slots: two processing, one deferred.
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	for i := range 3 {
		wg.Go(func() {
			resp, err := send(ctx, srv, "/v1/chat/completions", chat(fmt.Sprintf("long %d", i), 1000, map[string]any{"stream": true}))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "2 processing and 1 deferred", func() bool { s := e.Stats(); return s.Running == 2 && s.Waiting == 1 })
	slotsResp, err := srv.Client().Get(srv.URL + "/slots")
	if err != nil {
		t.Fatal(err)
	}
	slots := decodeJSON[[]slotState](t, slotsResp)
	if len(slots) != 2 || !slots[0].IsProcessing || !slots[1].IsProcessing || slots[0].IDTask < 1 || slots[0].NCtx != 1024 {
		t.Errorf("/slots: got %+v, want 2 slots of 1024 tokens, both processing a task", slots)
	}
	for sample, want := range map[string]string{
		"llamacpp:requests_processing": "2",
		"llamacpp:requests_deferred":   "1",
		"usher_sim_requests_peak":      "3",
	} {
		if got := scrape(t, srv, sample); got != want {
			t.Errorf("%s: got %s, want %s", sample, got, want)
		}
	}
	if got := scrape(t, srv, "llamacpp:n_decode_total"); got == "0" {
		t.Error("llamacpp:n_decode_total: got 0 with requests decoding")
	}
	metrics, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text, _ := io.ReadAll(metrics.Body)
	metrics.Body.Close()
	if strings.Contains(string(text), "vllm:") {
		t.Error("slots mode /metrics carries vllm: names, want llama.cpp's only (a router would count each request twice)")
	}
	cancel()
	wg.Wait()

	// A prompt that fills the slot's context is refused as llama-server refuses it.
	resp = post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": words("x", 1024), "max_tokens": 1})
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("prompt of the slot's whole context: got %d, want 400", resp.StatusCode)
	}
	if body := decodeJSON[testError](t, resp); body.Error == nil || !strings.Contains(body.Error.Message, "exceeds the available context size (1024 tokens)") {
		t.Errorf("error: got %+v, want llama-server's context message", body.Error)
	}
}

func TestKVModeHTTPSurface(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCacheTokens = 100 * 16
	_, srv := startEngine(t, cfg)
	want := `vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="0",num_gpu_blocks="100"}`
	if got := scrape(t, srv, want); got != "1" {
		t.Errorf("%s: got %s, want 1", want, got)
	}
	resp, err := srv.Client().Get(srv.URL + "/props")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/props in kv mode: got %d, want 404 as vLLM", resp.StatusCode)
	}
}

func TestCloseAfterStream(t *testing.T) {
	for _, quirk := range []bool{false, true} {
		t.Run(fmt.Sprint("close-after-stream=", quirk), func(t *testing.T) {
			cfg := fastConfig()
			cfg.Mode, cfg.CloseAfterStream = ModeSlots, quirk
			_, srv := startEngine(t, cfg)
			conn, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			body := `{"prompt":"a b","max_tokens":3,"stream":true}`
			fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			r := bufio.NewReader(conn)
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			data, err := io.ReadAll(resp.Body)
			if err != nil || !strings.HasSuffix(string(data), "data: [DONE]\n\n") {
				t.Fatalf("stream: got %q, %v, want a complete answer", data, err)
			}
			if resp.Close {
				t.Errorf("the answer announced Connection: close, want keep-alive (the quirk is closing anyway)")
			}
			_ = conn.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, err = r.ReadByte()
			closed := errors.Is(err, io.EOF)
			if !closed && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read after the answer: %v", err)
			}
			if closed != quirk {
				t.Errorf("connection closed after the stream: got %v, want %v", closed, quirk)
			}
		})
	}
}

func TestSlotsModeKeepsOnePromptPerSlot(t *testing.T) {
	prompt := map[string][]uint64{}
	for _, tag := range []string{"a", "b", "c"} {
		prompt[tag] = tokenize(words(tag, 40))
	}
	tests := []struct {
		name  string
		slots int
		order []string
		want  []int // cached tokens of each request, run one after another
	}{
		// One slot keeps only the last request: a is gone once b ran (a shared block cache
		// would still hold it).
		{"one slot", 1, []string{"a", "b", "a"}, []int{0, 0, 0}},
		// Two slots: a comes back to the slot that kept it and reuses all but its last token.
		{"two slots", 2, []string{"a", "b", "a"}, []int{0, 0, 39}},
		// c shares nothing, so it takes the least recently used slot, a's; a then finds
		// neither slot similar and takes the least recently used one, b's.
		{"least recently used", 2, []string{"a", "b", "c", "a"}, []int{0, 0, 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := testScheduler(Config{Mode: ModeSlots, Slots: tt.slots, KVCacheTokens: tt.slots * 256})
			var got []int
			for i, tag := range tt.order {
				q := newSequence(uint64(i+1), prompt[tag], 4, 0)
				s.add(q)
				stepUntil(t, s, func() bool { return q.state == stateDone })
				got = append(got, q.out.cached)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("cached tokens of %v: got %v, want %v", tt.order, got, tt.want)
			}
		})
	}
}

func TestSlotsModeReusesAConversationWholly(t *testing.T) {
	// The next turn of a chat starts with the previous prompt and reply: its slot kept all of
	// it, not only the full blocks a block cache would keep.
	s, _ := testScheduler(Config{Mode: ModeSlots, Slots: 2, KVCacheTokens: 2 * 256})
	turn1 := newSequence(1, tokenize(words("q", 42)), 20, 0)
	s.add(turn1)
	stepUntil(t, s, func() bool { return turn1.state == stateDone })
	next := append(slices.Clone(turn1.tokens), tokenize("and then")...)
	turn2 := newSequence(2, next, 2, 0)
	s.add(turn2)
	stepUntil(t, s, func() bool { return turn2.state == stateDone })
	// 42 prompt tokens and 19 of the 20 output tokens were computed (the last is sampled, not
	// computed).
	if got, want := turn2.out.cached, 61; got != want {
		t.Errorf("second turn cached: got %d, want %d", got, want)
	}
}

func TestSlotsModeFreesSlotsOfCancelledAndFailedRequests(t *testing.T) {
	s, c := testScheduler(Config{Mode: ModeSlots, Slots: 1, KVCacheTokens: 256})
	q := newSequence(1, tokenize("a b c"), 50, 0)
	s.add(q)
	s.apply(s.schedule())
	s.cancel(q)
	s.failAll(errDead) // nothing running: a no-op
	r := newSequence(2, tokenize("d e f"), 2, 0)
	s.add(r)
	stepUntil(t, s, func() bool { return r.state == stateDone })
	u := newSequence(3, tokenize("g h i"), 50, 0)
	s.add(u)
	s.apply(s.schedule())
	s.failAll(errDead) // the engine died with u running; a revived engine has its slot back
	w := newSequence(4, tokenize("j k l"), 2, 0)
	s.add(w)
	stepUntil(t, s, func() bool { return w.state == stateDone })
	if got := c.completed.Load(); got != 2 {
		t.Errorf("completed: got %d, want 2", got)
	}
}

// With CancelPoll, as llama-server, a whole answer whose client left keeps its slot (and is
// generated on) until the engine's next check; a stream's client is noticed at once.
func TestCancelPollHoldsAWholeAnswersSlotUntilTheCheck(t *testing.T) {
	cfg := fastConfig()
	cfg.Mode, cfg.Slots, cfg.CancelPoll = ModeSlots, 1, 3*time.Second
	cfg.DecodeBase = 5 * time.Millisecond // 1,500 tokens outlast the check
	e, srv := startEngine(t, cfg)
	for _, stream := range []bool{false, true} {
		before := e.Stats().Cancelled
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			resp, err := send(ctx, srv, "/v1/chat/completions", chat(words("x", 20), 1500, map[string]any{"stream": stream}))
			if err == nil {
				if stream {
					_, _ = io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
			}
		}()
		waitFor(t, "the request runs", func() bool { return e.Stats().Running == 1 })
		cancel()
		<-done
		if stream {
			waitFor(t, "the stream's slot is freed", func() bool { s := e.Stats(); return s.Cancelled == before+1 && s.Running == 0 })
			continue
		}
		time.Sleep(200 * time.Millisecond)
		if s := e.Stats(); s.Cancelled != before || s.Running != 1 {
			t.Fatalf("just after its client left, the whole answer was cancelled (%d) or stopped running (%d): want it held until the check",
				s.Cancelled-before, s.Running)
		}
		waitFor(t, "the check cancels the whole answer", func() bool { s := e.Stats(); return s.Cancelled == before+1 && s.Running == 0 })
	}
}
