package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

const (
	testModel = "m1"
	testKey   = "sk-test-key"
)

// fakeWorker is a minimal OpenAI-compatible worker over real HTTP: it answers with a fixed
// number of chunks and the usage when asked, or fails as told.
type fakeWorker struct {
	srv        *httptest.Server
	requests   atomic.Int64
	status     int // answer this status for every inference request when non-zero
	breakAfter int // close the stream after this many chunks when non-zero
	chunks     int
	// hold, when set, keeps every inference request waiting until it is closed (or the
	// client goes away); started counts requests that reached the wait.
	hold    chan struct{}
	started atomic.Int64
	// linger keeps a stream open after [DONE] until the client goes away.
	linger bool
	// headersFirst sends a stream's headers before the hold, as an engine does that answers at
	// once and then prefills the prompt.
	headersFirst bool
	// hangAfter, when non-zero, stops a stream after this many chunks without ending it, until
	// the client goes away: a hung engine.
	hangAfter int

	// tokenGap, when non-zero, is slept between a stream's chunks: an engine's decode steps;
	// firstGap before its first chunk: a decode engine pulling a prompt's KV.
	tokenGap, firstGap time.Duration

	// slots, when non-zero, is reported at GET /props as llama.cpp's server reports its slots.
	slots int

	mu         sync.Mutex // guards lastBody and lastHeader
	lastBody   map[string]any
	lastHeader http.Header
}

func newFakeWorker(t testing.TB, mutate func(*fakeWorker)) *fakeWorker {
	t.Helper()
	w := &fakeWorker{chunks: 3}
	if mutate != nil {
		mutate(w)
	}
	w.srv = httptest.NewServer(w)
	t.Cleanup(w.srv.Close)
	return w
}

func (w *fakeWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost { // health checks, metric scrapes and /props
		if r.URL.Path == "/props" && w.slots > 0 {
			fmt.Fprintf(rw, `{"total_slots":%d}`, w.slots)
			return
		}
		rw.WriteHeader(http.StatusOK)
		return
	}
	w.requests.Add(1)
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	w.mu.Lock()
	w.lastBody, w.lastHeader = body, r.Header.Clone()
	w.mu.Unlock()
	if stream, _ := body["stream"].(bool); stream && w.headersFirst {
		rw.Header().Set("Content-Type", "text/event-stream")
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
	}
	if w.hold != nil {
		w.started.Add(1)
		select {
		case <-w.hold:
		case <-r.Context().Done():
			return
		}
	}
	if w.status != 0 {
		http.Error(rw, `{"error":{"message":"injected"}}`, w.status)
		return
	}
	usageJSON := w.usageJSON()
	if stream, _ := body["stream"].(bool); !stream {
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprint(rw, w.wholeAnswer())
		return
	}
	rw.Header().Set("Content-Type", "text/event-stream")
	flusher := rw.(http.Flusher)
	for i := 0; i < w.chunks; i++ {
		if w.breakAfter > 0 && i == w.breakAfter {
			panic(http.ErrAbortHandler)
		}
		if w.hangAfter > 0 && i == w.hangAfter {
			<-r.Context().Done()
			return
		}
		if i > 0 && w.tokenGap > 0 {
			time.Sleep(w.tokenGap)
		}
		if i == 0 && w.firstGap > 0 {
			time.Sleep(w.firstGap)
		}
		fmt.Fprintf(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		flusher.Flush()
	}
	if so, _ := body["stream_options"].(map[string]any); so["include_usage"] == true {
		fmt.Fprintf(rw, "data: {\"choices\":[],\"usage\":%s}\n\n", usageJSON)
	}
	fmt.Fprint(rw, "data: [DONE]\n\n")
	if w.linger {
		flusher.Flush()
		<-r.Context().Done()
	}
}

func (w *fakeWorker) usageJSON() string {
	return fmt.Sprintf(`{"prompt_tokens":5,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":2}}`, w.chunks, 5+w.chunks)
}

// wholeAnswer is the answer's bytes as the worker writes them to a request that is not a stream.
func (w *fakeWorker) wholeAnswer() string {
	return `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":` + w.usageJSON() + `}`
}

func (w *fakeWorker) body() map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastBody
}

