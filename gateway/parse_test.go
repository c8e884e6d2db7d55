package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParseInferenceRequest(t *testing.T) {
	tests := []struct {
		name       string
		ep         endpoint
		body       string
		wantParam  string // "" with wantOK
		wantOK     bool
		wantPrompt string
	}{
		{"chat", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":"hi there"}]}`, "", true, "user hi there\n"},
		{"chat parts", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"b"}]}]}`, "", true, "user ab\n"},
		{"chat two turns", chatEndpoint, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"u"}]}`, "", true, "system s\nuser u\n"},
		{"completion string", completionEndpoint, `{"model":"m","prompt":"once upon"}`, "", true, "once upon"},
		{"completion list", completionEndpoint, `{"model":"m","prompt":["first","second"]}`, "", true, "first"},
		{"empty body", chatEndpoint, ``, "", false, ""},
		{"not json", chatEndpoint, `{"model":`, "", false, ""},
		{"array body", chatEndpoint, `[1,2]`, "", false, ""},
		{"missing model", chatEndpoint, `{"messages":[{"role":"user","content":"x"}]}`, "model", false, ""},
		{"missing messages", chatEndpoint, `{"model":"m"}`, "messages", false, ""},
		{"empty messages", chatEndpoint, `{"model":"m","messages":[]}`, "messages", false, ""},
		{"message without role", chatEndpoint, `{"model":"m","messages":[{"content":"x"}]}`, "messages", false, ""},
		{"content of wrong type", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":42}]}`, "messages", false, ""},
		{"missing prompt", completionEndpoint, `{"model":"m"}`, "prompt", false, ""},
		{"prompt of wrong type", completionEndpoint, `{"model":"m","prompt":{"a":1}}`, "prompt", false, ""},
		{"negative max_tokens", chatEndpoint, `{"model":"m","max_tokens":-1,"messages":[{"role":"user","content":"x"}]}`, "max_tokens", false, ""},
		{"bad stream_options", chatEndpoint, `{"model":"m","stream":true,"stream_options":"yes","messages":[{"role":"user","content":"x"}]}`, "stream_options", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newCall(tt.ep, time.Time{})
			err := parseBody([]byte(tt.body), r, defaultMaxJSONDepth)
			if tt.wantOK {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				if r.prompt != tt.wantPrompt {
					t.Fatalf("prompt: got %q, want %q", r.prompt, tt.wantPrompt)
				}
				return
			}
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 {
				t.Fatalf("got %v, want a 400 APIError", err)
			}
			if ae.Param != tt.wantParam {
				t.Fatalf("param: got %q, want %q", ae.Param, tt.wantParam)
			}
		})
	}
}

func TestForUpstreamAsksForUsage(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantUsage bool // whether the upstream body carries include_usage true
		same      bool // whether the body is forwarded unchanged
	}{
		{"not streaming", `{"model":"m","messages":[]}`, false, true},
		{"stream without options", `{"model":"m","stream":true,"temperature":0.5}`, true, false},
		{"stream with other options", `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`, true, false},
		{"stream asking usage", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, true, true},
		{"stream refusing usage", `{"model":"m","stream":true,"stream_options":{"include_usage":false}}`, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := withPrompt(tt.body)
			r := newCall(completionEndpoint, time.Time{})
			if err := parseBody([]byte(body), r, defaultMaxJSONDepth); err != nil {
				t.Fatal(err)
			}
			out := r.upstream
			if got := bytes.Equal(out, []byte(body)); got != tt.same {
				t.Fatalf("unchanged: got %v, want %v (out %s)", got, tt.same, out)
			}
			var fields struct {
				Temperature   *float64        `json:"temperature"`
				StreamOptions map[string]bool `json:"stream_options"`
			}
			if err := json.Unmarshal(out, &fields); err != nil {
				t.Fatal(err)
			}
			if got := fields.StreamOptions["include_usage"]; got != tt.wantUsage {
				t.Fatalf("include_usage: got %v, want %v (out %s)", got, tt.wantUsage, out)
			}
			if strings.Contains(tt.body, "continuous_usage_stats") && !fields.StreamOptions["continuous_usage_stats"] {
				t.Fatalf("the client's other stream options were lost: %s", out)
			}
			if strings.Contains(tt.body, "temperature") && fields.Temperature == nil {
				t.Fatalf("the client's other fields were lost: %s", out)
			}
		})
	}
}

// withPrompt gives body, which has no prompt, one, so it parses as a completion request.
func withPrompt(body string) string {
	return strings.Replace(body, `"model":"m"`, `"model":"m","prompt":"p"`, 1)
}

