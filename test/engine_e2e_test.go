package test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
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
	maxConcurrency int             // per worker; 0 leaves usher's default
	fifo           bool            // queue.fifo
	policy         string          // routing.policy; "" leaves usher's default
	engineArgs     []string        // more llama-server flags
	recorder       *engineRecorder // when set, usher reaches each engine through its proxy
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
		u := e.URL
		if o.recorder != nil {
			u = o.recorder.proxy(t, id, e.URL)
		}
		fmt.Fprintf(&workers, "    - {id: %s, url: %q, models: [%s]", id, u, engineModel)
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
// usher's queue, where classes apply, not in the engine's own FIFO queue. What the engines saw
// shows it, each engine behind a recording proxy: usher never had more requests in flight on an
// engine than the engine has slots, and an interactive request that arrives while batch requests
// wait in usher's queue is dispatched by usher, and reaches an engine, before any of them.
//
// The test asserts no latency: the order of service is made deterministic by holding the
// engines' answers at the proxies, so no capacity frees while the interactive request arrives,
// then giving back one answer at a time.
func TestEngineProtectsInteractiveUnderBatchFloodByDefault(t *testing.T) {
	const workers, slots = 2, 2
	rec := &engineRecorder{}
	s := startEngineStack(t, engineStackOptions{workers: workers, slots: slots, recorder: rec})
	interactiveFirst(t, s, rec, workers, slots)
}

