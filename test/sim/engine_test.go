package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestStreamingArrivesChunkByChunk(t *testing.T) {
	const maxTokens = 40
	e, srv := startEngine(t, fastConfig())
	resp := post(t, t.Context(), srv, "/v1/chat/completions", chat("hello there", maxTokens, map[string]any{"stream": true}))
	defer resp.Body.Close()
	if got, want := resp.Header.Get("Content-Type"), "text/event-stream"; got != want {
		t.Fatalf("Content-Type: got %q, want %q", got, want)
	}
	sse := sseReader{bufio.NewReader(resp.Body)}
	var content []string
	for i := 0; ; i++ {
		data, err := sse.next()
		if err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
		if data == "[DONE]" {
			break
		}
		if i == 0 {
			if got := e.Stats().GeneratedTokens; got >= maxTokens {
				t.Fatalf("first chunk arrived after %d tokens were generated, want before the last", got)
			}
		}
		var chunk testResponse
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		if chunk.Object != "chat.completion.chunk" || len(chunk.Choices) != 1 || chunk.Choices[0].Delta == nil {
			t.Fatalf("chunk %d: got %s, want a chat.completion.chunk with one delta", i, data)
		}
		d := chunk.Choices[0].Delta
		if gotRole, wantRole := d.Role, map[bool]string{true: "assistant"}[i == 0]; gotRole != wantRole {
			t.Errorf("chunk %d role: got %q, want %q", i, gotRole, wantRole)
		}
		last := i == maxTokens-1
		if got := chunk.Choices[0].FinishReason; (got != nil) != last || (last && *got != "length") {
			t.Errorf("chunk %d finish_reason: got %v, want \"length\" only on the last", i, got)
		}
		if chunk.Usage != nil {
			t.Errorf("chunk %d carries usage without include_usage", i)
		}
		content = append(content, d.Content)
	}
	if got := len(strings.Fields(strings.Join(content, ""))); got != maxTokens {
		t.Errorf("streamed words: got %d, want %d", got, maxTokens)
	}
	if got := len(content); got != maxTokens {
		t.Errorf("chunks: got %d, want one per token, %d", got, maxTokens)
	}
}

