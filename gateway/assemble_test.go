package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
)

func TestStreamedBodyAsksForAStreamWithUsage(t *testing.T) {
	cases := []struct {
		name, body string
		ok         bool
	}{
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5}`, true},
		{"stream false and options replaced", `{"model":"m","stream":false,"stream_options":{"include_usage":false},"prompt":"x"}`, true},
		{"n 1", `{"model":"m","prompt":"x","n":1}`, true},
		{"n 2: two choices", `{"model":"m","prompt":"x","n":2}`, false},
		{"tools", `{"model":"m","messages":[],"tools":[{"type":"function"}]}`, false},
		{"logprobs", `{"model":"m","messages":[],"logprobs":true}`, false},
		{"llama.cpp probabilities", `{"model":"m","prompt":"x","n_probs":3}`, false},
		{"unknown member", `{"model":"m","prompt":"x","whatever":1}`, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := streamedBody([]byte(c.body))
			if ok != c.ok {
				t.Fatalf("ok %v, want %v (%s)", ok, c.ok, got)
			}
			if !ok {
				return
			}
			var v map[string]any
			if err := json.Unmarshal(got, &v); err != nil {
				t.Fatalf("%s: %v", got, err)
			}
			if v["stream"] != true || !reflect.DeepEqual(v["stream_options"], map[string]any{"include_usage": true}) {
				t.Errorf("%s: want stream true with include_usage", got)
			}
			var in map[string]any
			_ = json.Unmarshal([]byte(c.body), &in)
			for k, want := range in {
				if k != "stream" && k != "stream_options" && !reflect.DeepEqual(v[k], want) {
					t.Errorf("%s: %s = %v, want %v as sent", got, k, v[k], want)
				}
			}
			if len(v) != len(in)+boolToInt(in["stream"] == nil)+boolToInt(in["stream_options"] == nil) {
				t.Errorf("%s: members added or lost against %s", got, c.body)
			}
		})
	}
}

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// llama.cpp's server streams a chat answer this way (chunks as b6xxx sends them, with its
// timings in the usage chunk).
var llamaChatStream = []string{
	`{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1700000000,"id":"chatcmpl-1","model":"small","system_fingerprint":"b1","object":"chat.completion.chunk"}`,
	`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Hel"}}],"created":1700000000,"id":"chatcmpl-1","model":"small","system_fingerprint":"b1","object":"chat.completion.chunk"}`,
	`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"lo \"you\"\n"}}],"created":1700000000,"id":"chatcmpl-1","model":"small","system_fingerprint":"b1","object":"chat.completion.chunk"}`,
	`{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"created":1700000000,"id":"chatcmpl-1","model":"small","system_fingerprint":"b1","object":"chat.completion.chunk"}`,
	`{"choices":[],"created":1700000000,"id":"chatcmpl-1","model":"small","system_fingerprint":"b1","object":"chat.completion.chunk","usage":{"completion_tokens":2,"prompt_tokens":9,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}},"timings":{"prompt_n":5}}`,
}

