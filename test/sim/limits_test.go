package sim

import (
	"net/http"
	"strings"
	"testing"
)

// TestClientNumbersNeverOverflow keeps issue 10's attack on the sim: max_tokens of 2^63-1 made
// prompt + max_tokens wrap negative and pass the context check. Every hostile number gets a 400
// in OpenAI's shape, in both modes, and nothing reaches the scheduler.
func TestClientNumbersNeverOverflow(t *testing.T) {
	bodies := []struct {
		name, path, body string
	}{
		{"max_tokens 2^63-1", "/v1/completions", `{"prompt":"a b c","max_tokens":9223372036854775807}`},
		{"max_tokens 2^63-2", "/v1/completions", `{"prompt":"a b c","max_tokens":9223372036854775806}`},
		{"max_completion_tokens 2^63-1", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":9223372036854775807}`},
		{"max_tokens 2^63", "/v1/completions", `{"prompt":"a","max_tokens":9223372036854775808}`},
		{"max_tokens 1e30", "/v1/completions", `{"prompt":"a","max_tokens":1e30}`},
		{"max_tokens -1", "/v1/completions", `{"prompt":"a","max_tokens":-1}`},
		{"max_tokens -2^63", "/v1/completions", `{"prompt":"a","max_tokens":-9223372036854775808}`},
		{"max_tokens 0.5", "/v1/completions", `{"prompt":"a","max_tokens":0.5}`},
		{"max_tokens a string", "/v1/completions", `{"prompt":"a","max_tokens":"10"}`},
		{"huge prompt, small max_tokens", "/v1/completions", `{"prompt":"` + strings.Repeat("w ", 3000) + `","max_tokens":1}`},
		{"huge prompt and huge max_tokens", "/v1/completions", `{"prompt":"` + strings.Repeat("w ", 3000) + `","max_tokens":9223372036854775807}`},
		{"max_tokens just over the context", "/v1/completions", `{"prompt":"a","max_tokens":2048}`},
	}
	for _, mode := range []string{ModeKV, ModeSlots} {
		t.Run(mode, func(t *testing.T) {
			cfg := fastConfig()
			cfg.Mode, cfg.Slots, cfg.MaxModelLen, cfg.KVCacheTokens = mode, 2, 2048, 2*2048
			cfg.TimeScale = 0.01
			e, srv := startEngine(t, cfg)
			for _, b := range bodies {
				t.Run(b.name, func(t *testing.T) {
					req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+b.path, strings.NewReader(b.body))
					resp, err := srv.Client().Do(req)
					if err != nil {
						t.Fatal(err)
					}
					if resp.StatusCode != http.StatusBadRequest {
						t.Errorf("status: got %d, want 400", resp.StatusCode)
					}
					if body := decodeJSON[testError](t, resp); body.Error == nil || body.Error.Message == "" || body.Error.Type != "invalid_request_error" {
						t.Errorf("error body: got %+v, want an OpenAI invalid_request_error with a message", body.Error)
					}
				})
			}
			if s := e.Stats(); s.PromptTokens != 0 || s.Running+s.Waiting != 0 || s.BadRequests != int64(len(bodies)) {
				t.Errorf("stats: got %d prompt tokens admitted, %d in the engine, %d bad requests; want 0, 0, %d",
					s.PromptTokens, s.Running+s.Waiting, s.BadRequests, len(bodies))
			}
			// The largest request that fits is served.
			resp := post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 2047})
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("prompt 1 + max_tokens 2047 in a 2048 context: got %d, want 200", resp.StatusCode)
			}
		})
	}
}

func TestLengthMessageStatesTheExactRequest(t *testing.T) {
	e, err := New(Config{MaxModelLen: 100, DefaultMaxTokens: 8}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	msg := e.checkLength(3, 1<<63-1)
	if !strings.Contains(msg, "you requested 9223372036854775810 tokens (3 in the messages, 9223372036854775807 in the completion)") {
		t.Errorf("got %q, want the exact sum, not a wrapped one", msg)
	}
}
