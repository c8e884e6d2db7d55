package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

func TestClassSelectionHeaders(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	tests := []struct {
		name      string
		body      string
		hdr       map[string]string
		wantClass string
	}{
		{"tier default", chatBody, nil, "standard"},
		{"lowered by header", chatBody, map[string]string{headerPriority: "batch"}, "batch"},
		{"raised within the tier", chatBody, map[string]string{headerPriority: "interactive"}, "interactive"},
		{"service_tier flex", `{"model":"m1","service_tier":"flex","messages":[{"role":"user","content":"x"}]}`, nil, "batch"},
		{"service_tier priority", `{"model":"m1","service_tier":"priority","messages":[{"role":"user","content":"x"}]}`, nil, "interactive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := g.post(t, "/v1/chat/completions", testKey, tt.body, tt.hdr)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := resp.Header.Get(headerClass); got != tt.wantClass {
				t.Fatalf("%s: got %q, want %q", headerClass, got, tt.wantClass)
			}
			if got := resp.Header.Get(headerQueueMs); got != "0" {
				t.Fatalf("%s: got %q, want 0 on an idle gateway", headerQueueMs, got)
			}
		})
	}
}

// tierAuth is an Authenticator that gives every credential one tenant of one tier.
type tierAuth struct{ tier *tenants.Tier }

func (a tierAuth) Authenticate(_ context.Context, _ string) (tenants.Principal, error) {
	return tenants.Principal{TenantID: "t1", Tier: a.tier.Name, TierSpec: a.tier}, nil
}

func TestTierCapsTheClassAndTheModels(t *testing.T) {
	w := newFakeWorker(t, nil)
	batchOnly := &tenants.Tier{Name: "bulk", HighestClass: tenants.ClassBatch, DefaultClass: tenants.ClassBatch,
		Weight: 1, Models: []string{"m1"}}
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1"), {ID: "w2", URL: w.srv.URL, Models: []string{"m2"}}}, nil,
		func(d *Deps) { d.Auth = tierAuth{batchOnly} })
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	if got := resp.Header.Get(headerClass); resp.StatusCode != http.StatusOK || got != "batch" {
		t.Fatalf("got %d class %q, want 200 in batch: a tier's highest class is never exceeded", resp.StatusCode, got)
	}
	resp = g.post(t, "/v1/chat/completions", testKey, `{"model":"m2","messages":[{"role":"user","content":"x"}]}`, nil)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("model outside the tier: got %d, want 404, as a model that does not exist", resp.StatusCode)
	}
}

func TestBadAdmissionHeaders(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	for name, hdr := range map[string]map[string]string{
		"unknown class":     {headerPriority: "urgent"},
		"deadline not int":  {headerDeadlineMs: "soon"},
		"deadline zero":     {headerDeadlineMs: "0"},
		"deadline too long": {headerDeadlineMs: "999999999999"},
	} {
		t.Run(name, func(t *testing.T) {
			if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, hdr); resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("got %d, want 400", resp.StatusCode)
			}
		})
	}
	if resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","service_tier":"gold","messages":[{"role":"user","content":"x"}]}`, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("unknown service_tier: got %d, want 400", resp.StatusCode)
	}
}

// startHeldGateway is one worker of concurrency one whose requests wait until released.
func startHeldGateway(t *testing.T, qcfg queue.Config) (*testGateway, *fakeWorker) {
	t.Helper()
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = make(chan struct{}) })
	spec := w.spec("w1")
	spec.MaxConcurrency = 1
	g := startGatewayWith(t, []routing.WorkerSpec{spec}, nil, func(d *Deps) { d.Queue = qcfg })
	t.Cleanup(func() {
		select {
		case <-w.hold:
		default:
			close(w.hold)
		}
	})
	return g, w
}

// occupy sends a request that takes the held worker's only slot, and waits until it is there.
func occupy(t *testing.T, g *testGateway, w *fakeWorker) {
	t.Helper()
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+testKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	deadline := time.Now().Add(5 * time.Second)
	for w.started.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first request never reached the worker")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func decodeError(t *testing.T, resp *http.Response) errorObject {
	t.Helper()
	var e errorBody
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("error body: %v", err)
	}
	return e.Error
}