// header is the headers of the last inference request the worker got.
func (w *fakeWorker) header() http.Header {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lastHeader
}

func (w *fakeWorker) spec(id string) routing.WorkerSpec {
	return routing.WorkerSpec{ID: id, URL: w.srv.URL, Models: []string{testModel}}
}

type testGateway struct {
	url string
	reg *prometheus.Registry
	srv *Server
}

func startGateway(t testing.TB, specs []routing.WorkerSpec, mutate func(*Config)) *testGateway {
	t.Helper()
	return startGatewayWith(t, specs, mutate, nil)
}

// startGatewayWith is startGateway with the dependencies open to change (deps runs last).
func startGatewayWith(t testing.TB, specs []routing.WorkerSpec, mutate func(*Config), deps func(*Deps)) *testGateway {
	t.Helper()
	return startGatewayOn(t, routing.Config{Workers: specs, Policy: "round_robin"}, mutate, deps)
}

// startGatewayOn is startGatewayWith with the routing config given (defaults filled in here).
func startGatewayOn(t testing.TB, rcfg routing.Config, mutate func(*Config), deps func(*Deps)) *testGateway {
	t.Helper()
	return startGatewayPool(t, rcfg, routing.Options{}, mutate, deps)
}

// startGatewayPool is startGatewayOn with the pool's options given (its Registerer set here).
func startGatewayPool(t testing.TB, rcfg routing.Config, popts routing.Options, mutate func(*Config), deps func(*Deps)) *testGateway {
	t.Helper()
	rcfg.SetDefaults()
	if err := rcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	popts.Registerer = reg
	pool, err := routing.NewPool(rcfg, popts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); pool.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	auth, err := tenants.NewStatic([]tenants.TenantSpec{{ID: "t1", Name: "T1",
		Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(testKey)}}}})
	if err != nil {
		t.Fatal(err)
	}
	var cfg Config
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.SetDefaults()
	d := Deps{Pool: pool, Auth: auth, Registerer: reg, Gatherer: reg}
	if deps != nil {
		deps(&d)
	}
	gw, err := New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &testGateway{url: srv.URL, reg: reg, srv: gw}
}

// postLater is post in a goroutine of its own: its response comes on the channel once the
// gateway answers, so a test can hold one call at its worker while it sends the next.
func (g *testGateway) postLater(t *testing.T, path, key, body string, hdr map[string]string) <-chan *http.Response {
	ch := make(chan *http.Response, 1)
	go func() { ch <- g.post(t, path, key, body, hdr) }()
	return ch
}

func (g *testGateway) post(t *testing.T, path, key, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

const chatBody = `{"model":"m1","messages":[{"role":"user","content":"hello"}]}`
const streamBody = `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hello"}]}`

func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var events []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "data:") {
			events = append(events, strings.TrimSpace(strings.TrimPrefix(line, "data:")))
		}
	}
	return events
}

func TestNonStreamingAnswerAndHeaders(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d, want 200", resp.StatusCode)
	}
	if got := resp.Header.Get(headerWorker); got != "w1" {
		t.Errorf("%s: got %q, want w1", headerWorker, got)
	}
	if got := resp.Header.Get(headerRoute); got == "" {
		t.Errorf("%s: empty", headerRoute)
	}
	if got := resp.Header.Get("X-Request-ID"); len(got) != 32 {
		t.Errorf("X-Request-ID: got %q, want a generated 32-hex id", got)
	}
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	if out.Usage.CompletionTokens != 3 {
		t.Errorf("usage passed to the client: got %+v", out.Usage)
	}
	if got := tokensServed(t, g, "completion"); got != 3 {
		t.Errorf("usher_tokens_total{kind=completion}: got %v, want 3", got)
	}
}

// tokensServed reads usher_tokens_total for the test model and kind from the registry.
func tokensServed(t *testing.T, g *testGateway, kind string) float64 {
	t.Helper()
	return counterValue(t, g, "usher_tokens_total", map[string]string{"model": testModel, "kind": kind})
}