func TestIncludeUsageChunk(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	body := chat("one two three", 3, map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp := post(t, t.Context(), srv, "/v1/chat/completions", body)
	defer resp.Body.Close()
	sse := sseReader{bufio.NewReader(resp.Body)}
	var events []string
	for {
		data, err := sse.next()
		if err != nil {
			t.Fatalf("stream ended without [DONE]: %v", err)
		}
		if data == "[DONE]" {
			break
		}
		events = append(events, data)
	}
	if got, want := len(events), 4; got != want {
		t.Fatalf("events: got %d, want %d (3 tokens and usage)", got, want)
	}
	var last testResponse
	if err := json.Unmarshal([]byte(events[3]), &last); err != nil {
		t.Fatal(err)
	}
	if last.Choices == nil || len(last.Choices) != 0 {
		t.Errorf("usage chunk choices: got %v, want []", last.Choices)
	}
	// "<|user|> one two three <|assistant|>" is 5 tokens.
	if last.Usage == nil || last.Usage.PromptTokens != 5 || last.Usage.CompletionTokens != 3 || last.Usage.TotalTokens != 8 {
		t.Errorf("usage: got %+v, want 5 prompt, 3 completion, 8 total", last.Usage)
	}
}

func TestNonStreamingUsage(t *testing.T) {
	tests := []struct {
		name       string
		path       string
		body       map[string]any
		wantObject string
		wantPrompt int
		wantOutput int
	}{
		{"chat", "/v1/chat/completions", chat("a b c", 5, nil), "chat.completion", 5, 5},
		{"chat max_completion_tokens", "/v1/chat/completions",
			map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]string{{"type": "text", "text": "x y"}}}}, "max_completion_tokens": 2},
			"chat.completion", 4, 2},
		{"chat default max_tokens", "/v1/chat/completions",
			map[string]any{"messages": []map[string]string{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}}},
			"chat.completion", 6, 8},
		{"completion string", "/v1/completions", map[string]any{"model": "demo-7b", "prompt": "the quick brown fox", "max_tokens": 3}, "text_completion", 4, 3},
		{"completion array", "/v1/completions", map[string]any{"prompt": []string{"one two", "ignored"}, "max_tokens": 4}, "text_completion", 2, 4},
	}
	e, srv := startEngine(t, fastConfig())
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := post(t, t.Context(), srv, tt.path, tt.body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status: got %d, want 200", resp.StatusCode)
			}
			r := decodeJSON[testResponse](t, resp)
			if r.Object != tt.wantObject || r.Model != "demo-7b" || r.ID == "" {
				t.Errorf("envelope: got object %q model %q id %q, want %q demo-7b and an id", r.Object, r.Model, r.ID, tt.wantObject)
			}
			if len(r.Choices) != 1 {
				t.Fatalf("choices: got %d, want 1", len(r.Choices))
			}
			c := r.Choices[0]
			var text string
			switch {
			case c.Message != nil:
				text = c.Message.Content
				if c.Message.Role != "assistant" {
					t.Errorf("role: got %q, want assistant", c.Message.Role)
				}
			case c.Text != nil:
				text = *c.Text
			}
			if got := len(strings.Fields(text)); got != tt.wantOutput {
				t.Errorf("output words: got %d (%q), want %d", got, text, tt.wantOutput)
			}
			if c.FinishReason == nil || *c.FinishReason != "length" {
				t.Errorf("finish_reason: got %v, want length", c.FinishReason)
			}
			u := r.Usage
			if u == nil || u.PromptTokens != tt.wantPrompt || u.CompletionTokens != tt.wantOutput || u.TotalTokens != tt.wantPrompt+tt.wantOutput {
				t.Errorf("usage: got %+v, want prompt %d, completion %d", u, tt.wantPrompt, tt.wantOutput)
			}
		})
	}
	if got, want := e.Stats().Completed, int64(len(tests)); got != want {
		t.Errorf("Completed: got %d, want %d", got, want)
	}
}

func TestOutputIsRepeatable(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	answer := func(prompt string) string {
		r := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 6}))
		return *r.Choices[0].Text
	}
	a1, a2, b := answer("same prompt"), answer("same prompt"), answer("other prompt")
	if a1 != a2 {
		t.Errorf("same prompt: got %q then %q, want equal answers", a1, a2)
	}
	if a1 == b {
		t.Errorf("different prompts both answered %q, want different answers", a1)
	}
}

func TestPrefixCacheHits(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	// 100 completion tokens: all but the last are cacheable, in full blocks of 16: 96.
	prompt := words("w", 100)
	var cached []int
	for range 2 {
		r := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 2}))
		cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] != 96 {
		t.Errorf("cached_tokens: got %v, want [0 96]", cached)
	}
	s := e.Stats()
	if s.PrefixCacheQueries != 200 || s.PrefixCacheHits != 96 || s.CachedPromptTokens != 96 || s.PromptTokens != 200 {
		t.Errorf("stats: got queries %d hits %d cached %d prompt %d, want 200 96 96 200",
			s.PrefixCacheQueries, s.PrefixCacheHits, s.CachedPromptTokens, s.PromptTokens)
	}
	for sample, want := range map[string]string{
		`vllm:prefix_cache_queries_total{model_name="demo-7b"}`:                     "200",
		`vllm:prefix_cache_hits_total{model_name="demo-7b"}`:                        "96",
		`vllm:prompt_tokens_total{model_name="demo-7b"}`:                            "200",
		`vllm:generation_tokens_total{model_name="demo-7b"}`:                        "4",
		`vllm:request_success_total{finished_reason="length",model_name="demo-7b"}`: "2",
		`vllm:kv_cache_usage_perc{model_name="demo-7b"}`:                            "0",
		`vllm:request_queue_time_seconds_count{model_name="demo-7b"}`:               "2",
		`vllm:time_to_first_token_seconds_count{model_name="demo-7b"}`:              "2",
		`vllm:e2e_request_latency_seconds_count{model_name="demo-7b"}`:              "2",
	} {
		if got := scrape(t, srv, sample); got != want {
			t.Errorf("%s: got %s, want %s", sample, got, want)
		}
	}
}