func TestDeadlinePassedInTheQueueIs504(t *testing.T) {
	g, w := startHeldGateway(t, queue.Config{})
	occupy(t, g, w)
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerDeadlineMs: "150"})
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("got %d, want 504", resp.StatusCode)
	}
	if e := decodeError(t, resp); e.Code != "deadline_exceeded" {
		t.Fatalf("code: got %q, want deadline_exceeded", e.Code)
	}
	if w.requests.Load() != 1 {
		t.Fatalf("the worker got %d requests, want only the first", w.requests.Load())
	}
}

func TestQueueFullIs429WithRetryAfter(t *testing.T) {
	g, w := startHeldGateway(t, queue.Config{MaxQueuedPerTenant: 1})
	occupy(t, g, w)
	queued := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(chatBody))
		req.Header.Set("Authorization", "Bearer "+testKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			queued <- 0
			return
		}
		resp.Body.Close()
		queued <- resp.StatusCode
	}()
	waitQueued(t, g, 1)
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("got %d with Retry-After %q, want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := decodeError(t, resp); e.Code != "queue_full" {
		t.Fatalf("code: got %q, want queue_full", e.Code)
	}
	close(w.hold)
	if got := <-queued; got != http.StatusOK {
		t.Fatalf("the queued request: got %d, want 200 once capacity freed", got)
	}
}

// waitQueued waits until the model's queue holds n requests.
func waitQueued(t *testing.T, g *testGateway, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		q, err := g.srv.dispatcher.queueFor(testModel)
		if err != nil {
			t.Fatal(err)
		}
		queued := 0
		for _, c := range q.Snapshot().Classes {
			queued += c.Queued
		}
		if queued == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the queue never held %d requests", n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestShutdownSettlesThenAnswersQueuedRequestsWith503(t *testing.T) {
	g, w := startHeldGateway(t, queue.Config{})
	occupy(t, g, w)
	type result struct {
		status     int
		retryAfter string
	}
	send := func() <-chan result {
		done := make(chan result, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(chatBody))
			req.Header.Set("Authorization", "Bearer "+testKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				done <- result{}
				return
			}
			resp.Body.Close()
			done <- result{resp.StatusCode, resp.Header.Get("Retry-After")}
		}()
		return done
	}
	queuedBefore := send()
	waitQueued(t, g, 1)

	// Settle: not ready, but requests are still admitted and wait their turn.
	g.srv.BeginShutdown()
	resp, err := http.Get(g.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !resp.Close {
		t.Fatalf("readyz while settling: got %d, connection close %v; want 503, true", resp.StatusCode, resp.Close)
	}
	queuedDuring := send()
	waitQueued(t, g, 2)
	select {
	case r := <-queuedBefore:
		t.Fatalf("a queued request was answered %d during the settle time, want it still queued", r.status)
	default:
	}

	g.srv.StopAdmitting()
	for name, done := range map[string]<-chan result{"queued before shutdown": queuedBefore, "queued while settling": queuedDuring, "sent after": send()} {
		select {
		case r := <-done:
			if r.status != http.StatusServiceUnavailable || r.retryAfter == "" {
				t.Fatalf("%s: got %d with Retry-After %q, want 503 with one", name, r.status, r.retryAfter)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: not answered once admission stopped", name)
		}
	}
}

func TestPriorityHandedDownOnlyToWorkersThatScheduleByIt(t *testing.T) {
	plain := newFakeWorker(t, nil)
	byPriority := newFakeWorker(t, nil)
	spec := byPriority.spec("prio")
	spec.PriorityHandoff = true
	body := `{"model":"m1","priority":-100,"messages":[{"role":"user","content":"x"}]}`
	for _, tc := range []struct {
		w    *fakeWorker
		spec routing.WorkerSpec
		want any
	}{
		// The client's own priority never reaches a worker: one that does not schedule by it
		// gets none (a client must not jump an engine's queue usher does not see), one that
		// does gets the class usher assigned.
		{plain, plain.spec("plain"), nil},
		{byPriority, spec, float64(2)},
	} {
		g := startGateway(t, []routing.WorkerSpec{tc.spec}, nil)
		if resp := g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: "batch"}); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", tc.spec.ID, resp.StatusCode)
		}
		if got := tc.w.body()["priority"]; got != tc.want {
			t.Fatalf("%s: priority sent: got %v, want %v", tc.spec.ID, got, tc.want)
		}
	}
}