// interactiveFirst floods the stack with batch requests and sends interactive ones one at a
// time, each while batch requests wait in usher's queue and the engines' answers are held; it
// fails t when an interactive request was not dispatched, and did not reach an engine, before
// every batch request waiting, or when usher had more requests in flight on an engine than slots.
func interactiveFirst(t *testing.T, s *engineStack, rec *engineRecorder, workers, slots int) {
	const interactive = 5
	batchUsers := 4 * workers * slots // closed loop: 4x what the engines run at once
	waiting := 2 * workers * slots    // batch requests in usher's queue before a round starts
	// Until usher has read an engine's slots (llama.cpp's /props), it sends it up to
	// routing.concurrency.initial requests: the flood starts once it has, on every engine.
	eventually(t, time.Minute, "usher reads every engine's slots", func() bool { return rec.slotsRead() == len(s.ids) })
	ctx, stopFlood := context.WithTimeout(context.Background(), 3*time.Minute)
	defer stopFlood()
	var (
		mu       sync.Mutex // guards the two below
		answered int
		failures []string
	)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopFlood()
	defer rec.open()
	for u := range batchUsers {
		wg.Go(func() {
			client := &http.Client{Timeout: 2 * time.Minute}
			for i := 0; ctx.Err() == nil; i++ {
				resp, err := s.post(ctx, client, bulkKey, "batch", engineChat(fmt.Sprintf("batch job %d of user %d", i, u), 48, false))
				if err != nil {
					return // the flood's end cancels the last request
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				answered++
				if resp.StatusCode != http.StatusOK {
					failures = append(failures, fmt.Sprintf("batch status %d", resp.StatusCode))
				}
				mu.Unlock()
			}
		})
	}
	batchAnswered := func() int {
		mu.Lock()
		defer mu.Unlock()
		return answered
	}
	queue := func(name, class string) int {
		return int(gatewayCounter(t, s.gw.url, name, `class="`+class+`"`))
	}
	for i := range interactive {
		// Let the flood run, then hold every answer the engines give: usher's capacity stays
		// taken, and the batch requests pile up in its queue.
		before := batchAnswered()
		eventually(t, time.Minute, "the flood answers batch requests", func() bool { return batchAnswered() >= before+workers*slots })
		rec.hold()
		eventually(t, time.Minute, fmt.Sprintf("%d batch requests wait in usher's queue", waiting), func() bool {
			return queue("usher_queue_depth", "batch") >= waiting
		})
		dispatched := queue("usher_queue_dispatched_total", "interactive")
		name := fmt.Sprintf("interactive question %d", i)
		result := make(chan error, 1)
		go func() {
			resp, err := s.post(ctx, &http.Client{Timeout: 2 * time.Minute}, chatKey, "interactive", engineChat(name, 8, true))
			if err != nil {
				result <- err
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			result <- err
		}()
		// The interactive request is in usher now: waiting in its queue, or already dispatched
		// (to room the interactive reserve kept free, or taken from a batch request preempted
		// before its answer began). Every batch request dispatched from then on came after it.
		var batchDispatched int
		eventually(t, time.Minute, name+" reaches usher's queue", func() bool {
			if queue("usher_queue_depth", "interactive") == 0 && queue("usher_queue_dispatched_total", "interactive") == dispatched {
				return false
			}
			batchDispatched = queue("usher_queue_dispatched_total", "batch")
			return true
		})
		// Give back one held answer at a time: each frees one slot, which must go to the
		// interactive request, ahead of every batch request waiting.
		for {
			batch := queue("usher_queue_dispatched_total", "batch")
			if queue("usher_queue_dispatched_total", "interactive") > dispatched {
				break
			}
			if batch > batchDispatched {
				t.Fatalf("%s waits in usher's queue, and usher dispatched %d batch requests after it arrived, want 0", name, batch-batchDispatched)
			}
			if !rec.releaseOne() {
				time.Sleep(10 * time.Millisecond) // the engines are still answering
				continue
			}
			eventually(t, time.Minute, "usher gives the freed slot to a request", func() bool {
				return queue("usher_queue_dispatched_total", "batch") > batchDispatched ||
					queue("usher_queue_dispatched_total", "interactive") > dispatched
			})
		}
		eventually(t, time.Minute, name+" reaches an engine", func() bool { _, ok := rec.batchAhead(name); return ok })
		if ahead, _ := rec.batchAhead(name); ahead > batchDispatched {
			t.Fatalf("%s reached an engine after %d batch requests, but usher had dispatched only %d when it arrived: batch requests waiting in usher's queue passed it on the way to the engines",
				name, ahead, batchDispatched)
		}
		rec.open()
		if err := <-result; err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// What the engines saw while the flood ran: its end cancels every request in flight at
	// once, and an engine's proxy notices a request usher cancelled (preemption, a client gone)
	// only as its connection closes, while the slot it freed in usher may already be taken by
	// the next request, so counts from then on are the teardown's, not usher's.
	most, by := rec.maxInFlight()
	stopFlood()
	wg.Wait()

	t.Logf("the engines saw at most %v requests at once (%d slots each); %d batch requests answered", most, slots, batchAnswered())
	for id, n := range most {
		if n > slots {
			t.Errorf("usher had up to %d requests in flight on %s (the last to arrive: %s), which has %d slots: the waiting happens in the engine's FIFO queue, out of usher's reach",
				n, id, by[id], slots)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) > 0 {
		t.Fatalf("%d batch requests failed: %v", len(failures), failures[:min(len(failures), 5)])
	}
}

// engineRecorder sees what usher sends to the engines, through one proxy in front of each: how
// many inference requests each engine had at once, and the order they arrived in. It can hold
// the engines' answers, so usher's capacity stays taken while the test arranges its queue.
type engineRecorder struct {
	mu       sync.Mutex        // guards the fields below
	inFlight map[string]int    // inference requests at each engine: arrived, answer not read in full
	most     map[string]int    // the highest inFlight of each engine
	mostBy   map[string]string // the request whose arrival made it
	batch    int               // non-interactive inference requests that arrived, over every engine
	ahead    map[string]int    // per interactive request (its user message): batch when it arrived
	holding  bool
	held     []chan struct{} // answers read from the engines, not yet given to usher
	// per engine: 1 once it answered /props, 2 once usher scraped it after that (its scrape loop
	// applies the slots it read before it scrapes again)
	props map[string]int
}

// proxy returns the URL of a proxy to the engine at target, named id.
func (r *engineRecorder) proxy(t *testing.T, id, target string) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	plain := httputil.NewSingleHostReverseProxy(u)
	plain.Transport = noKeepAlive
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || !strings.HasPrefix(req.URL.Path, "/v1/") {
			r.mu.Lock()
			if req.URL.Path == "/metrics" && r.props[id] == 1 {
				r.props[id] = 2
			}
			r.mu.Unlock()
			sw := &statusWriter{ResponseWriter: w}
			plain.ServeHTTP(sw, req) // health checks, scrapes, /props
			if req.URL.Path == "/props" && sw.status == http.StatusOK {
				r.mu.Lock()
				if r.props == nil {
					r.props = map[string]int{}
				}
				r.props[id] = max(r.props[id], 1)
				r.mu.Unlock()
			}
			return
		}
		r.serve(w, req, id, target)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(r.open) // a held answer must not keep srv.Close waiting
	return srv.URL
}

// serve forwards one inference request, reads the engine's whole answer (a stream too) and
// counts the request out before usher can read a byte of it, so that usher, which counts it out
// only once it has read the answer, never has fewer in flight than the count.
func (r *engineRecorder) serve(w http.ResponseWriter, req *http.Request, id, target string) {
	body, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	if r.inFlight == nil {
		r.inFlight, r.most, r.mostBy, r.ahead = map[string]int{}, map[string]int{}, map[string]string{}, map[string]int{}
	}
	r.inFlight[id]++
	name, isInteractive := interactiveName(body)
	if r.inFlight[id] > r.most[id] {
		r.most[id], r.mostBy[id] = r.inFlight[id], cmp.Or(name, "a batch request")
	}
	if isInteractive {
		r.ahead[name] = r.batch
	} else {
		r.batch++
	}
	r.mu.Unlock()
	status, header, answer, err := forward(req, target, body)
	r.mu.Lock()
	r.inFlight[id]--
	var release chan struct{}
	if r.holding {
		release = make(chan struct{})
		r.held = append(r.held, release)
	}
	r.mu.Unlock()
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	if release != nil {
		select {
		case <-release:
		case <-req.Context().Done():
			return
		}
	}
	for _, k := range []string{"Content-Type", "Cache-Control"} {
		if v := header.Get(k); v != "" {
			w.Header().Set(k, v)
		}
	}
	w.WriteHeader(status)
	_, _ = w.Write(answer)
}

// noKeepAlive is the proxies' transport: llama-server serves HTTP on a few threads and holds
// one for each idle keep-alive connection, and closes a connection after a streamed answer.
var noKeepAlive = &http.Transport{DisableKeepAlives: true}

// forward sends req, with body, to the engine at target and reads its whole answer.
func forward(req *http.Request, target string, body []byte) (int, http.Header, []byte, error) {
	out, err := http.NewRequestWithContext(req.Context(), req.Method, target+req.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return 0, nil, nil, err
	}
	out.Header = req.Header.Clone()
	resp, err := noKeepAlive.RoundTrip(out)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, answer, err
}

// interactiveName finds "interactive question N" in a request body.
func interactiveName(body []byte) (string, bool) {
	i := bytes.Index(body, []byte("interactive question "))
	if i < 0 {
		return "", false
	}
	end := i + len("interactive question ")
	for end < len(body) && body[end] >= '0' && body[end] <= '9' {
		end++
	}
	return string(body[i:end]), true
}

// hold keeps every answer read from an engine from then on until releaseOne or open.
func (r *engineRecorder) hold() {
	r.mu.Lock()
	r.holding = true
	r.mu.Unlock()
}

// releaseOne gives usher one held answer, the oldest; false when none is held.
func (r *engineRecorder) releaseOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.held) == 0 {
		return false
	}
	close(r.held[0])
	r.held = r.held[1:]
	return true
}

// open gives usher every held answer and holds no more.
func (r *engineRecorder) open() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holding = false
	for _, c := range r.held {
		close(c)
	}
	r.held = nil
}

// batchAhead is the number of batch requests that had arrived at the engines when the
// interactive request named name did; false when it has not arrived.
func (r *engineRecorder) batchAhead(name string) (int, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.ahead[name]
	return n, ok
}

// slotsRead is the number of engines whose slots usher has read and applied.
func (r *engineRecorder) slotsRead() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.props {
		if v == 2 {
			n++
		}
	}
	return n
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// maxInFlight is the most inference requests each engine had at once, and the request whose
// arrival made it.
func (r *engineRecorder) maxInFlight() (map[string]int, map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.most), maps.Clone(r.mostBy)
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
