package test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/realengine"
)

// These tests run `usher serve` in front of real llama.cpp llama-server workers (see
// test/realengine): a random-weight model with the real Qwen2 tokenizer, so the text is
// gibberish but the engine's slots, prompt cache, SSE server, connection handling and queue are
// the real ones. Requests use temperature 0: the same prompt gives the same tokens on every run.

const (
	engineModel  = realengine.Micro
	chatKey      = "sk-engine-chat"
	bulkKey      = "sk-engine-bulk"
	longAnswer   = 3000 // max_tokens of a stream that outlives the test's actions on it
	engineSystem = "You are a terse assistant. "
)

// engineStack is `usher serve` in front of real engines.
type engineStack struct {
	gw      *serveProcess
	engines []*realengine.Engine
	ids     []string
}

type engineStackOptions struct {
	workers        int
	slots          int
	maxConcurrency int      // per worker; 0 leaves usher's default
	fifo           bool     // queue.fifo
	policy         string   // routing.policy; "" leaves usher's default
	engineArgs     []string // more llama-server flags
}

func startEngineStack(t *testing.T, o engineStackOptions) *engineStack {
	t.Helper()
	s := &engineStack{engines: realengine.Start(t, o.workers, realengine.Options{Model: engineModel, Slots: o.slots, Args: o.engineArgs})}
	policy := ""
	if o.policy != "" {
		policy = "  policy: " + o.policy + "\n"
	}
	var workers strings.Builder
	for i, e := range s.engines {
		id := fmt.Sprintf("llama-%d", i)
		s.ids = append(s.ids, id)
		fmt.Fprintf(&workers, "    - {id: %s, url: %q, models: [%s]", id, e.URL, engineModel)
		if o.maxConcurrency > 0 {
			fmt.Fprintf(&workers, ", max_concurrency: %d", o.maxConcurrency)
		}
		workers.WriteString("}\n")
	}
	s.gw = startServe(t, "usher serve", func(listen string) string {
		return fmt.Sprintf(`server: {listen: %q}
routing:
%s  workers:
%squeue: {fifo: %v}
tenants:
  - id: chat
    keys: [{name: k, sha256: %s}]
  - id: bulk
    keys: [{name: k, sha256: %s}]
log: {level: warn}
`, listen, policy, workers.String(), o.fifo, tenants.HashKey(chatKey), tenants.HashKey(bulkKey))
	})
	return s
}

// engine returns the engine behind worker id.
func (s *engineStack) engine(t *testing.T, id string) *realengine.Engine {
	t.Helper()
	i := slices.Index(s.ids, id)
	if i < 0 {
		t.Fatalf("no worker %q", id)
	}
	return s.engines[i]
}

// post sends a chat completion as the tenant of key in class (none when ""). A transport error
// comes back as err; the caller closes the body.
func (s *engineStack) post(ctx context.Context, client *http.Client, key, class, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.gw.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	if class != "" {
		req.Header.Set("X-Usher-Priority", class)
	}
	return client.Do(req)
}

func (s *engineStack) mustPost(ctx context.Context, t *testing.T, body string) *http.Response {
	t.Helper()
	resp, err := s.post(ctx, http.DefaultClient, chatKey, "", body)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return resp
}

// engineChat is a greedy chat request; streams ask for usage.
func engineChat(content string, maxTokens int, stream bool) string {
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"temperature":0%s,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		engineModel, stream, maxTokens, opts, engineSystem, content)
}