func TestParseUsage(t *testing.T) {
	tests := []struct {
		name      string
		payload   string
		want      usage
		wantOK    bool
		usageOnly bool
	}{
		{"response", `{"choices":[{"text":"x"}],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":2}}}`,
			usage{PromptTokens: 3, CompletionTokens: 4, TotalTokens: 7}, true, false},
		{"usage chunk", `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`,
			usage{PromptTokens: 1, CompletionTokens: 2, TotalTokens: 3}, true, true},
		{"null usage", `{"choices":[{"delta":{"content":"a"}}],"usage":null}`, usage{}, false, false},
		{"no usage", `{"choices":[{"delta":{"content":"usage"}}]}`, usage{}, false, false},
		{"broken", `{"usage":{`, usage{}, false, false},
		{"spaced key", `{"choices":[{"text":"x"}], "usage" : {"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`,
			usage{PromptTokens: 2, CompletionTokens: 1, TotalTokens: 3}, true, false},
		{"usage in the content, then the real one", `{"choices":[{"message":{"content":"my \"usage\": {\"prompt_tokens\": 99} is"}}],"usage":{"prompt_tokens":4,"completion_tokens":5,"total_tokens":9}}`,
			usage{PromptTokens: 4, CompletionTokens: 5, TotalTokens: 9}, true, false},
		{"a usage key before the last", `{"x":{"usage":{"prompt_tokens":99}},"choices":[{"text":"x"}],"usage":{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}}`,
			usage{PromptTokens: 6, CompletionTokens: 1, TotalTokens: 7}, true, false},
		{"overlapping keys", `{"x":"usage","usage":{"prompt_tokens":6,"completion_tokens":1,"total_tokens":7}}`,
			usage{PromptTokens: 6, CompletionTokens: 1, TotalTokens: 7}, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseUsage([]byte(tt.payload))
			if ok != tt.wantOK || got.PromptTokens != tt.want.PromptTokens || got.CompletionTokens != tt.want.CompletionTokens {
				t.Fatalf("got %+v %v, want %+v %v", got, ok, tt.want, tt.wantOK)
			}
			if isUsageOnlyChunk([]byte(tt.payload)) != tt.usageOnly {
				t.Fatalf("usage only: got %v, want %v", !tt.usageOnly, tt.usageOnly)
			}
		})
	}
	if u, _ := parseUsage([]byte(tests[0].payload)); u.cachedTokens() != 2 {
		t.Fatalf("cached tokens: got %d, want 2", u.cachedTokens())
	}
}

func TestLineReader(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	in := "data: a\n\n" + "data: " + long + "\n\ndata: [DONE]\n\n"
	lr := newLineReader(strings.NewReader(in), 1<<20)
	var got []string
	for {
		line, err := lr.next()
		if len(line) > 0 {
			got = append(got, string(line))
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				t.Fatal(err)
			}
			break
		}
	}
	if strings.Join(got, "") != in {
		t.Fatalf("lines do not add up to the input")
	}
	if len(got) != 6 {
		t.Fatalf("got %d lines, want 6", len(got))
	}
	lr = newLineReader(strings.NewReader("data: "+long+"\n"), 1024)
	if _, err := lr.next(); !errors.Is(err, errLineTooLong) {
		t.Fatalf("got %v, want errLineTooLong", err)
	}
}

func TestValidRequestID(t *testing.T) {
	for id, want := range map[string]bool{
		"abc-123_x.y:z":                        true,
		"":                                     false,
		strings.Repeat("a", maxRequestIDLen):   true,
		strings.Repeat("a", maxRequestIDLen+1): false,
		"has space":                            false,
		"new\nline":                            false,
		"<script>":                             false,
	} {
		if got := validRequestID(id); got != want {
			t.Errorf("validRequestID(%q): got %v, want %v", id, got, want)
		}
	}
}

func FuzzParseInferenceRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true)
	f.Add([]byte(`{"model":"m","prompt":["a"],"stream":true,"stream_options":{"include_usage":false}}`), false)
	f.Add([]byte(`{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"a"}]}]}`), true)
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := completionEndpoint
		if chat {
			ep = chatEndpoint
		}
		r := newCall(ep, time.Time{})
		if err := parseBody(body, r, defaultMaxJSONDepth); err != nil {
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 {
				t.Fatalf("got %v, want a 400", err)
			}
			return
		}
		for i, handoff := range []bool{false, true, false, true} {
			engine := ""
			if i >= 2 {
				engine = "engine/\"name\""
			}
			out := r.upstreamBody(handoff, engine)
			if !json.Valid(out) {
				t.Fatalf("upstream body is not JSON: %s", out)
			}
			// The worker reads what usher read: same model, no ambiguity left.
			var got map[string]json.RawMessage
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			var model string
			want := r.model
			if engine != "" {
				want = engine
			}
			if err := json.Unmarshal(got["model"], &model); err != nil || model != want {
				t.Fatalf("upstream model %q, want %q (body %s)", model, want, out)
			}
		}
	})
}

// The attacks of a parser differential: a body that usher would read one way and a Python or C++
// engine another. Each is refused with 400 naming the problem.
func TestParserDifferentialsAreRefused(t *testing.T) {
	tests := []struct {
		name string
		ep   endpoint
		body string
	}{
		{"re-cased model", chatEndpoint, `{"model":"premium-13b","Model":"demo-7b","messages":[{"role":"user","content":"x"}]}`},
		{"duplicate model", chatEndpoint, `{"model":"demo-7b","model":"premium-13b","messages":[{"role":"user","content":"x"}]}`},
		{"escaped duplicate model", chatEndpoint, `{"model":"demo-7b","\u006dodel":"premium-13b","messages":[{"role":"user","content":"x"}]}`},
		{"re-cased messages", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":"long"}],"Messages":[{"role":"user","content":"x"}]}`},
		{"re-cased max_tokens", chatEndpoint, `{"model":"m","max_tokens":100000,"MAX_TOKENS":1,"messages":[{"role":"user","content":"x"}]}`},
		{"duplicate content in a message", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":"long long","content":"x"}]}`},
		{"re-cased content in a message", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":"long long","Content":"x"}]}`},
		{"re-cased text in a part", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","TEXT":"b"}]}]}`},
		{"re-cased stream_options key", chatEndpoint, `{"model":"m","stream":true,"stream_options":{"include_usage":false,"Include_Usage":true},"messages":[{"role":"user","content":"x"}]}`},
		{"re-cased prompt", completionEndpoint, `{"model":"m","prompt":"a","PROMPT":"long"}`},
		// The Kelvin sign (3 bytes) folds to k: a key of another length may still be re-cased.
		{"max_tokens with a Kelvin sign", chatEndpoint, "{\"model\":\"m\",\"max_tokens\":1,\"max_to\u212aens\":100000,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
		{"escaped Kelvin sign", chatEndpoint, `{"model":"m","max_tokens":1,"max_to\u212aens":100000,"messages":[{"role":"user","content":"x"}]}`},
		{"stream with a long s", chatEndpoint, "{\"model\":\"m\",\"\u017ftream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}"},
		{"max_tokens overflowing int64", chatEndpoint, `{"model":"m","max_tokens":9223372036854775808,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens 2^63-1", chatEndpoint, `{"model":"m","max_tokens":9223372036854775807,"messages":[{"role":"user","content":"x"}]}`},
		{"max_tokens as a float", chatEndpoint, `{"model":"m","max_tokens":1e30,"messages":[{"role":"user","content":"x"}]}`},
		{"n_predict -1 (unbounded in llama.cpp)", chatEndpoint, `{"model":"m","n_predict":-1,"messages":[{"role":"user","content":"x"}]}`},
		{"n too large", chatEndpoint, `{"model":"m","n":100000,"messages":[{"role":"user","content":"x"}]}`},
		{"model of the wrong type", chatEndpoint, `{"model":["a"],"messages":[{"role":"user","content":"x"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parseBody([]byte(tt.body), newCall(tt.ep, time.Time{}), defaultMaxJSONDepth)
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 {
				t.Fatalf("got %v, want a 400", err)
			}
		})
	}
}

// What usher reserves is what any engine may generate, whichever of the output limits it reads.
func TestOutputLimitIsTheLargestTheEnginesRead(t *testing.T) {
	tests := []struct {
		body      string
		maxOutput int
		choices   int
	}{
		{`{"model":"m","max_tokens":100000,"max_completion_tokens":1,"messages":[{"role":"user","content":"x"}]}`, 100000, 1},
		{`{"model":"m","max_tokens":1,"n_predict":5000,"messages":[{"role":"user","content":"x"}]}`, 5000, 1},
		{`{"model":"m","max_completion_tokens":7,"n":3,"messages":[{"role":"user","content":"x"}]}`, 7, 3},
		{`{"model":"m","max_tokens":null,"messages":[{"role":"user","content":"x"}]}`, -1, 1},
	}
	for _, tt := range tests {
		cl := newCall(chatEndpoint, time.Time{})
		if err := parseBody([]byte(tt.body), cl, defaultMaxJSONDepth); err != nil {
			t.Fatalf("%s: %v", tt.body, err)
		}
		if cl.maxOutput != tt.maxOutput || cl.choices != tt.choices {
			t.Errorf("%s: max output %d, choices %d; want %d, %d", tt.body, cl.maxOutput, cl.choices, tt.maxOutput, tt.choices)
		}
	}
}

// Every prompt of a /v1/completions batch counts, and a token id is a token.
func TestCompletionPromptsAreAllCounted(t *testing.T) {
	long := strings.Repeat("word ", 4000)
	tests := []struct {
		prompt  string
		atLeast int
	}{
		{`["short", "` + long + `", "` + long + `"]`, 2 * len(long) / 4},
		{`[1,2,3,4,5,6,7,8,9,10]`, 10},
		{`[[1,2,3],[4,5,6,7,8]]`, 8},
	}
	for _, tt := range tests {
		cl := newCall(completionEndpoint, time.Time{})
		if err := parseBody([]byte(`{"model":"m","prompt":`+tt.prompt+`}`), cl, defaultMaxJSONDepth); err != nil {
			t.Fatal(err)
		}
		if cl.promptTokens < tt.atLeast {
			t.Errorf("prompt %.40s...: estimate %d, want at least %d", tt.prompt, cl.promptTokens, tt.atLeast)
		}
	}
}

// The body the worker gets is the client's, member by member, less the client's priority.
func TestUpstreamBodyKeepsTheClientsMembers(t *testing.T) {
	body := `{"model":"m","priority":-100,"temperature":0.5,"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":2}}`
	cl := newCall(chatEndpoint, time.Time{})
	if err := parseBody([]byte(body), cl, defaultMaxJSONDepth); err != nil {
		t.Fatal(err)
	}
	want := `{"model":"m","temperature":0.5,"messages":[{"role":"user","content":"x"}],"logit_bias":{"1":2}}`
	if got := string(cl.upstreamBody(false, "")); got != want {
		t.Errorf("upstream body:\n got %s\nwant %s", got, want)
	}
	cl.class = 2
	if got, want := string(cl.upstreamBody(true, "")), want[:len(want)-1]+`,"priority":2}`; got != want {
		t.Errorf("handed down:\n got %s\nwant %s", got, want)
	}
}

// Input an engine must reject is refused by usher first (issue 26, item 1): bytes that are not
// UTF-8, lone UTF-16 surrogate escapes and JSON nested thousands deep made a Python engine drop
// the connection, which counted against the worker. Each is a 400 at parse; what is close to
// them but valid passes.
func TestInputAnEngineMustRejectIsRefused(t *testing.T) {
	chat := func(content string) string {
		return `{"model":"m","messages":[{"role":"user","content":"` + content + `"}]}`
	}
	deep := func(levels int) string {
		return `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":` +
			strings.Repeat("[", levels) + strings.Repeat("]", levels) + `}`
	}
	tests := []struct {
		name string
		body string
		ok   bool
	}{
		{"invalid UTF-8 in content", chat("caf\xe9"), false},
		{"a UTF-8 surrogate code point", chat("\xed\xa0\x80"), false},
		{"truncated UTF-8 sequence", chat("\xe6\x9d"), false},
		{"invalid UTF-8 in a key", `{"model":"m","messages":[{"role":"user","content":"x"}],"k\xff":1}`, false},
		{"invalid UTF-8 in an unread member", `{"model":"m","messages":[{"role":"user","content":"x"}],"user":"\xc3"}`, false},
		{"lone high surrogate", chat(`\ud800`), false},
		{"lone low surrogate", chat(`\udc00`), false},
		{"high surrogate then a non-surrogate", chat(`\ud800\u0041`), false},
		{"reversed pair", chat(`\udc00\ud800`), false},
		{"5,000 levels deep", deep(5000), false},
		{"one level over the bound", deep(defaultMaxJSONDepth), false},
		{"at the bound", deep(defaultMaxJSONDepth - 1), true},
		{"UTF-8 text", chat("Grüße 東京 🎉"), true},
		{"a surrogate pair escape", chat(`\ud83c\udf89 \u00e9`), true},
		{"an escaped backslash before u", chat(`\\ud800`), true},
		// SGLang raises a TypeError (a 500) on a cache_salt or extra_key that is a list.
		{"extra_key as a list", `{"model":"m","messages":[{"role":"user","content":"x"}],"extra_key":["a"]}`, false},
		{"cache_salt as a list", `{"model":"m","messages":[{"role":"user","content":"x"}],"cache_salt":["a"]}`, false},
		{"extra_key as a number", `{"model":"m","messages":[{"role":"user","content":"x"}],"extra_key":5}`, false},
		{"re-cased extra_key", `{"model":"m","messages":[{"role":"user","content":"x"}],"extra_key":"a","Extra_Key":["a"]}`, false},
		{"extra_key and cache_salt as strings", `{"model":"m","messages":[{"role":"user","content":"x"}],"extra_key":"a","cache_salt":"b"}`, true},
		{"a null extra_key", `{"model":"m","messages":[{"role":"user","content":"x"}],"extra_key":null}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := parseBody([]byte(tt.body), newCall(chatEndpoint, time.Time{}), defaultMaxJSONDepth)
			if tt.ok {
				if err != nil {
					t.Fatalf("got %v, want it accepted", err)
				}
				return
			}
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 || ae.Type != "invalid_request_error" {
				t.Fatalf("got %v, want a 400 invalid_request_error", err)
			}
		})
	}
}

// boundOutput reserves prompts x choices x the output bound, and a call without a bound tells the
// worker the one it reserved, once, whatever null limits the client sent.
func TestBoundOutputIsWhatTheWorkerReads(t *testing.T) {
	tests := []struct {
		name     string
		ep       endpoint
		body     string
		expected int
		engine   map[string]any // output limits the worker reads
	}{
		{"none", chatEndpoint, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, 300, map[string]any{"max_tokens": 300.0}},
		{"nulls", chatEndpoint, `{"model":"m","max_tokens":null,"n_predict":null,"max_completion_tokens":null,"messages":[{"role":"user","content":"x"}]}`, 300, map[string]any{"max_tokens": 300.0}},
		{"client's own", chatEndpoint, `{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"x"}]}`, 50, map[string]any{"max_tokens": 50.0}},
		{"n choices", chatEndpoint, `{"model":"m","n":4,"messages":[{"role":"user","content":"x"}]}`, 1200, map[string]any{"max_tokens": 300.0}},
		{"a batch of prompts", completionEndpoint, `{"model":"m","max_tokens":10,"n":2,"prompt":["a","b","c"]}`, 60, map[string]any{"max_tokens": 10.0}},
		{"token-id batch", completionEndpoint, `{"model":"m","prompt":[[1],[2]]}`, 600, map[string]any{"max_tokens": 300.0}},
		{"best_of", completionEndpoint, `{"model":"m","max_tokens":10,"n":2,"best_of":5,"prompt":"a"}`, 50, map[string]any{"max_tokens": 10.0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := newCall(tt.ep, time.Time{})
			if err := parseBody([]byte(tt.body), cl, defaultMaxJSONDepth); err != nil {
				t.Fatal(err)
			}
			cl.boundOutput(300)
			if cl.expected != tt.expected {
				t.Errorf("reserved %d output tokens, want %d", cl.expected, tt.expected)
			}
			var engine map[string]any
			if err := json.Unmarshal(cl.upstreamBody(false, "engine"), &engine); err != nil {
				t.Fatal(err)
			}
			for _, k := range outputLimitKeys {
				if engine[k] != tt.engine[k] {
					t.Errorf("the worker reads %s = %v, want %v", k, engine[k], tt.engine[k])
				}
			}
		})
	}
}

// jsonString writes what encoding/json's encoder (HTML escaping off) writes, plain ASCII or not.
func FuzzJSONStringIsTheEncoders(f *testing.F) {
	for _, seed := range []string{"demo-7b", `a"b\c`, "tab\there", "<&>", "é\u2028\x7f\x00", "\xff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		if got, want := string(jsonString(s)), strings.TrimSuffix(b.String(), "\n"); got != want {
			t.Fatalf("jsonString(%q) = %s, want %s", s, got, want)
		}
	})
}

// The keys usher reads are lowercase ASCII: splitObject looks for case variants of them only among
// the keys that are not.
func TestKnownKeysAreLowercase(t *testing.T) {
	for _, list := range [][]string{readKeys, messageKeys, partKeys, optionKeys} {
		for _, k := range list {
			if ascii, upper := caseOf(k); !ascii || upper {
				t.Errorf("known key %q is not lowercase ASCII", k)
			}
		}
	}
}