func TestAssemblerBuildsTheWholeChatAnswer(t *testing.T) {
	a := newAssembler(true, 1<<20)
	// Each chunk arrives in the same buffer, as the line reader reuses its own: the assembler
	// must keep copies, not slices of it.
	buf := make([]byte, 0, 4096)
	for _, c := range append(llamaChatStream, "[DONE] and what else the next line brings") {
		buf = append(buf[:0], c...)
		if c[0] == '[' {
			break
		}
		if err := a.add(buf); err != nil {
			t.Fatal(err)
		}
	}
	answer := wholeAnswer(t, a)
	var got map[string]any
	if err := json.Unmarshal(answer, &got); err != nil {
		t.Fatalf("%s: %v", answer, err)
	}
	var want map[string]any
	_ = json.Unmarshal([]byte(`{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"small",
		"system_fingerprint":"b1","choices":[{"index":0,"message":{"role":"assistant","content":"Hello \"you\"\n"},
		"logprobs":null,"finish_reason":"length"}],"usage":{"completion_tokens":2,"prompt_tokens":9,"total_tokens":11,
		"prompt_tokens_details":{"cached_tokens":4}},"timings":{"prompt_n":5}}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("assembled\n%s\nwant\n%v", answer, want)
	}
	if u, ok := parseUsage(answer); !ok || u.PromptTokens != 9 || u.cachedTokens() != 4 {
		t.Errorf("usage of the assembled answer: %+v %v", u, ok)
	}
	if a.events != 2 {
		t.Errorf("events %d, want 2 chunks with output", a.events)
	}
}

func TestAssemblerBuildsTheWholeCompletion(t *testing.T) {
	a := newAssembler(false, 1<<20)
	for _, c := range []string{
		`{"id":"c1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"a","finish_reason":null}]}`,
		`{"id":"c1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"b","finish_reason":"stop"}]}`,
	} {
		if err := a.add([]byte(c)); err != nil {
			t.Fatal(err)
		}
	}
	var got struct {
		Object  string
		Choices []struct {
			Text         string
			FinishReason string `json:"finish_reason"`
		}
	}
	answer := wholeAnswer(t, a)
	if err := json.Unmarshal(answer, &got); err != nil {
		t.Fatalf("%s: %v", answer, err)
	}
	if got.Object != "text_completion" || len(got.Choices) != 1 || got.Choices[0].Text != "ab" || got.Choices[0].FinishReason != "stop" {
		t.Errorf("assembled %s", answer)
	}
}

// wholeAnswer is a's answer, which must be valid JSON.
func wholeAnswer(t *testing.T, a *assembler) []byte {
	t.Helper()
	answer, ok := a.answer()
	if !ok {
		t.Fatalf("assembled answer is not valid JSON: %s", answer)
	}
	return answer
}

func TestAssemblerRefusesWhatItCannotAssemble(t *testing.T) {
	cases := map[string]string{
		"error":         `{"error":{"message":"context exceeded","code":500}}`,
		"second choice": `{"choices":[{"index":1,"delta":{"content":"x"}}]}`,
		"not an object": `[1,2]`,
		"not JSON":      `{"choices":`,
		"duplicate key": `{"id":"a","id":"b","choices":[]}`,
	}
	for name, chunk := range cases {
		a := newAssembler(true, 1<<20)
		if err := a.add([]byte(chunk)); !errors.Is(err, errAssembly) {
			t.Errorf("%s: %v, want errAssembly", name, err)
		}
	}
	a := newAssembler(true, 150)
	big := `{"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("x", 60) + `"}}]}`
	if err := a.add([]byte(big)); err != nil {
		t.Fatal(err)
	}
	if err := a.add([]byte(big)); !errors.Is(err, errAnswerTooLarge) {
		t.Errorf("past the bound: %v, want errAnswerTooLarge", err)
	}
}

// A batch request that wants a whole answer from a slot engine (llama.cpp's server, which
// reports its slots) is asked of the worker as a stream, so a preemption stops it within a token
// and usher sees when its prefill ends, and the client gets the whole answer assembled; an
// interactive one, never preempted, goes as it came.
func TestWholeBatchAnswerIsStreamedAndAssembled(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.slots = 4 })
	g := startTierGateway(t, []routing.WorkerSpec{w.spec("w")}, everyClassTier)
	waitForSlotEngine(t, g, "w")
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("batch: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var answer struct {
		Object  string
		Choices []struct {
			Message struct{ Role, Content string }
		}
		Usage usage
	}
	if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	if answer.Object != "chat.completion" || len(answer.Choices) != 1 || answer.Choices[0].Message.Content != "t0 t1 t2 " ||
		answer.Choices[0].Message.Role != "assistant" || answer.Usage.CompletionTokens != 3 {
		t.Errorf("assembled answer %+v", answer)
	}
	if b := w.body(); b["stream"] != true || !reflect.DeepEqual(b["stream_options"], map[string]any{"include_usage": true}) {
		t.Errorf("the worker was asked %v, want a stream with usage", b)
	}
	// A whole answer a stream would not carry (log-probabilities) goes as it came.
	resp = g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","logprobs":true,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{headerPriority: "batch"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("batch with logprobs: %d", resp.StatusCode)
	}
	if b := w.body(); b["stream"] != nil || b["logprobs"] != true {
		t.Errorf("the batch request with logprobs reached the worker as %v, want it as sent", b)
	}
	resp = g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive: %d", resp.StatusCode)
	}
	if b := w.body(); b["stream"] != nil {
		t.Errorf("the interactive request reached the worker as %v, want it as sent", b)
	}
}

// Whatever chunks a worker sends, the assembler either refuses them or builds valid JSON; and
// chunks that are each valid JSON and that it took always make a valid answer (it checks the
// answer once instead of each chunk, so a valid stream must never fail that check).
func FuzzAssemblerAnswerIsValidJSON(f *testing.F) {
	f.Add(strings.Join(llamaChatStream, "\n"), true)
	f.Add(`{"choices":[{"index":0,"text":"a\u00e9","finish_reason":"stop"}],"x":[1,{"y":null}]}`, false)
	f.Add(`{"choices":[{"index":0,"delta":{"content":"\ud800","tool":{"a":1}}}]}`, true)
	f.Fuzz(func(t *testing.T, stream string, chat bool) {
		a := newAssembler(chat, 1<<16)
		buf := make([]byte, 0, 1024)
		valid := true
		for _, line := range strings.Split(stream, "\n") {
			buf = append(buf[:0], line...)
			valid = valid && json.Valid(buf)
			if a.add(buf) != nil {
				return
			}
		}
		clear(buf[:cap(buf)])
		out, ok := a.answer()
		if ok != json.Valid(out) {
			t.Fatalf("answer %s reported valid %v from %q", out, ok, stream)
		}
		if valid && !ok {
			t.Fatalf("valid chunks %q made an invalid answer %s", stream, out)
		}
	})
}