func metrics(t *testing.T, e *realengine.Engine) realengine.Metrics {
	t.Helper()
	m, err := e.Metrics(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestEngineStreamsChunkByChunkWithUsage(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 1, slots: 2})
	const maxTokens = 200
	resp := s.mustPost(context.Background(), t, engineChat("tell me a story", maxTokens, true))
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("Content-Type: got %q, want text/event-stream", ct)
	}
	events := newSSEReader(resp.Body)
	first, ok := events.next()
	if !ok {
		t.Fatal("no first event")
	}
	// The first event is here while the engine still generates the rest: nothing buffered it.
	if m := metrics(t, s.engines[0]); m.RequestsProcessing != 1 {
		t.Fatalf("at the first event the engine processes %v requests, want 1: the stream was buffered", m.RequestsProcessing)
	}
	var content, usageChunks int
	var usage chatResponse
	var finish string
	last := ""
	for e := first; ok; e, ok = events.next() {
		last = e
		if e == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		for _, ch := range c.Choices {
			if ch.Delta.Content != "" {
				content++
			}
			if ch.FinishReason != nil {
				finish = *ch.FinishReason
			}
		}
		if len(c.Usage) > 0 && string(c.Usage) != "null" {
			usageChunks++
			if err := json.Unmarshal([]byte(e), &usage); err != nil {
				t.Fatalf("usage event %q: %v", e, err)
			}
		}
	}
	if last != "[DONE]" {
		t.Fatalf("last event: got %q, want [DONE]", last)
	}
	if usageChunks != 1 {
		t.Fatalf("got %d usage chunks, want 1", usageChunks)
	}
	u := usage.Usage
	if u.PromptTokens == 0 || u.CompletionTokens == 0 || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Fatalf("usage %+v: want prompt and completion tokens and their sum", *u)
	}
	if finish != "stop" && (finish != "length" || u.CompletionTokens != maxTokens) {
		t.Fatalf("finish_reason %q with %d completion tokens, want stop, or length with %d", finish, u.CompletionTokens, maxTokens)
	}
	// A chunk per token; a token that ends inside a UTF-8 sequence waits for the next one.
	if content < u.CompletionTokens/2 || content > u.CompletionTokens {
		t.Fatalf("got %d content chunks for %d tokens, want about one per token", content, u.CompletionTokens)
	}
}

func TestEngineReportsCachedPromptTokens(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 1, slots: 2})
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20) // about 200 tokens
	var got []int
	for range 2 {
		resp := s.mustPost(context.Background(), t, engineChat(prompt, 4, false))
		var c chatResponse
		if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
			t.Fatal(err)
		}
		u := c.Usage
		if u == nil || u.PromptTokens < 150 || u.CompletionTokens == 0 || u.CompletionTokens > 4 ||
			u.TotalTokens != u.PromptTokens+u.CompletionTokens {
			t.Fatalf("usage %+v: want about 200 prompt tokens, 1 to 4 completion tokens and their sum", u)
		}
		if len(c.Choices) != 1 || c.Choices[0].Message.Content == "" {
			t.Fatalf("choices %+v: want one with content", c.Choices)
		}
		got = append(got, u.PromptTokensDetails.CachedTokens, u.PromptTokens)
	}
	if got[0] != 0 || got[2] < got[3]*9/10 {
		t.Fatalf("cached/prompt tokens: got %d/%d then %d/%d, want none cached, then nearly all", got[0], got[1], got[2], got[3])
	}
}

func TestEngineClientDisconnectFreesTheSlot(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 1, slots: 2})
	e := s.engines[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := s.mustPost(ctx, t, engineChat("a very long answer please", longAnswer, true))
	if _, ok := newSSEReader(resp.Body).next(); !ok {
		t.Fatal("no first event")
	}
	if m := metrics(t, e); m.RequestsProcessing != 1 {
		t.Fatalf("engine processes %v requests, want 1", m.RequestsProcessing)
	}
	cancel()
	eventually(t, 5*time.Second, "the engine frees the slot", func() bool {
		slots, err := e.Slots(context.Background())
		return err == nil && !slices.ContainsFunc(slots, func(s realengine.Slot) bool { return s.IsProcessing }) &&
			metrics(t, e).RequestsProcessing == 0
	})
	// Freed by a cancel, not by the answer's end.
	if !strings.Contains(e.Log(), "cancel task") {
		t.Fatalf("the engine logged no cancel; log tail:\n%s", e.Log())
	}
}

func TestEngineKilledMidStream(t *testing.T) {
	s := startEngineStack(t, engineStackOptions{workers: 2, slots: 2})
	resp := s.mustPost(context.Background(), t, engineChat("a very long answer please", longAnswer, true))
	events := newSSEReader(resp.Body)
	if _, ok := events.next(); !ok {
		t.Fatal("no first event")
	}
	served := resp.Header.Get("X-Usher-Worker")
	s.engine(t, served).Kill()
	sawError, sawDone := false, false
	for e, ok := events.next(); ok; e, ok = events.next() {
		sawError = sawError || strings.Contains(e, `"error"`)
		sawDone = sawDone || e == "[DONE]"
	}
	if !sawError || sawDone {
		t.Fatalf("after the kill: error event %v, [DONE] %v; want an error event and no [DONE]", sawError, sawDone)
	}
	survivor := s.ids[1-slices.Index(s.ids, served)]
	for i := range 6 {
		resp := s.mustPost(context.Background(), t, engineChat(fmt.Sprintf("question %d", i), 4, false))
		if w := resp.Header.Get("X-Usher-Worker"); w != survivor {
			t.Fatalf("request %d served by %q, want the survivor %q", i, w, survivor)
		}
	}
}

