package bench_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine is a small OpenAI-compatible streaming server: it waits ttft, then streams one
// word per chunk every itl, then a usage chunk and [DONE]. Its behaviour is set before the
// first request and never changed.
type fakeEngine struct {
	ttft, itl time.Duration
	// tokens is the number of content chunks (0: the request's max_tokens).
	tokens int
	// status and code, when status is set, make every request fail with an OpenAI error.
	status int
	code   string
	// fail, when set, decides per request whether to fail it with status and code.
	fail func(seen) bool
	// cachedFraction of the prompt's words are reported as cached tokens.
	cachedFraction float64
	// noUsage leaves the usage chunk out.
	noUsage bool
	// headers are set on every OK response.
	headers map[string]string
	// workers, when set, names the worker of the n-th request round robin.
	workers []string
	// hold, when set, holds every request until it is closed.
	hold chan struct{}

	mu   sync.Mutex // guards seen
	seen []seen

	inflight, peak atomic.Int64
	count          atomic.Int64
}

// seen is one request as the engine received it.
type seen struct {
	at     time.Time
	header http.Header
	path   string
	body   struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Prompt        string `json:"prompt"`
		MaxTokens     int    `json:"max_tokens"`
		Stream        bool   `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
}

func (s seen) promptText() string {
	if s.body.Prompt != "" {
		return s.body.Prompt
	}
	var parts []string
	for _, m := range s.body.Messages {
		parts = append(parts, m.Content)
	}
	return strings.Join(parts, " ")
}

func (e *fakeEngine) start(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv
}

func (e *fakeEngine) requests() []seen {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]seen(nil), e.seen...)
}

func (e *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := e.count.Add(1) - 1
	cur := e.inflight.Add(1)
	defer e.inflight.Add(-1)
	for {
		p := e.peak.Load()
		if cur <= p || e.peak.CompareAndSwap(p, cur) {
			break
		}
	}
	s := seen{at: time.Now(), header: r.Header.Clone(), path: r.URL.Path}
	if err := json.NewDecoder(r.Body).Decode(&s.body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	e.mu.Lock()
	e.seen = append(e.seen, s)
	e.mu.Unlock()
	if e.hold != nil {
		select {
		case <-e.hold:
		case <-r.Context().Done():
			return
		}
	}

	if e.status != 0 && (e.fail == nil || e.fail(s)) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(e.status)
		fmt.Fprintf(w, `{"error":{"message":"no","type":"test_error","code":%q}}`, e.code)
		return
	}
	for k, v := range e.headers {
		w.Header().Set(k, v)
	}
	if len(e.workers) > 0 {
		w.Header().Set("X-Usher-Worker", e.workers[int(n)%len(e.workers)])
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	flusher := w.(http.Flusher)
	flusher.Flush()

	if !sleep(r, e.ttft) {
		return
	}
	tokens := e.tokens
	if tokens == 0 {
		tokens = s.body.MaxTokens
	}
	chat := strings.HasSuffix(r.URL.Path, "/chat/completions")
	for i := 0; i < tokens; i++ {
		if i > 0 && !sleep(r, e.itl) {
			return
		}
		if chat {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"},\"finish_reason\":null}]}\n\n", i)
		} else {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"w%d \",\"finish_reason\":null}]}\n\n", i)
		}
		flusher.Flush()
	}
	fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n")
	if !e.noUsage {
		prompt := len(strings.Fields(s.promptText()))
		cached := int(e.cachedFraction * float64(prompt))
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			prompt, tokens, cached)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	flusher.Flush()
}

// sleep waits d or until the client goes away; false when it went away.
func sleep(r *http.Request, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.Context().Done():
		return false
	}
}
