package sim

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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

// FuzzKVPullBody posts arbitrary bodies to a prefill worker's /kv/pull: every answer is a
// taken hold (200) or a refusal (4xx, 503), never a panic or a wait past KVWaitTimeout.
func FuzzKVPullBody(f *testing.F) {
	for _, seed := range []string{
		`{"request_id":"x","engine_id":"e","block_ids":[1,2],"prompt_tokens":3,"digest":"ab"}`,
		`{"room":7,"wait_ms":5}`,
		`{"room":-1}`,
		`{"room":18446744073709551616}`,
		`{"block_ids":[-1],"request_id":""}`,
		`{"wait_ms":-9223372036854775808,"room":0}`,
		`{`,
		`[]`,
	} {
		f.Add(seed)
	}
	e, err := New(Config{Role: RolePrefill, TimeScale: 1e-6, KVWaitTimeout: 5 * time.Millisecond}, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(e.Close)
	f.Fuzz(func(t *testing.T, body string) {
		w := httptest.NewRecorder()
		e.ServeHTTP(w, httptest.NewRequest(http.MethodPost, "/kv/pull", strings.NewReader(body)))
		switch w.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusServiceUnavailable:
		default:
			t.Fatalf("status %d for %q", w.Code, body)
		}
	})
}