// counterValue reads the counter name whose labels include want, or 0 when there is none.
func counterValue(t *testing.T, g *testGateway, name string, want map[string]string) float64 {
	t.Helper()
	families, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestRequestIDFromClientIsKept(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{"X-Request-ID": "client-id-1"})
	if got := resp.Header.Get("X-Request-ID"); got != "client-id-1" {
		t.Fatalf("X-Request-ID: got %q, want client-id-1", got)
	}
}

func TestStreamRemovesTheUsageChunkTheClientDidNotAskFor(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.chunks = 4 })
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type: got %q", ct)
	}
	events := readEvents(t, resp.Body)
	if got, want := len(events), 5; got != want {
		t.Fatalf("events: got %d %q, want %d (4 chunks and [DONE])", got, events, want)
	}
	for _, e := range events {
		if strings.Contains(e, `"usage"`) {
			t.Fatalf("the client got a usage chunk it did not ask for: %s", e)
		}
	}
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("last event: got %q, want [DONE]", events[len(events)-1])
	}
	so, _ := w.body()["stream_options"].(map[string]any)
	if so["include_usage"] != true {
		t.Fatalf("the worker was not asked for usage: %v", w.body())
	}
	if got := tokensServed(t, g, "completion"); got != 4 {
		t.Errorf("usher_tokens_total{kind=completion}: got %v, want 4", got)
	}
	if got := tokensServed(t, g, "cached"); got != 2 {
		t.Errorf("usher_tokens_total{kind=cached}: got %v, want 2", got)
	}
}

func TestClientClosingAfterDoneIsASuccess(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.linger = true })
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && sc.Text() != "data: [DONE]" {
	}
	resp.Body.Close()
	deadline := time.Now().Add(2 * time.Second)
	for requestsWithStatus(t, g, "200") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("usher_requests_total: 200 counted %v, 499 counted %v; want one 200",
				requestsWithStatus(t, g, "200"), requestsWithStatus(t, g, "499"))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := requestsWithStatus(t, g, "499"); n != 0 {
		t.Fatalf("a complete stream was counted as a client close (%v)", n)
	}
}

// requestsWithStatus reads usher_requests_total for the test model and status.
func requestsWithStatus(t *testing.T, g *testGateway, status string) float64 {
	t.Helper()
	return counterValue(t, g, "usher_requests_total", map[string]string{"model": testModel, "status": status})
}

func TestStreamKeepsTheUsageChunkTheClientAskedFor(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	events := readEvents(t, g.post(t, "/v1/chat/completions", testKey, body, nil).Body)
	var usageChunks int
	for _, e := range events {
		if strings.Contains(e, `"usage"`) {
			usageChunks++
		}
	}
	if usageChunks != 1 {
		t.Fatalf("usage chunks: got %d, want 1 (%q)", usageChunks, events)
	}
}

func TestRetryOnAnotherWorkerBeforeTheFirstByte(t *testing.T) {
	failing := newFakeWorker(t, func(w *fakeWorker) { w.status = http.StatusInternalServerError })
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()
	ok := newFakeWorker(t, nil)
	specs := []routing.WorkerSpec{failing.spec("bad"), {ID: "gone", URL: closedURL, Models: []string{testModel}}, ok.spec("good")}
	g := startGateway(t, specs, nil)
	for i := 0; i < 6; i++ {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: status %d, want 200", i, resp.StatusCode)
		}
		if got := resp.Header.Get(headerWorker); got != "good" {
			t.Fatalf("request %d: served by %q, want good", i, got)
		}
		if events := readEvents(t, resp.Body); events[len(events)-1] != "[DONE]" {
			t.Fatalf("request %d: stream did not end with [DONE]", i)
		}
	}
	if ok.requests.Load() != 6 {
		t.Fatalf("good worker: got %d requests, want 6 (each exactly once)", ok.requests.Load())
	}
}