// Issue 14, point 2: llama-server closes the connection after every streamed answer although it
// announces keep-alive. With usher's queue backlogged, a request released the instant a stream
// ends must not go out on that closed connection and come back to its client as a 502.
func TestEngineConnectionClosesGiveNo502(t *testing.T) {
	const slots, streams, clients = 2, 200, 24
	s := startEngineStack(t, engineStackOptions{workers: 2, slots: slots, maxConcurrency: slots})
	type result struct {
		status int
		done   bool
		err    error
	}
	results := make(chan result, streams)
	next := make(chan int, streams)
	for i := range streams {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			client := &http.Client{Timeout: 60 * time.Second}
			for i := range next {
				resp, err := s.post(context.Background(), client, chatKey, "", engineChat(fmt.Sprintf("short question %d", i), 4, true))
				if err != nil {
					results <- result{err: err}
					continue
				}
				r := result{status: resp.StatusCode}
				events := newSSEReader(resp.Body)
				for e, ok := events.next(); ok; e, ok = events.next() {
					r.done = r.done || e == "[DONE]"
				}
				resp.Body.Close()
				results <- r
			}
		})
	}
	wg.Wait()
	close(results)
	statuses := map[int]int{}
	var unfinished, transport int
	for r := range results {
		switch {
		case r.err != nil:
			transport++
		case r.status == http.StatusOK && !r.done:
			unfinished++
		}
		statuses[r.status]++
	}
	if statuses[http.StatusOK] != streams || unfinished != 0 {
		t.Fatalf("of %d streams: statuses %v (0: transport error, %d), %d 200s without [DONE]; want %d 200s, each ending in [DONE]",
			streams, statuses, transport, unfinished, streams)
	}
}

// Issue 14, point 1: under a batch flood, with the default config, the waiting happens in
// usher's queue, where classes apply, not in the engine's own FIFO queue: the engines'
// requests_deferred stays at 0 most of the time, batch requests wait in usher's queue and
// interactive ones pass them.
func TestEngineProtectsInteractiveUnderBatchFloodByDefault(t *testing.T) {
	const (
		slots       = 2
		batchUsers  = 16 // closed loop; 2 engines x 2 slots: 4x what they run at once
		interactive = 6
	)
	// llama-server serves HTTP on n_parallel + 4 threads, and each keep-alive connection holds
	// one while idle, for up to 5 s: the gateway's upstream connections, its health checks and
	// scrapes took them all now and then, and this test's own metrics reader waited seconds for
	// a thread (0 samples). The reader is the test's instrument, so the engines get room for it.
	s := startEngineStack(t, engineStackOptions{workers: 2, slots: slots, engineArgs: []string{"--threads-http", "16"}})
	ctx, stopFlood := context.WithTimeout(context.Background(), 90*time.Second)
	defer stopFlood()
	var (
		mu         sync.Mutex // guards the slices below
		batchQueue []int
		deferred   []float64 // per sample: requests_deferred summed over the engines
		unread     int       // samples lost to a metrics read that failed
		failures   []string
	)
	var wg sync.WaitGroup
	for u := range batchUsers {
		wg.Go(func() {
			client := &http.Client{Timeout: 60 * time.Second}
			for i := 0; ctx.Err() == nil; i++ {
				resp, err := s.post(ctx, client, bulkKey, "batch", engineChat(fmt.Sprintf("batch job %d of user %d", i, u), 48, false))
				if err != nil {
					return // the flood's end cancels the last request
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				if resp.StatusCode != http.StatusOK {
					failures = append(failures, fmt.Sprintf("batch status %d", resp.StatusCode))
				} else {
					q, _ := strconv.Atoi(resp.Header.Get("X-Usher-Queue-Ms"))
					batchQueue = append(batchQueue, q)
				}
				mu.Unlock()
			}
		})
	}
	wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			sum := 0.0
			for _, e := range s.engines {
				m, err := e.Metrics(ctx)
				if err != nil { // a busy engine can be slow to answer: no sample this time
					mu.Lock()
					unread++
					mu.Unlock()
					sum = -1
					break
				}
				sum += m.RequestsDeferred
			}
			if sum >= 0 {
				mu.Lock()
				deferred = append(deferred, sum)
				mu.Unlock()
			}
		}
	})
	var interactiveQueue []int
	time.Sleep(2 * time.Second) // let the flood fill every slot and the queue
	for i := range interactive {
		ictx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		resp, err := s.post(ictx, http.DefaultClient, chatKey, "interactive", engineChat(fmt.Sprintf("hello %d", i), 8, true))
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		cancel()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("interactive request %d: status %d", i, resp.StatusCode)
		}
		q, _ := strconv.Atoi(resp.Header.Get("X-Usher-Queue-Ms"))
		interactiveQueue = append(interactiveQueue, q)
		time.Sleep(500 * time.Millisecond)
	}
	stopFlood()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d batch requests failed: %v", len(failures), failures[:min(len(failures), 5)])
	}
	zero := 0
	for _, d := range deferred {
		if d == 0 {
			zero++
		}
	}
	slices.Sort(batchQueue)
	batchMedian := -1
	if len(batchQueue) > 0 {
		batchMedian = batchQueue[len(batchQueue)/2]
	}
	t.Logf("engines' requests_deferred 0 in %d of %d samples (max %v; %d reads failed); batch: %d done, queue ms median %d; interactive queue ms %v",
		zero, len(deferred), slices.Max(append(deferred, 0)), unread, len(batchQueue), batchMedian, interactiveQueue)
	if len(deferred) < 40 || zero*4 < len(deferred)*3 {
		t.Errorf("the engines deferred requests in %d of %d samples, want under a quarter: the waiting happens in the engines' FIFO queues, out of usher's reach",
			len(deferred)-zero, len(deferred))
	}
	if maxI := slices.Max(interactiveQueue); batchMedian <= 0 || maxI >= batchMedian {
		t.Errorf("queue ms: interactive max %d, batch median %d; want batch waiting in usher's queue and interactive passing it", maxI, batchMedian)
	}
}