func TestChatTurnSharesPrefix(t *testing.T) {
	_, srv := startEngine(t, fastConfig())
	question := words("q", 40)
	first := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/chat/completions", chat(question, 20, nil)))
	reply := first.Choices[0].Message.Content
	second := map[string]any{
		"messages": []map[string]string{
			{"role": "user", "content": question},
			{"role": "assistant", "content": reply},
			{"role": "user", "content": "and then"},
		},
		"max_tokens": 2,
	}
	r := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/chat/completions", second))
	// Turn one computed its 42 prompt tokens and 19 of its 20 output tokens: 61 tokens, 3 full
	// blocks of 16.
	if got, want := r.Usage.PromptTokensDetails.CachedTokens, 48; got != want {
		t.Errorf("second turn cached_tokens: got %d, want %d", got, want)
	}
}

func TestLRUEviction(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCacheTokens = 6 * 16
	e, srv := startEngine(t, cfg)
	// Each prompt is 33 tokens: 2 cacheable blocks plus one more; 6 blocks hold two of them.
	cachedTokens := func(tag string) int {
		r := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": words(tag, 33), "max_tokens": 1}))
		return r.Usage.PromptTokensDetails.CachedTokens
	}
	steps := []struct {
		prompt string
		want   int
	}{
		{"a", 0},
		{"b", 0},
		{"c", 0},  // evicts a's deeper block, the least recently freed
		{"b", 32}, // b freed after a: still whole
		{"a", 16}, // a keeps its first block only
	}
	for i, s := range steps {
		if got := cachedTokens(s.prompt); got != s.want {
			t.Errorf("step %d (%s): cached_tokens got %d, want %d", i, s.prompt, got, s.want)
		}
	}
	if got := e.Stats().EvictedBlocks; got < 1 {
		t.Errorf("EvictedBlocks: got %d, want at least 1", got)
	}
}

// streamUntilFirstChunk starts a streaming request and returns once its first chunk arrived;
// cancel ends it.
func streamUntilFirstChunk(t *testing.T, start func(ctx context.Context) *http.Response) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	resp := start(ctx)
	if _, err := (sseReader{bufio.NewReader(resp.Body)}).next(); err != nil {
		t.Fatalf("first chunk: %v", err)
	}
	return func() { cancel(); resp.Body.Close() }
}

