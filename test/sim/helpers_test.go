package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// fastConfig is a small, fast engine for tests: steps of about 1 ms.
func fastConfig() Config {
	return Config{
		DecodeBase:       time.Millisecond,
		DecodePerSeq:     time.Microsecond,
		DecodePerKVToken: time.Nanosecond,
		PrefillPerToken:  time.Microsecond,
		DefaultMaxTokens: 8,
	}
}

// startEngine serves a new Engine on a loopback httptest server, both stopped when t ends
// (the engine first, so hanging requests end and the server can close).
func startEngine(t testing.TB, cfg Config) (*Engine, *httptest.Server) {
	t.Helper()
	e, err := New(cfg, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	t.Cleanup(e.Close)
	return e, srv
}

func post(t testing.TB, ctx context.Context, srv *httptest.Server, path string, body any) *http.Response {
	t.Helper()
	resp, err := send(ctx, srv, path, body)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	return resp
}

// send posts body as JSON; unlike post it may run on any goroutine.
func send(ctx context.Context, srv *httptest.Server, path string, body any) (*http.Response, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+path, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	return srv.Client().Do(req)
}

// chat is a chat request body with one user message.
func chat(content string, maxTokens int, extra map[string]any) map[string]any {
	body := map[string]any{
		"model":      "demo-7b",
		"messages":   []map[string]string{{"role": "user", "content": content}},
		"max_tokens": maxTokens,
	}
	for k, v := range extra {
		body[k] = v
	}
	return body
}

// words returns a prompt of n distinct words starting with tag.
func words(tag string, n int) string {
	w := make([]string, n)
	for i := range w {
		w[i] = fmt.Sprintf("%s%d", tag, i)
	}
	return strings.Join(w, " ")
}

func decodeJSON[T any](t testing.TB, resp *http.Response) T {
	t.Helper()
	defer resp.Body.Close()
	var v T
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("decode %q: %v", data, err)
	}
	return v
}

type testUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type testResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *testUsage `json:"usage"`
}

type testError struct {
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

// sseReader reads the data lines of a server-sent event stream.
type sseReader struct{ r *bufio.Reader }

// next returns the next event's data, or io.EOF.
func (s sseReader) next() (string, error) {
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			return "", err
		}
		line = strings.TrimRight(line, "\n")
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data, nil
		}
	}
}

// waitFor polls cond until it holds or a few seconds pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// scrape returns the value of one sample of /metrics, by its full name with labels.
func scrape(t testing.TB, srv *httptest.Server, sample string) string {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v
		}
	}
	t.Fatalf("sample %s not in /metrics:\n%s", sample, data)
	return ""
}
