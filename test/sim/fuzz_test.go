package sim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func FuzzCompletionBody(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a b"}]}],"stream":true}`,
		`{"prompt":["x y","z"],"max_tokens":1,"priority":-3}`,
		`{"prompt":"a","max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"other","prompt":"a"}`,
		`{"messages":`,
		`[]`,
		`{"prompt":null}`,
		`{"prompt":"a b","max_tokens":9223372036854775807}`,
		`{"prompt":"a b","max_completion_tokens":-9223372036854775808}`,
	} {
		for _, slots := range []bool{false, true} {
			f.Add("/v1/chat/completions", seed, slots)
			f.Add("/v1/completions", seed, slots)
		}
	}
	engines := make(map[bool]*Engine)
	for _, slots := range []bool{false, true} {
		cfg := Config{MaxModelLen: 512, DefaultMaxTokens: 4, TimeScale: 1e-6, MaxBodyBytes: 4096}
		if slots {
			cfg.Mode, cfg.Slots, cfg.KVCacheTokens = ModeSlots, 2, 2*256
		}
		e, err := New(cfg, Options{})
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(e.Close)
		engines[slots] = e
	}
	f.Fuzz(func(t *testing.T, path, body string, slots bool) {
		e := engines[slots]
		if path != "/v1/chat/completions" {
			path = "/v1/completions"
		}
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
		switch w.Code {
		case http.StatusOK:
			if strings.HasPrefix(w.Body.String(), "data: ") {
				if !strings.HasSuffix(w.Body.String(), "data: [DONE]\n\n") {
					t.Fatalf("stream without [DONE]: %q", w.Body.String())
				}
				return
			}
			var r testResponse
			if err := json.Unmarshal(w.Body.Bytes(), &r); err != nil || r.Usage == nil || len(r.Choices) != 1 {
				t.Fatalf("200 body %q: not a completion with usage (%v)", w.Body.String(), err)
			}
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
			var b testError
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || b.Error == nil || b.Error.Message == "" {
				t.Fatalf("%d body %q: not an OpenAI error (%v)", w.Code, w.Body.String(), err)
			}
		default:
			t.Fatalf("status %d for %q", w.Code, body)
		}
	})
}
