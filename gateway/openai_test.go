package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
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
			r, err := parseInferenceRequest([]byte(tt.body), tt.ep)
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
			r := mustParseAsCompletion(t, tt.body)
			out, err := r.forUpstream([]byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if got := bytes.Equal(out, []byte(tt.body)); got != tt.same {
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

// mustParseAsCompletion parses body, which has no prompt, as a completion request with one.
func mustParseAsCompletion(t *testing.T, body string) *inferenceRequest {
	t.Helper()
	r, err := parseInferenceRequest([]byte(strings.Replace(body, `"model":"m"`, `"model":"m","prompt":"p"`, 1)), completionEndpoint)
	if err != nil {
		t.Fatal(err)
	}
	return r
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
		r, err := parseInferenceRequest(body, ep)
		if err != nil {
			var ae *APIError
			if !errors.As(err, &ae) || ae.Status != 400 {
				t.Fatalf("got %v, want a 400", err)
			}
			return
		}
		out, err := r.forUpstream(body)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("upstream body is not JSON: %s", out)
		}
	})
}