// A real llama-server started with --api-key serves through usher with the key in usher's config
// only (api_key_env), under a public model name (model_aliases): the engine refuses a request
// without its key, and through usher the answer names the public model, streamed or not.
func TestEngineWithAPIKeyAndAlias(t *testing.T) {
	const engineKey = "sk-llama-server-key-0123456789"
	t.Setenv("USHER_TEST_LLAMA_KEY", engineKey)
	e := realengine.Start(t, 1, realengine.Options{Model: engineModel, ID: "org/" + engineModel, APIKey: engineKey})[0]
	resp, err := http.Post(e.URL+"/v1/chat/completions", "application/json", strings.NewReader(engineChat("hi", 2, false)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("llama-server without its key: %d, want 401", resp.StatusCode)
	}
	gw := startServe(t, "usher serve", func(listen string) string {
		return fmt.Sprintf(`server: {listen: %q}
routing:
  workers:
    - id: llama
      url: %q
      models: [%s]
      api_key_env: USHER_TEST_LLAMA_KEY
      model_aliases: {%s: "org/%s"}
tenants:
  - id: chat
    keys: [{name: k, sha256: %s}]
log: {level: warn}
`, listen, e.URL, engineModel, engineModel, engineModel, tenants.HashKey(chatKey))
	})
	s := &engineStack{gw: gw, engines: []*realengine.Engine{e}, ids: []string{"llama"}}
	var answer struct {
		Model string `json:"model"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(s.mustPost(context.Background(), t, engineChat("hello", 4, false)).Body).Decode(&answer); err != nil {
		t.Fatal(err)
	}
	if answer.Model != engineModel || answer.Usage.CompletionTokens != 4 {
		t.Fatalf("through usher: model %q and %d tokens, want %s and 4", answer.Model, answer.Usage.CompletionTokens, engineModel)
	}
	body, _ := io.ReadAll(s.mustPost(context.Background(), t, engineChat("hello", 4, true)).Body)
	chunks := 0
	for _, line := range strings.Split(string(body), "\n") {
		payload, ok := strings.CutPrefix(line, "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var chunk struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal([]byte(payload), &chunk); err != nil || chunk.Model != engineModel {
			t.Fatalf("chunk %s: want model %s", payload, engineModel)
		}
		chunks++
	}
	if chunks < 4 {
		t.Fatalf("got %d chunks, want at least 4:\n%s", chunks, body)
	}
}