func TestNoRetryAfterTheFirstByte(t *testing.T) {
	breaking := newFakeWorker(t, func(w *fakeWorker) { w.chunks, w.breakAfter = 5, 2 })
	other := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{breaking.spec("breaks")}, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status: got %d, want 200 (the stream had begun)", resp.StatusCode)
	}
	events := readEvents(t, resp.Body)
	if len(events) != 3 || !strings.Contains(events[2], `"error"`) {
		t.Fatalf("events: got %q, want two chunks and an error event", events)
	}
	if other.requests.Load() != 0 || breaking.requests.Load() != 1 {
		t.Fatalf("requests: breaking %d, other %d; want 1 and 0", breaking.requests.Load(), other.requests.Load())
	}
}

func TestErrorStatuses(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, func(c *Config) { c.MaxBodyBytes = 1024 })
	failing := newFakeWorker(t, func(w *fakeWorker) { w.status = http.StatusBadGateway })
	gFail := startGateway(t, []routing.WorkerSpec{failing.spec("f1"), failing.spec("f2")}, nil)
	tests := []struct {
		name       string
		g          *testGateway
		path, key  string
		body       string
		wantStatus int
		wantCode   string
	}{
		{"no key", g, "/v1/chat/completions", "", chatBody, 401, "invalid_api_key"},
		{"wrong key", g, "/v1/chat/completions", "sk-wrong", chatBody, 401, "invalid_api_key"},
		{"malformed json", g, "/v1/chat/completions", testKey, `{"model":`, 400, "invalid_request"},
		{"missing model", g, "/v1/chat/completions", testKey, `{"messages":[{"role":"user","content":"x"}]}`, 400, "invalid_request"},
		{"missing messages", g, "/v1/chat/completions", testKey, `{"model":"m1"}`, 400, "invalid_request"},
		{"missing prompt", g, "/v1/completions", testKey, `{"model":"m1"}`, 400, "invalid_request"},
		{"unknown model", g, "/v1/chat/completions", testKey, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found"},
		{"too large", g, "/v1/chat/completions", testKey, `{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("x", 2000) + `"}]}`, 413, "request_too_large"},
		{"unknown path", g, "/v1/nothing", testKey, `{}`, 404, "not_found"},
		{"all workers fail", gFail, "/v1/chat/completions", testKey, chatBody, 502, "upstream_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := tt.g.post(t, tt.path, tt.key, tt.body, nil)
			if resp.StatusCode != tt.wantStatus {
				t.Fatalf("status: got %d, want %d", resp.StatusCode, tt.wantStatus)
			}
			var e errorBody
			if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
				t.Fatalf("error body is not OpenAI's shape: %v", err)
			}
			if e.Error.Code != tt.wantCode || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("error: got %+v, want code %q with a message and type", e.Error, tt.wantCode)
			}
			if strings.Contains(e.Error.Message, "sk-wrong") {
				t.Fatalf("the error repeats the credential: %q", e.Error.Message)
			}
		})
	}
}

func TestModelsList(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	req, _ := http.NewRequest(http.MethodGet, g.url+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	if len(list.Data) != 1 || list.Data[0].ID != testModel {
		t.Fatalf("models: got %+v, want [%s]", list.Data, testModel)
	}
}

func TestReadyz(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp, err := http.Get(g.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: got %d, want 200", resp.StatusCode)
	}
}

// The request path reads and writes headers by their canonical keys, without canonicalizing
// (headerValue): a key that is not in canonical form would never match.
func TestHeaderKeysAreCanonical(t *testing.T) {
	for _, k := range []string{headerRequestID, canonicalSessionID, canonicalTTFTObjectiveMs, canonicalTPOTObjectiveMs,
		headerTarget, headerPriority, headerDeadlineMs, headerRoutingKey, headerWorker, headerRoute, headerClass,
		headerServiceTier, headerQueueMs, echo.HeaderAuthorization} {
		if got := http.CanonicalHeaderKey(k); got != k {
			t.Errorf("header key %q: canonical form %q", k, got)
		}
	}
	for name, canonical := range map[string]string{echo.HeaderXRequestID: headerRequestID, headerSessionID: canonicalSessionID,
		headerTTFTObjectiveMs: canonicalTTFTObjectiveMs, headerTPOTObjectiveMs: canonicalTPOTObjectiveMs} {
		if got := http.CanonicalHeaderKey(name); got != canonical {
			t.Errorf("header %q: canonical form %q, the code reads %q", name, got, canonical)
		}
	}
}