// waitForSlotEngine waits until the gateway's pool knows worker id runs fixed slots.
func waitForSlotEngine(t *testing.T, g *testGateway, id string) {
	t.Helper()
	waitFor(t, "the pool learns the worker's slots", func() bool {
		st, err := g.srv.pool.Worker(id)
		return err == nil && st.SlotEngine
	})
}

// An engine that batches continuously (vLLM, SGLang: no /props slots) gets a standard or batch
// request that wants a whole answer as it came, and its answer is relayed, not assembled, unless
// interactive requests are present (below); so
// does a slot engine a completion with several prompts (one choice each, which the stream's
// assembly could not carry): before, the assembler refused choice 1 and counted it as the
// worker's failure, so a tenant could open every worker's breaker.
func TestWholeAnswerIsRelayedWhereNoAssemblyIsNeeded(t *testing.T) {
	kv := newFakeWorker(t, nil)
	g := startTierGateway(t, []routing.WorkerSpec{kv.spec("kv")}, everyClassTier)
	for _, class := range []string{"standard", "batch"} {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: class})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", class, resp.StatusCode)
		}
		if b := kv.body(); b["stream"] != nil || b["stream_options"] != nil {
			t.Errorf("%s reached the continuous-batching worker as %v, want it as sent", class, b)
		}
	}
	// While interactive requests are present, a batch prompt holds the worker's prefill budget
	// until its first token, which only a stream shows: then it is asked as one, and assembled.
	batchBesideInteractiveIsStreamed(t, g, kv)

	slots := newFakeWorker(t, func(w *fakeWorker) { w.slots = 2 })
	spec := slots.spec("slots")
	g = startTierGateway(t, []routing.WorkerSpec{spec}, everyClassTier)
	waitForSlotEngine(t, g, "slots")
	for i := range 2 * routing.DefaultBreakerFailures {
		resp := g.post(t, "/v1/completions", testKey, `{"model":"m1","prompt":["a","b"],"max_tokens":2}`,
			map[string]string{headerPriority: "batch"})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("completion %d with two prompts: %d", i, resp.StatusCode)
		}
		if b := slots.body(); b["stream"] != nil {
			t.Fatalf("two prompts reached the slot engine as %v, want them as sent", b)
		}
	}
	if st, _ := g.srv.pool.Worker("slots"); st.State != routing.StateHealthy {
		t.Errorf("after completions with two prompts the worker is %s, want healthy", st.State)
	}
}

// Issue 25: a standard request that wants a whole answer, to a continuous-batching (KV) engine
// while no interactive request is present, reaches the engine as its client sent it (stream
// false) and its answer reaches the client as the engine wrote it, service_tier set: relayed, not
// asked as a stream and assembled (which costs the hop a decoding of every chunk).
func TestWholeStandardAnswerFromAKVEngineIsRelayed(t *testing.T) {
	kv := newFakeWorker(t, nil)
	g := startTierGateway(t, []routing.WorkerSpec{kv.spec("kv")}, everyClassTier)
	resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","stream":false,"messages":[{"role":"user","content":"hello"}]}`,
		map[string]string{headerPriority: "standard"})
	got, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("standard: %d %v", resp.StatusCode, err)
	}
	if b := kv.body(); b["stream"] != false || b["stream_options"] != nil {
		t.Errorf("the engine was asked %v, want stream false as the client sent it", b)
	}
	if want := `{"service_tier":"default",` + kv.wholeAnswer()[1:]; string(got) != want {
		t.Errorf("the client got\n%s\nwant the engine's answer relayed\n%s", got, want)
	}
}

// With preemption off, a batch prompt beside interactive requests still holds its worker's
// prefill budget until its first token, so its whole answer is still asked as a stream: relayed
// whole, the budget was held to the answer's last token and batch got a fifth of its share on
// KV-bound engines (measured 2026-11-28).
func TestBudgetedWholeAnswerIsStreamedWithPreemptionOff(t *testing.T) {
	kv := newFakeWorker(t, nil)
	g := startGatewayWith(t, []routing.WorkerSpec{kv.spec("kv")}, func(c *Config) { c.DisablePreemption = true },
		func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
	batchBesideInteractiveIsStreamed(t, g, kv)
}

// batchBesideInteractiveIsStreamed sends an interactive request and then a batch one that wants
// a whole answer, and checks that the batch request reached kv as a stream and its client got
// the answer whole.
func batchBesideInteractiveIsStreamed(t *testing.T, g *testGateway, kv *fakeWorker) {
	t.Helper()
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	resp.Body.Close()
	resp = g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("batch beside interactive: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if b := kv.body(); b["stream"] != true {
		t.Errorf("a batch request beside interactive ones reached the worker as %v, want a stream", b)
	}
}
