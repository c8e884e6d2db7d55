package sim

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

// With --api-key, every /v1 request needs the key (401 without it or with another), as vLLM's
// and llama-server's do; /health and /metrics stay open.
func TestAPIKeyIsRequired(t *testing.T) {
	cfg := fastConfig()
	cfg.APIKey = "engine-secret"
	_, srv := startEngine(t, cfg)
	for _, tc := range []struct {
		method, path, auth string
		want               int
	}{
		{http.MethodPost, "/v1/chat/completions", "", http.StatusUnauthorized},
		{http.MethodPost, "/v1/chat/completions", "Bearer other", http.StatusUnauthorized},
		{http.MethodPost, "/v1/chat/completions", "Bearer engine-secret", http.StatusOK},
		{http.MethodGet, "/v1/models", "", http.StatusUnauthorized},
		{http.MethodGet, "/health", "", http.StatusOK},
		{http.MethodGet, "/metrics", "", http.StatusOK},
	} {
		var body *strings.Reader
		if tc.method == http.MethodPost {
			body = strings.NewReader(`{"model":"demo-7b","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
		} else {
			body = strings.NewReader("")
		}
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, body)
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s with %q: got %d, want %d", tc.method, tc.path, tc.auth, resp.StatusCode, tc.want)
		}
	}
}

func TestEmbeddings(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	type answer struct {
		Model string `json:"model"`
		Data  []struct {
			Index     int       `json:"index"`
			Embedding []float64 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	for _, tc := range []struct {
		input  any
		inputs int
	}{
		{"one two three", 1},
		{[]string{"one two", "three"}, 2},
		{[]int{1, 2, 3}, 1},
		{[][]int{{1, 2}, {3}}, 2},
	} {
		resp := post(t, context.Background(), srv, "/v1/embeddings", map[string]any{"model": e.Config().Model, "input": tc.input})
		got := decodeJSON[answer](t, resp)
		if resp.StatusCode != http.StatusOK || len(got.Data) != tc.inputs || got.Usage.PromptTokens == 0 ||
			len(got.Data[0].Embedding) != embeddingDims || got.Model != e.Config().Model {
			t.Errorf("input %v: %d %+v", tc.input, resp.StatusCode, got)
		}
	}
	resp := post(t, context.Background(), srv, "/v1/embeddings", map[string]any{"model": "other", "input": "x"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("another model: got %d, want 404", resp.StatusCode)
	}
}