func TestBatchingLimit(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 2
	e, srv := startEngine(t, cfg)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	for i := range 3 {
		wg.Go(func() {
			resp, err := send(ctx, srv, "/v1/chat/completions", chat(fmt.Sprintf("long %d", i), 5000, map[string]any{"stream": true}))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	waitFor(t, "2 running and 1 waiting", func() bool { s := e.Stats(); return s.Running == 2 && s.Waiting == 1 })
	if got := scrape(t, srv, `vllm:num_requests_waiting{model_name="demo-7b"}`); got != "1" {
		t.Errorf("vllm:num_requests_waiting: got %s, want 1", got)
	}
	if got := scrape(t, srv, `vllm:num_requests_running{model_name="demo-7b"}`); got != "2" {
		t.Errorf("vllm:num_requests_running: got %s, want 2", got)
	}
	cancel()
	wg.Wait()
	waitFor(t, "all cancelled", func() bool { s := e.Stats(); return s.Cancelled == 3 && s.Running == 0 && s.Waiting == 0 })
}

func TestPriorityScheduling(t *testing.T) {
	tests := []struct {
		policy string
		want   []int
	}{
		{PolicyFCFS, []int{5, 1, 3}},
		{PolicyPriority, []int{1, 3, 5}},
	}
	for _, tt := range tests {
		t.Run(tt.policy, func(t *testing.T) {
			cfg := fastConfig()
			cfg.MaxNumSeqs = 1
			cfg.SchedulingPolicy = tt.policy
			e, srv := startEngine(t, cfg)
			stopBlocker := streamUntilFirstChunk(t, func(ctx context.Context) *http.Response {
				return post(t, ctx, srv, "/v1/chat/completions", chat("blocker", 5000, map[string]any{"stream": true}))
			})
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			for i, prio := range []int{5, 1, 3} {
				wg.Go(func() {
					resp, err := send(t.Context(), srv, "/v1/completions", map[string]any{"prompt": "p", "max_tokens": 30, "priority": prio})
					if err != nil {
						t.Errorf("priority %d: %v", prio, err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					order = append(order, prio)
					mu.Unlock()
				})
				waitFor(t, "queued", func() bool { return e.Stats().Waiting == i+1 })
			}
			stopBlocker()
			wg.Wait()
			if fmt.Sprint(order) != fmt.Sprint(tt.want) {
				t.Errorf("completion order: got %v, want %v", order, tt.want)
			}
			if got := e.Stats().Priorities; got[1] != 1 || got[3] != 1 || got[5] != 1 || got[0] != 1 {
				t.Errorf("Priorities: got %v, want one each of 0, 1, 3, 5", got)
			}
		})
	}
}

func TestCancelFreesSlot(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 1
	e, srv := startEngine(t, cfg)
	stop := streamUntilFirstChunk(t, func(ctx context.Context) *http.Response {
		return post(t, ctx, srv, "/v1/chat/completions", chat(words("x", 50), 5000, map[string]any{"stream": true}))
	})
	waitingCtx, cancelWaiting := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(waitingCtx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"w","max_tokens":3}`))
		if resp, err := srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "one waiting", func() bool { return e.Stats().Waiting == 1 })
	if s := e.Stats(); s.KVCacheUsage <= 0 {
		t.Errorf("KVCacheUsage while running: got %g, want > 0", s.KVCacheUsage)
	}
	cancelWaiting()
	<-done
	waitFor(t, "waiting request cancelled", func() bool { s := e.Stats(); return s.Cancelled == 1 && s.Waiting == 0 })
	stop()
	waitFor(t, "running request cancelled", func() bool { s := e.Stats(); return s.Cancelled == 2 && s.Running == 0 })
	if s := e.Stats(); s.KVCacheUsage != 0 {
		t.Errorf("KVCacheUsage after cancel: got %g, want 0", s.KVCacheUsage)
	}
	resp := post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "after", "max_tokens": 2})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("request after cancel: got %d, want 200", resp.StatusCode)
	}
	resp.Body.Close()
}

// The engine's time counts every running sequence's steps, and those of a sequence cancelled
// while running as lost too: the queue benchmark reads them to tell slots idle from work thrown
// away by preemption.
func TestSequenceTimeCountsLostWork(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "done", "max_tokens": 4})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	s := e.Stats()
	if s.SequenceTime < 4*time.Millisecond || s.LostSequenceTime != 0 {
		t.Fatalf("after a request of 4 tokens in steps of at least 1 ms: SequenceTime %v (want >= 4ms), LostSequenceTime %v (want 0)",
			s.SequenceTime, s.LostSequenceTime)
	}
	finished := s.SequenceTime
	stop := streamUntilFirstChunk(t, func(ctx context.Context) *http.Response {
		return post(t, ctx, srv, "/v1/chat/completions", chat(words("x", 50), 5000, map[string]any{"stream": true}))
	})
	stop()
	waitFor(t, "running request cancelled", func() bool { s := e.Stats(); return s.Cancelled == 1 && s.Running == 0 })
	s = e.Stats()
	if s.LostSequenceTime < time.Millisecond || s.LostSequenceTime != s.SequenceTime-finished {
		t.Errorf("after a stream cancelled past its first token: LostSequenceTime %v, want at least 1ms and all of SequenceTime's growth (%v)",
			s.LostSequenceTime, s.SequenceTime-finished)
	}
}

func TestPreemptionWhenCacheFills(t *testing.T) {
	cfg := fastConfig()
	cfg.KVCacheTokens = 8 * 16
	e, srv := startEngine(t, cfg)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			// 20 prompt tokens and 80 output: 7 blocks each at the end, 14 for both.
			resp, err := send(t.Context(), srv, "/v1/completions", map[string]any{"prompt": words(fmt.Sprint("p", i), 20), "max_tokens": 80})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			defer resp.Body.Close()
			var r testResponse
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Usage == nil || r.Usage.CompletionTokens != 80 {
				t.Errorf("request %d: got %+v (%v), want 80 completion tokens", i, r.Usage, err)
			}
		})
	}
	wg.Wait()
	if s := e.Stats(); s.Preemptions < 1 || s.Completed != 2 {
		t.Errorf("got %d preemptions and %d completed, want at least 1 and 2", s.Preemptions, s.Completed)
	}
}

func TestBadInput(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxBodyBytes = 1024
	cfg.MaxModelLen = 100
	e, srv := startEngine(t, cfg)
	tests := []struct {
		name     string
		method   string
		path     string
		body     string
		wantCode int
		wantErr  string
	}{
		{"malformed json", "POST", "/v1/chat/completions", `{"messages":`, 400, "invalid_json"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"demo-7b"}`, 400, "missing_messages"},
		{"missing prompt", "POST", "/v1/completions", `{"model":"demo-7b"}`, 400, "invalid_prompt"},
		{"prompt of numbers", "POST", "/v1/completions", `{"prompt":[1,2,3]}`, 400, "invalid_prompt"},
		{"empty prompt", "POST", "/v1/completions", `{"prompt":"   "}`, 400, "context_length_exceeded"},
		{"zero max_tokens", "POST", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "context_length_exceeded"},
		{"too long", "POST", "/v1/completions", `{"prompt":"a","max_tokens":100}`, 400, "context_length_exceeded"},
		{"other model", "POST", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"hi"}]}`, 404, "model_not_found"},
		{"body too large", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a ", 1000) + `"}`, 413, "request_too_large"},
		{"wrong method", "GET", "/v1/completions", ``, 405, "method_not_allowed"},
		{"unknown path", "GET", "/v2/nothing", ``, 404, "not_found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tt.wantCode {
				t.Errorf("status: got %d, want %d", resp.StatusCode, tt.wantCode)
			}
			body := decodeJSON[testError](t, resp)
			if body.Error == nil || body.Error.Code != tt.wantErr || body.Error.Message == "" || body.Error.Type == "" {
				t.Errorf("error body: got %+v, want code %q with a message and type", body.Error, tt.wantErr)
			}
		})
	}
	if got, want := e.Stats().BadRequests, int64(9); got != want {
		t.Errorf("BadRequests: got %d, want %d", got, want)
	}
}

