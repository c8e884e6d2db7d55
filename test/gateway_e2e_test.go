package test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/test/sim"
)

type chatResponse struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func TestStreamArrivesChunkByChunk(t *testing.T) {
	// 40 tokens at about 12 ms each (time scale 0.5): the whole answer takes about half a second.
	s := startStack(t, stackOptions{sim: func(_ int, c *sim.Config) { c.TimeScale = 0.5 }})
	resp := s.do(context.Background(), t, "/v1/chat/completions", chat("tell me a story", 40, true))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d", resp.StatusCode)
	}
	events := newSSEReader(resp.Body)
	first, ok := events.next()
	if !ok {
		t.Fatal("no first event")
	}
	// The first chunk is here while the worker is still generating the rest.
	if st := s.engines[0].Stats(); st.Completed != 0 || st.Running != 1 {
		t.Fatalf("at the first chunk the worker has completed %d and runs %d, want 0 and 1: the stream was buffered",
			st.Completed, st.Running)
	}
	var c chatResponse
	if err := json.Unmarshal([]byte(first), &c); err != nil {
		t.Fatalf("first event %q: %v", first, err)
	}
	var content, usageChunks int
	last := first
	for {
		e, ok := events.next()
		if !ok {
			break
		}
		last = e
		if strings.Contains(e, `"usage":{`) {
			usageChunks++
		}
		if e != "[DONE]" && strings.Contains(e, `"content"`) {
			content++
		}
	}
	if last != "[DONE]" {
		t.Fatalf("last event: got %q, want [DONE]", last)
	}
	if usageChunks != 0 {
		t.Fatalf("got %d usage chunks the client did not ask for", usageChunks)
	}
	if content < 39 {
		t.Fatalf("got %d content chunks, want one per token (40)", content)
	}
}

func TestNonStreamingUsageAndPrefixCache(t *testing.T) {
	s := startStack(t, stackOptions{})
	prompt := strings.Repeat("the same long system prompt shared by both requests ", 20)
	var cached []int
	for i := 0; i < 2; i++ {
		resp := s.do(context.Background(), t, "/v1/chat/completions", chat(prompt, 8, false))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status: got %d", resp.StatusCode)
		}
		var c chatResponse
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
			t.Fatal(err)
		}
		if c.Usage == nil || c.Usage.CompletionTokens != 8 || c.Usage.PromptTokens == 0 ||
			c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens {
			t.Fatalf("usage: got %+v, want 8 completion tokens and a consistent total", c.Usage)
		}
		if got := strings.Fields(c.Choices[0].Message.Content); len(got) != 8 {
			t.Fatalf("content: got %d words, want 8", len(got))
		}
		cached = append(cached, c.Usage.PromptTokensDetails.CachedTokens)
	}
	if cached[0] != 0 || cached[1] == 0 {
		t.Fatalf("cached tokens: got %v, want none the first time and some the second", cached)
	}
}

func TestClientDisconnectCancelsTheWorkersRequest(t *testing.T) {
	s := startStack(t, stackOptions{sim: func(_ int, c *sim.Config) { c.TimeScale = 1 }})
	ctx, cancel := context.WithCancel(context.Background())
	resp := s.do(ctx, t, "/v1/chat/completions", chat("a very long answer please", 2000, true))
	if _, ok := newSSEReader(resp.Body).next(); !ok {
		t.Fatal("no first event")
	}
	engine := s.engine(t, resp.Header.Get("X-Usher-Worker"))
	cancel()
	eventually(t, 2*time.Second, "the worker sees the cancel", func() bool {
		st := engine.Stats()
		return st.Cancelled == 1 && st.Running == 0
	})
}

func TestRetryOnAnotherWorkerWhenOneFails(t *testing.T) {
	s := startStack(t, stackOptions{workers: 2, sim: func(i int, c *sim.Config) {
		if i == 0 {
			c.Faults.ErrorRate = 1
		}
	}})
	for i := 0; i < 4; i++ {
		resp := s.do(context.Background(), t, "/v1/chat/completions", chat("hello", 4, true))
		if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Usher-Worker") != "sim-1" {
			t.Fatalf("request %d: status %d from %q, want 200 from sim-1", i, resp.StatusCode, resp.Header.Get("X-Usher-Worker"))
		}
		r := newSSEReader(resp.Body)
		last := ""
		for e, ok := r.next(); ok; e, ok = r.next() {
			last = e
		}
		if last != "[DONE]" {
			t.Fatalf("request %d: last event %q, want [DONE]", i, last)
		}
	}
	if got := s.engines[1].Stats().Completed; got != 4 {
		t.Fatalf("healthy worker completed %d, want 4: each request exactly once", got)
	}
}

func TestNoRetryOnceTheStreamHasBegun(t *testing.T) {
	s := startStack(t, stackOptions{workers: 2, sim: func(_ int, c *sim.Config) { c.TimeScale = 1 }})
	resp := s.do(context.Background(), t, "/v1/chat/completions", chat("hello", 500, true))
	events := newSSEReader(resp.Body)
	if _, ok := events.next(); !ok {
		t.Fatal("no first event")
	}
	served := resp.Header.Get("X-Usher-Worker")
	s.engine(t, served).Close()
	sawError := false
	for e, ok := events.next(); ok; e, ok = events.next() {
		sawError = sawError || strings.Contains(e, `"error"`)
	}
	if !sawError {
		t.Fatal("the stream ended without an error event the client can see")
	}
	for i, id := range s.ids {
		if id != served && s.engines[i].Stats().Requests != 0 {
			t.Fatalf("worker %s got %d requests: the request was sent twice", id, s.engines[i].Stats().Requests)
		}
	}
}

func TestErrorsReachTheClientInOpenAIShape(t *testing.T) {
	s := startStack(t, stackOptions{server: func(c *gateway.Config) { c.MaxBodyBytes = 4096 }})
	tests := []struct {
		name, key, body string
		status          int
	}{
		{"bad key", "sk-nope", chat("x", 1, false), 401},
		{"malformed", apiKey, `{"model":`, 400},
		{"missing messages", apiKey, `{"model":"demo-7b"}`, 400},
		{"unknown model", apiKey, `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404},
		{"too large", apiKey, chat(strings.Repeat("word ", 2000), 1, false), 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(tt.body))
			req.Header.Set("Authorization", "Bearer "+tt.key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != tt.status || e.Error.Message == "" {
				t.Fatalf("got %d %+v (%v), want %d with an OpenAI error", resp.StatusCode, e, err, tt.status)
			}
		})
	}
}