func TestCapacityLeavesRoomForOtherReplicas(t *testing.T) {
	worker := func(state routing.WorkerState, model string, others int64) routing.WorkerStatus {
		return routing.WorkerStatus{State: state, Models: []string{model}, MaxConcurrency: 8, MaxTokensInFlight: 1000, OthersInFlight: others}
	}
	shared := func(share int64) routing.WorkerStatus {
		w := worker(routing.StateHealthy, "m", 6)
		w.Share, w.Shared = share, true
		return w
	}
	lowered := func(share, inFlight int64) routing.WorkerStatus {
		w := shared(share)
		w.InFlight = inFlight
		return w
	}
	tests := []struct {
		name    string
		workers []routing.WorkerStatus
		want    queue.Capacity
	}{
		{"alone", []routing.WorkerStatus{worker(routing.StateHealthy, "m", 0), worker(routing.StateHealthy, "m", 0)}, queue.Capacity{Requests: 16, Tokens: 2000}},
		{"others hold some", []routing.WorkerStatus{worker(routing.StateHealthy, "m", 3), worker(routing.StateHealthy, "m", 0)}, queue.Capacity{Requests: 13, Tokens: 2000}},
		{"others fill one: a slot stays", []routing.WorkerStatus{worker(routing.StateHealthy, "m", 20), worker(routing.StateHealthy, "m", 0)}, queue.Capacity{Requests: 9, Tokens: 2000}},
		{"unhealthy, draining and other models count nothing", []routing.WorkerStatus{worker(routing.StateUnhealthy, "m", 0), worker(routing.StateDraining, "m", 0), worker(routing.StateHealthy, "n", 0)}, queue.Capacity{}},
		{"split by the fleet: this replica's shares, 0 included", []routing.WorkerStatus{shared(3), shared(0), worker(routing.StateHealthy, "m", 5)}, queue.Capacity{Requests: 6, Tokens: 3000}},
		// Five in flight on a share lowered to 2 must not hide the other worker's free slot
		// (2 + 3 counted, 6 in flight: the queue would never try the placer).
		{"split by the fleet: a share lowered under its requests in flight", []routing.WorkerStatus{lowered(2, 5), shared(3)}, queue.Capacity{Requests: 8, Tokens: 2000}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, _ := capacityOf(tt.workers, "m", false); got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// Session ids and routing keys become pins in Redis and rows of the console: a tenant cannot
// make them large (a 64 KB session id grew Redis to 261 MB in 20 s) or put control bytes in them.
func TestRoutingKeysAreBounded(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w")}, nil)
	for _, tc := range []struct {
		header, value string
		want          int
	}{
		{headerSessionID, strings.Repeat("s", maxRoutingKey), http.StatusOK},
		{headerSessionID, strings.Repeat("s", maxRoutingKey+1), http.StatusBadRequest},
		{headerSessionID, strings.Repeat("s", 64<<10), http.StatusBadRequest},
		{headerRoutingKey, "user-42", http.StatusOK},
		{headerRoutingKey, strings.Repeat("k", maxRoutingKey+1), http.StatusBadRequest},
		{headerRoutingKey, "tab\there", http.StatusBadRequest},
	} {
		if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{tc.header: tc.value}); resp.StatusCode != tc.want {
			t.Errorf("%s of %d bytes: got %d, want %d", tc.header, len(tc.value), resp.StatusCode, tc.want)
		}
	}
	if got := w.requests.Load(); got != 2 {
		t.Errorf("the worker got %d requests, want the 2 with sane keys", got)
	}
}

// Tokens reserved are tokens allowed (issue 26, item 8): without max_tokens the worker is told
// the bound usher reserved, and a completions batch or n choices reserve every answer they ask
// for, so a tier of 20,000 tokens a minute refuses 6 x 4,000 at once.
func TestReservedOutputIsTheBoundTheWorkerGets(t *testing.T) {
	tier := &tenants.Tier{Name: "pro", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}, TokensPerMinute: 20000, ExpectedOutputTokens: 2000}
	start := func(t *testing.T) (*testGateway, *fakeWorker) {
		w := newFakeWorker(t, nil)
		g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) {
			d.Auth = tierAuth{tier}
			d.Limits = tenants.NewLimiter(tenants.LimitsConfig{}, tenants.LimiterOptions{})
		})
		return g, w
	}
	t.Run("no max_tokens", func(t *testing.T) {
		g, w := start(t)
		for _, body := range []string{chatBody, `{"model":"m1","max_tokens":null,"messages":[{"role":"user","content":"x"}]}`} {
			if resp := g.post(t, "/v1/chat/completions", testKey, body, nil); resp.StatusCode != http.StatusOK {
				t.Fatalf("got %d, want 200", resp.StatusCode)
			}
			if got := w.body()["max_tokens"]; got != float64(2000) {
				t.Fatalf("the worker read max_tokens %v, want the 2000 usher reserved", got)
			}
		}
	})
	for _, tt := range []struct{ name, path, body string }{
		{"a batch of prompts", "/v1/completions", `{"model":"m1","max_tokens":4000,"prompt":["a","b","c","d","e","f"]}`},
		{"n choices", "/v1/chat/completions", `{"model":"m1","max_tokens":4000,"n":6,"messages":[{"role":"user","content":"x"}]}`},
		{"best_of", "/v1/completions", `{"model":"m1","max_tokens":4000,"best_of":6,"prompt":"a"}`},
		{"a batch without max_tokens", "/v1/completions", `{"model":"m1","prompt":["a","b","c","d","e","f","g","h","i","j","k"]}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g, w := start(t)
			if resp := g.post(t, tt.path, testKey, tt.body, nil); resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("got %d, want 429: the answers asked for exceed 20,000 tokens a minute", resp.StatusCode)
			}
			if n := w.requests.Load(); n != 0 {
				t.Fatalf("the worker got %d requests", n)
			}
		})
	}
}

// The prompt cap counts what the engine renders (issue 26, item 6): text in content parts of any
// type, tool calls, tools, functions and response_format schemas. 42 KB in any of them passed a
// 50-token cap and reached the worker.
func TestPromptCapCountsWhatTheEngineRenders(t *testing.T) {
	start := func(promptCap int64) (*testGateway, *fakeWorker) {
		tier := &tenants.Tier{Name: "small", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
			Weight: 1, Models: []string{"*"}, MaxPromptTokens: promptCap}
		w := newFakeWorker(t, nil)
		g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) {
			d.Auth = tierAuth{tier}
			d.Limits = tenants.NewLimiter(tenants.LimitsConfig{}, tenants.LimiterOptions{})
		})
		return g, w
	}
	g, w := start(50)
	big := strings.Repeat("lorem ipsum ", 3500) // 42 KB
	schema := `{"type":"object","description":"` + big + `"}`
	user := `{"role":"user","content":"hi"}`
	for name, body := range map[string]string{
		"input_text part":       `{"model":"m1","messages":[{"role":"user","content":[{"type":"input_text","text":"` + big + `"}]}]}`,
		"output_text part":      `{"model":"m1","messages":[{"role":"assistant","content":[{"type":"output_text","text":"` + big + `"}]},` + user + `]}`,
		"thinking part":         `{"model":"m1","messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"` + big + `"}]},` + user + `]}`,
		"tool_calls":            `{"model":"m1","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"f","arguments":"` + big + `"}}]},` + user + `]}`,
		"reasoning":             `{"model":"m1","messages":[{"role":"assistant","content":"ok","reasoning_content":"` + big + `"},` + user + `]}`,
		"tools":                 `{"model":"m1","messages":[` + user + `],"tools":[{"type":"function","function":{"name":"f","parameters":` + schema + `}}]}`,
		"functions":             `{"model":"m1","messages":[` + user + `],"functions":[{"name":"f","parameters":` + schema + `}]}`,
		"response_format":       `{"model":"m1","messages":[` + user + `],"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":` + schema + `}}}`,
		"text in an image part": `{"model":"m1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/y.png"},"text":"` + big + `"}]}]}`,
		"completions suffix":    `{"model":"m1","prompt":"a","suffix":"` + big + `"}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := "/v1/chat/completions"
			if strings.Contains(body, `"prompt"`) {
				path = "/v1/completions"
			}
			resp := g.post(t, path, testKey, body, nil)
			if ae := decodeError(t, resp); resp.StatusCode != http.StatusBadRequest || ae.Code != "context_length_exceeded" {
				t.Fatalf("got %d %q, want 400 context_length_exceeded", resp.StatusCode, ae.Code)
			}
		})
	}
	if n := w.requests.Load(); n != 0 {
		t.Fatalf("the worker got %d of the long prompts", n)
	}
	// An image counts by its own rule, not by the bytes of its data URL.
	g, _ = start(2000)
	image := `{"model":"m1","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("QUFB", 25000) + `"}}]}]}`
	if resp := g.post(t, "/v1/chat/completions", testKey, image, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("a 100 KB image under a 2,000-token cap: got %d, want 200", resp.StatusCode)
	}
}

// A tenant's body must not steer the engine itself (ADVERSARIAL row 32): vLLM's
// kv_transfer_params and SGLang's bootstrap_* name a host a disaggregated engine fetches KV blocks
// from, and the blocks (another request's); rid and request_id name the engine's request; lora_path
// picks an adapter outside the model names usher checks; custom_logit_processor loads code. The
// worker sees none of them, for chats and completions, streamed or not, and a re-cased variant
// (which an engine folding case would read) is refused.
func TestEngineControlMembersNeverReachAWorker(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w")}, nil)
	controls := `"kv_transfer_params":{"do_remote_prefill":true,"remote_host":"10.0.0.9","remote_port":5600,"remote_block_ids":[1,2,3],"remote_engine_id":"e"},` +
		`"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":42,"rid":"victim","request_id":"victim",` +
		`"routed_dp_rank":1,"data_parallel_rank":1,"disagg_prefill_dp_rank":1,"lora_path":"other-tenant-adapter",` +
		`"custom_logit_processor":"gASV","logits_processors":["os.system"],"custom_labels":{"a":"b"},`
	for _, tc := range []struct{ path, body string }{
		{"/v1/chat/completions", `{"model":"m1",` + controls + `"temperature":0.5,"messages":[{"role":"user","content":"x"}]}`},
		{"/v1/chat/completions", `{"model":"m1",` + controls + `"stream":true,"messages":[{"role":"user","content":"x"}]}`},
		{"/v1/completions", `{"model":"m1",` + controls + `"prompt":"x"}`},
	} {
		if resp := g.post(t, tc.path, testKey, tc.body, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", tc.path, resp.StatusCode)
		}
		got := w.body()
		for _, k := range engineControlKeys {
			if v, ok := got[k]; ok {
				t.Errorf("%s: the worker got %s = %v", tc.path, k, v)
			}
		}
		if got["model"] != "m1" {
			t.Errorf("%s: the worker got model %v: the other members must stay", tc.path, got["model"])
		}
	}
	recased := `{"model":"m1","Kv_Transfer_Params":{"remote_host":"10.0.0.9"},"messages":[{"role":"user","content":"x"}]}`
	if resp := g.post(t, "/v1/chat/completions", testKey, recased, nil); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("re-cased kv_transfer_params: status %d, want 400", resp.StatusCode)
	}
}

// The id a worker is sent is unique to the request (ADVERSARIAL row 33): vLLM takes X-Request-Id
// as its request id, and a second request with the id of one it runs is refused (or, in older
// versions, mixes the two). A client's id reaches the worker with a random suffix, so two tenants
// naming the same id, or a tenant naming another's, never collide; the client is still answered
// with its own id. A fresh id goes as it is; a client's X-Usher-Engine-Request-Id is never read;
// a retry's id differs from its first attempt's.
func TestWorkerRequestIDsAreUnique(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w")}, nil)
	body := `{"model":"m1","messages":[{"role":"user","content":"x"}]}`
	seen := map[string]bool{}
	for range 2 {
		resp := g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerRequestID: "trace-42"})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerRequestID) != "trace-42" {
			t.Fatalf("status %d, id %q: want 200 with the client's id", resp.StatusCode, resp.Header.Get(headerRequestID))
		}
		id := w.header().Get(headerRequestID)
		if !strings.HasPrefix(id, "trace-42-") || len(id) != len("trace-42-")+16 || seen[id] {
			t.Fatalf("the worker got id %q (seen before: %v), want trace-42- and 16 fresh hex digits", id, seen[id])
		}
		seen[id] = true
	}
	resp := g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerEngineRequestID: "victim"})
	if got, want := w.header().Get(headerRequestID), resp.Header.Get(headerRequestID); got != want || got == "victim" || got == "" {
		t.Fatalf("no client id: the worker got %q, want the fresh id %q", got, want)
	}
	h := http.Header{headerRequestID: {"abc"}, headerEngineRequestID: {"abc-0123456789abcdef"}}
	if first, retry := engineRequestID(h, 1)[0], engineRequestID(h, 2)[0]; first != "abc-0123456789abcdef" || retry != "abc-0123456789abcdef-2" {
		t.Fatalf("attempts 1 and 2: %q and %q", first, retry)
	}
}