func TestModelsAndHealth(t *testing.T) {
	_, srv := startEngine(t, Config{Model: "tiny-1b"})
	resp, err := srv.Client().Get(srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	models := decodeJSON[struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}](t, resp)
	if models.Object != "list" || len(models.Data) != 1 || models.Data[0].ID != "tiny-1b" || models.Data[0].Object != "model" {
		t.Errorf("models: got %+v, want one model tiny-1b", models)
	}
	health, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusOK {
		t.Errorf("health: got %d, want 200", health.StatusCode)
	}
}

func TestCloseEndsRequestsInFlight(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	resp := post(t, t.Context(), srv, "/v1/chat/completions", chat("s", 5000, map[string]any{"stream": true}))
	defer resp.Body.Close()
	sse := sseReader{bufio.NewReader(resp.Body)}
	if _, err := sse.next(); err != nil {
		t.Fatal(err)
	}
	e.Close()
	select {
	case <-e.loopDone:
	default:
		t.Fatal("scheduler goroutine still running after Close")
	}
	var sawError bool
	for {
		data, err := sse.next()
		if err != nil {
			t.Fatalf("stream ended without [DONE]: %v", err)
		}
		if data == "[DONE]" {
			break
		}
		sawError = sawError || strings.Contains(data, `"engine_closed"`)
	}
	if !sawError {
		t.Error("stream cut by Close carried no error event")
	}
	after := post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "late"})
	after.Body.Close()
	if after.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("request after Close: got %d, want 503", after.StatusCode)
	}
	health, err := srv.Client().Get(srv.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	health.Body.Close()
	if health.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("health after Close: got %d, want 503", health.StatusCode)
	}
	e.Close()
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	if _, err := New(Config{BlockSize: -1}, Options{}); err == nil || !strings.Contains(err.Error(), "sim.block_size") {
		t.Errorf("New with a negative block size: got %v, want an error naming sim.block_size", err)
	}
}

func TestTimeScale(t *testing.T) {
	cfg := Config{DecodeBase: time.Second, TimeScale: 0.01}
	_, srv := startEngine(t, cfg)
	start := time.Now()
	resp := post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 20})
	resp.Body.Close()
	// 20 steps of 1 s at a hundredth: 200 ms; unscaled they would take 20 s. The bounds tell the
	// two apart with room for a busy machine on either side, and neither is tight.
	if got := time.Since(start); got < 150*time.Millisecond || got > 10*time.Second {
		t.Errorf("20 steps of 1 s at time scale 0.01: took %v, want about 200 ms, far from the unscaled 20 s", got)
	}
}

func TestManyRequestsLeaveNothingBehind(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 8
	cfg.KVCacheTokens = 12 * 16
	e, srv := startEngine(t, cfg)
	const n = 60
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if i%3 == 0 {
				ctx, cancel = context.WithTimeout(ctx, time.Duration(i%7)*time.Millisecond)
				defer cancel()
			}
			// Shared 32-token head, so requests share cached blocks while they run.
			body := chat(words("shared", 32)+" "+words(fmt.Sprint("own", i%5, "-"), 20), 10+i%20, map[string]any{"stream": i%2 == 0})
			resp, err := send(ctx, srv, "/v1/chat/completions", body)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	waitFor(t, "every request accounted for", func() bool {
		s := e.Stats()
		return s.Completed+s.Cancelled+s.BadRequests == s.Requests && s.Running == 0 && s.Waiting == 0
	})
	s := e.Stats()
	if s.Requests < n/2 || s.Completed < n/3 {
		t.Errorf("got %d requests and %d completed, want most of %d to arrive and many to complete", s.Requests, s.Completed, n)
	}
	if s.KVCacheUsage != 0 {
		t.Errorf("KVCacheUsage with nothing running: got %g, want 0", s.KVCacheUsage)
	}
	if s.CachedPromptTokens == 0 {
		t.Error("CachedPromptTokens: got 0, want hits on the shared head")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if got, want := e.sched.pool.nfree, e.sched.pool.numBlocks(); got != want {
		t.Errorf("free blocks with nothing running: got %d, want all %d", got, want)
	}
	for i := range e.sched.pool.blocks {
		if b := &e.sched.pool.blocks[i]; b.ref != 0 {
			t.Fatalf("block %d: got ref %d, want 0", i, b.ref)
		}
	}
}

func TestStreamHeadersBeforeAdmission(t *testing.T) {
	cfg := fastConfig()
	cfg.MaxNumSeqs = 1
	e, srv := startEngine(t, cfg)
	stop := streamUntilFirstChunk(t, func(ctx context.Context) *http.Response {
		return post(t, ctx, srv, "/v1/chat/completions", chat("blocker", 5000, map[string]any{"stream": true}))
	})
	defer stop()
	resp := post(t, t.Context(), srv, "/v1/chat/completions", chat("queued", 5, map[string]any{"stream": true}))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || e.Stats().Waiting != 1 {
		t.Fatalf("got status %d with %d waiting, want 200 headers while the request waits", resp.StatusCode, e.Stats().Waiting)
	}
	e.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"engine_closed"`) || !strings.HasSuffix(string(data), "data: [DONE]\n\n") {
		t.Errorf("waiting stream ended by Close: got %q, want an error event then [DONE]", data)
	}
}

func TestCloseLeavesNoGoroutine(t *testing.T) {
	before := runtime.NumGoroutine()
	for range 20 {
		e, err := New(fastConfig(), Options{})
		if err != nil {
			t.Fatal(err)
		}
		e.Close()
	}
	waitFor(t, "goroutines back to the baseline", func() bool { return runtime.NumGoroutine() <= before })
}

// BenchmarkStreamingRequest measures one streamed 16-token chat request end to end over
// loopback HTTP, with engine time scaled to nearly nothing: the simulator's own overhead.
func BenchmarkStreamingRequest(b *testing.B) {
	cfg := fastConfig()
	cfg.TimeScale = 1e-6
	_, srv := startEngine(b, cfg)
	body := chat(words("bench", 200), 16, map[string]any{"stream": true})
	b.ReportAllocs()
	for b.Loop() {
		resp := post(b, b.Context(), srv, "/v1/chat/completions", body)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// TestCacheSaltPartitionsThePrefixCache: in ModeKV a prompt hits only blocks computed under its
// own cache_salt, as in vLLM; ModeSlots ignores the field, as llama-server does.
func TestCacheSaltPartitionsThePrefixCache(t *testing.T) {
	prompt := words("w", 100) // 96 cacheable tokens
	for _, tt := range []struct {
		mode  string
		salts []any // of the requests in turn; nil: none sent
		want  []int
	}{
		{ModeKV, []any{"a", "a"}, []int{0, 96}},
		{ModeKV, []any{"a", "b"}, []int{0, 0}},
		{ModeKV, []any{nil, "a"}, []int{0, 0}},
		{ModeKV, []any{"a", nil}, []int{0, 0}},
		{ModeKV, []any{"a", "b", "a"}, []int{0, 0, 96}},
		{ModeSlots, []any{"a", "b"}, nil}, // whatever the slot keeps, the salt changes nothing
	} {
		t.Run(fmt.Sprintf("%s %v", tt.mode, tt.salts), func(t *testing.T) {
			cfg := fastConfig()
			cfg.Mode = tt.mode
			if tt.mode == ModeSlots {
				cfg.Slots = 1
			}
			e, srv := startEngine(t, cfg)
			var cached []int
			for _, s := range tt.salts {
				body := map[string]any{"prompt": prompt, "max_tokens": 2}
				if s != nil {
					body["cache_salt"] = s
				}
				r := decodeJSON[testResponse](t, post(t, t.Context(), srv, "/v1/completions", body))
				cached = append(cached, r.Usage.PromptTokensDetails.CachedTokens)
			}
			if tt.mode == ModeSlots {
				if cached[1] == 0 {
					t.Errorf("slots: cached_tokens %v, want the second request to reuse the slot whatever its salt", cached)
				}
			} else if !slices.Equal(cached, tt.want) {
				t.Errorf("cached_tokens: got %v, want %v", cached, tt.want)
			}
			if got := e.Stats().CacheSalts; got["a"] == 0 {
				t.Errorf("the engine counted salts %v, want a", got)
			}
		})
	}
}
