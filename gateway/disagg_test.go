package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// fakePrefill is a prefill worker of vLLM's KV-connector flow over real HTTP: it answers a
// whole answer of one token with kv_transfer_params naming itself, and records what it got.
type fakePrefill struct {
	srv      *httptest.Server
	name     string
	status   int // answer this status when non-zero
	noParams bool
	hold     chan struct{} // when set, requests wait for it or their client
	delay    time.Duration // each answer's time
	started  atomic.Int64
	gone     atomic.Int64 // requests whose client went away while held
	requests atomic.Int64

	mu       sync.Mutex
	lastBody map[string]any
}

func newFakePrefill(t *testing.T, name string, mutate func(*fakePrefill)) *fakePrefill {
	t.Helper()
	p := &fakePrefill{name: name}
	if mutate != nil {
		mutate(p)
	}
	p.srv = httptest.NewServer(p)
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePrefill) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.WriteHeader(http.StatusOK)
		return
	}
	p.requests.Add(1)
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	p.mu.Lock()
	p.lastBody = body
	p.mu.Unlock()
	if p.delay > 0 {
		time.Sleep(p.delay)
	}
	if p.hold != nil {
		p.started.Add(1)
		select {
		case <-p.hold:
		case <-r.Context().Done():
			p.gone.Add(1)
			return
		}
	}
	if p.status != 0 {
		http.Error(rw, `{"error":{"message":"injected","type":"BadRequestError"}}`, p.status)
		return
	}
	params := fmt.Sprintf(`,"kv_transfer_params":{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[1,2],"remote_engine_id":%q,"remote_request_id":"r-%d","remote_host":"10.0.0.1","remote_port":5600}`, p.name, p.requests.Load())
	if p.noParams {
		params = ""
	}
	rw.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(rw, `{"id":"p","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"x"}}]%s,"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,"prompt_tokens_details":{"cached_tokens":1}}}`, params)
}

func (p *fakePrefill) body() map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastBody
}

func (p *fakePrefill) spec(id string) routing.WorkerSpec {
	return routing.WorkerSpec{ID: id, URL: p.srv.URL, Models: []string{testModel}, Role: routing.RolePrefill}
}

// decodeSpec is w as a decode worker.
func decodeSpec(w *fakeWorker, id string) routing.WorkerSpec {
	s := w.spec(id)
	s.Role = routing.RoleDecode
	return s
}

// startDisaggregated starts a gateway over specs with round-robin stages, so tests know the
// order in which workers are tried.
func startDisaggregated(t *testing.T, specs ...routing.WorkerSpec) *testGateway {
	t.Helper()
	return startGatewayOn(t, routing.Config{Workers: specs, Policy: "round_robin",
		Disaggregation: routing.DisaggregationConfig{PrefillPolicy: "round_robin", DecodePolicy: "round_robin"}}, nil, nil)
}

// A call to a disaggregated model goes in two stages: the prefill worker gets the request with
// do_remote_decode, max_tokens 1 and no stream; the decode worker gets it as the client sent it
// with the prefill answer's kv_transfer_params; the client gets the decode worker's answer,
// whose usage counts the prompt once and the cached tokens the prefill worker found.
func TestTwoStagedCall(t *testing.T) {
	pre := newFakePrefill(t, "p1", nil)
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	for _, tc := range []struct {
		name, body string
		stream     bool
	}{
		{"whole", `{"model":"m1","max_tokens":50,"messages":[{"role":"user","content":"hello"}]}`, false},
		{"stream", `{"model":"m1","max_completion_tokens":50,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := g.post(t, "/v1/chat/completions", testKey, tc.body, nil)
			data, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, data)
			}
			if got, gotPre := resp.Header.Get(headerWorker), resp.Header.Get(headerPrefillWorker); got != "d1" || gotPre != "p1" {
				t.Fatalf("served by %q, prefilled by %q; want d1 and p1", got, gotPre)
			}
			pb := pre.body()
			kv, _ := pb["kv_transfer_params"].(map[string]any)
			if kv["do_remote_decode"] != true || pb["max_tokens"] != float64(1) || pb["stream"] != false {
				t.Fatalf("the prefill worker got %v: want kv_transfer_params.do_remote_decode true, max_tokens 1, stream false", pb)
			}
			for _, k := range []string{"stream_options", "max_completion_tokens"} {
				if _, ok := pb[k]; ok {
					t.Errorf("the prefill worker got %s", k)
				}
			}
			db := dec.body()
			dkv, _ := db["kv_transfer_params"].(map[string]any)
			if dkv["remote_engine_id"] != "p1" || dkv["do_remote_prefill"] != true || dkv["remote_host"] != "10.0.0.1" {
				t.Fatalf("the decode worker got kv_transfer_params %v, want the prefill answer's", dkv)
			}
			if got, _ := db["stream"].(bool); got != tc.stream {
				t.Fatalf("the decode worker got stream %v, want %v", db["stream"], tc.stream)
			}
			var u usage
			if tc.stream {
				events := readEvents(t, strings.NewReader(string(data)))
				for _, e := range events {
					if got, ok := parseUsage([]byte(e)); ok {
						u = got
					}
				}
			} else {
				u, _ = parseUsage(data)
			}
			if u.PromptTokens != 5 || u.cachedTokens() != 1 {
				t.Fatalf("usage %+v (cached %d): want prompt 5 once and the prefill's 1 cached, not the decode's 2", u, u.cachedTokens())
			}
		})
	}
	if got := testutil.ToFloat64(g.srv.metrics.tokens.WithLabelValues(testModel, "prompt")); got != 10 {
		t.Errorf("usher_tokens_total prompt: got %v for two calls of 5, want 10", got)
	}
	for _, stage := range []string{"prefill", "decode"} {
		worker := map[string]string{"prefill": "p1", "decode": "d1"}[stage]
		if got := testutil.ToFloat64(g.srv.metrics.stageRequests.WithLabelValues(testModel, stage, worker, "ok")); got != 2 {
			t.Errorf("usher_stage_requests_total{stage=%q}: got %v, want 2", stage, got)
		}
	}
}

// A prefill that fails goes to another prefill worker; the decode takes the params of the one
// that answered.
func TestFailedPrefillGoesToAnotherPrefillWorker(t *testing.T) {
	bad := newFakePrefill(t, "p1", func(p *fakePrefill) { p.status = http.StatusInternalServerError })
	good := newFakePrefill(t, "p2", nil)
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, bad.spec("p1"), good.spec("p2"), decodeSpec(dec, "d1"))
	for range 2 {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerPrefillWorker) != "p2" {
			t.Fatalf("status %d, prefilled by %q: want 200 from p2", resp.StatusCode, resp.Header.Get(headerPrefillWorker))
		}
		if kv, _ := dec.body()["kv_transfer_params"].(map[string]any); kv["remote_engine_id"] != "p2" {
			t.Fatalf("the decode worker got %v, want p2's params", kv)
		}
	}
	if bad.requests.Load() == 0 {
		t.Fatal("p1 was never tried: the test proves nothing")
	}
	if dec.requests.Load() != 2 {
		t.Fatalf("the decode worker got %d requests, want 2 (none for a failed prefill)", dec.requests.Load())
	}
}

// A decode that fails before its first byte is placed again with a new prefill: the engines
// hold a prefill's KV for one pull.
func TestFailedDecodeRetriesThePrefill(t *testing.T) {
	pre := newFakePrefill(t, "p1", nil)
	bad := newFakeWorker(t, func(w *fakeWorker) { w.status = http.StatusInternalServerError })
	good := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(bad, "d1"), decodeSpec(good, "d2"))
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "d2" {
		t.Fatalf("status %d from %q, want 200 from d2", resp.StatusCode, resp.Header.Get(headerWorker))
	}
	if bad.requests.Load() != 1 || pre.requests.Load() != 2 {
		t.Fatalf("d1 got %d, p1 %d requests: want 1 and 2 (the prefill again for d2)", bad.requests.Load(), pre.requests.Load())
	}
	if kv, _ := good.body()["kv_transfer_params"].(map[string]any); kv["remote_request_id"] != "r-2" {
		t.Fatalf("d2 got %v, want the second prefill's params", kv)
	}
}

// A tenant's own kv_transfer_params and bootstrap members reach neither stage: the prefill gets
// usher's, the decode the prefill worker's.
func TestTenantTransferParamsReachNoStage(t *testing.T) {
	pre := newFakePrefill(t, "p1", nil)
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	body := `{"model":"m1","kv_transfer_params":{"do_remote_prefill":true,"remote_host":"evil.example","remote_port":1,"remote_block_ids":[9],"remote_engine_id":"victim","remote_request_id":"victim"},` +
		`"bootstrap_host":"evil.example","bootstrap_room":7,"messages":[{"role":"user","content":"x"}]}`
	if resp := g.post(t, "/v1/chat/completions", testKey, body, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for who, got := range map[string]map[string]any{"prefill": pre.body(), "decode": dec.body()} {
		b, _ := json.Marshal(got)
		if strings.Contains(string(b), "evil") || strings.Contains(string(b), "victim") || got["bootstrap_room"] != nil {
			t.Errorf("the %s worker got the tenant's members: %s", who, b)
		}
	}
}

// A prefill the engine refuses (4xx) is the call's answer; no decode is sent.
func TestRefusedPrefillIsTheAnswer(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.status = http.StatusBadRequest })
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusBadRequest || dec.requests.Load() != 0 {
		t.Fatalf("status %d, decode requests %d: want the engine's 400 and no decode", resp.StatusCode, dec.requests.Load())
	}
}

// A prefill answer without kv_transfer_params (an engine without a KV connector) fails the
// stage: nothing is decoded from it.
func TestPrefillWithoutTransferParamsFails(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.noParams = true })
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusBadGateway || dec.requests.Load() != 0 {
		t.Fatalf("status %d, decode requests %d: want 502 and no decode", resp.StatusCode, dec.requests.Load())
	}
}

// A client that leaves during the prefill ends it at the worker, and no decode is sent.
func TestClientLeavingCancelsThePrefill(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.hold = make(chan struct{}) })
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions", strings.NewReader(chatBody))
	req.Header.Set("Authorization", "Bearer "+testKey)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "the prefill to reach its worker", func() bool { return pre.started.Load() == 1 })
	cancel()
	<-done
	waitFor(t, "the prefill to be cancelled at its worker", func() bool { return pre.gone.Load() == 1 })
	if dec.requests.Load() != 0 {
		t.Fatalf("the decode worker got %d requests after the client left", dec.requests.Load())
	}
}

func TestPrefillBody(t *testing.T) {
	got := string(prefillBody([]byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":9,"n_predict":3,"messages":[]}`)))
	want := `{"model":"m","messages":[],"stream":false,"max_tokens":1,"kv_transfer_params":` + string(prefillTransferParams) + `}`
	if got != want {
		t.Fatalf("got %s\nwant %s", got, want)
	}
}

// A disaggregated model's queue has the decode pool's capacity: a call holds its decode worker
// for its whole answer, its prefill worker only for its prefill.
func TestDisaggregatedCapacityIsTheDecodePools(t *testing.T) {
	w := func(r routing.Role) routing.WorkerStatus {
		return routing.WorkerStatus{State: routing.StateHealthy, Models: []string{"m"}, Role: r, MaxConcurrency: 8, MaxTokensInFlight: 1000}
	}
	workers := []routing.WorkerStatus{w(routing.RolePrefill), w(routing.RoleDecode), w(routing.RoleBoth)}
	if got, _ := capacityOf(workers, "m", true); got != (queue.Capacity{Requests: 16, Tokens: 2000}) {
		t.Fatalf("disaggregated: got %+v, want the decode and both workers' 16 requests and 2000 tokens", got)
	}
	if got, _ := capacityOf(workers, "m", false); got != (queue.Capacity{Requests: 24, Tokens: 3000}) {
		t.Fatalf("not disaggregated: got %+v, want every worker's", got)
	}
}

// SGLang's flow: both workers get the call at once with the prefill worker's bootstrap address
// and one room; a prefill the engine refuses (4xx) is the client's answer and ends the decode
// waiting for its room.
func TestSGLangRefusedPrefillEndsTheDecode(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.status = http.StatusBadRequest })
	dec := newFakeWorker(t, func(w *fakeWorker) { w.hold = make(chan struct{}) })
	spec := pre.spec("p1")
	spec.BootstrapPort = 8999
	g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{spec, decodeSpec(dec, "d1")}, Policy: "round_robin",
		Disaggregation: routing.DisaggregationConfig{Protocol: routing.ProtocolSGLang}}, nil, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d, want the prefill engine's 400", resp.StatusCode)
	}
	pb := pre.body()
	if pb["bootstrap_host"] != "127.0.0.1" || pb["bootstrap_port"] != float64(8999) || pb["bootstrap_room"] == nil || pb["stream"] != false {
		t.Fatalf("the prefill worker got %v: want bootstrap_host 127.0.0.1, bootstrap_port 8999, a room and no stream", pb)
	}
	if dec.started.Load() == 1 {
		if db := dec.body(); db["bootstrap_room"] != pb["bootstrap_room"] || db["stream"] != true {
			t.Fatalf("the decode worker got %v, want the prefill's room and the client's stream", db)
		}
	}
}

// A request every prefill worker answers with a 500 is the request's fault (suspect.go): it is
// tried on each prefill worker once, the client gets a 502, and however often it comes no prefill
// worker's circuit opens; a prefill worker that fails what another serves still opens its own.
func TestPoisonousPrefillOpensNoCircuit(t *testing.T) {
	p1 := newFakePrefill(t, "p1", func(p *fakePrefill) { p.status = http.StatusInternalServerError })
	p2 := newFakePrefill(t, "p2", func(p *fakePrefill) { p.status = http.StatusInternalServerError })
	p3 := newFakePrefill(t, "p3", nil)
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, p1.spec("p1"), p2.spec("p2"), decodeSpec(dec, "d1"))
	const poisonous = 4 * routing.DefaultBreakerFailures
	for i := range poisonous {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i, resp.StatusCode)
		}
	}
	if sent := p1.requests.Load() + p2.requests.Load(); sent != 2*poisonous {
		t.Errorf("the prefill workers were sent %d requests, want %d: each on both", sent, 2*poisonous)
	}
	for _, id := range []string{"p1", "p2"} {
		if st := workerState(t, g, id); st != routing.StateHealthy {
			t.Errorf("prefill worker %s is %s, want healthy", id, st)
		}
	}
	if dec.requests.Load() != 0 {
		t.Errorf("the decode worker got %d requests, want none", dec.requests.Load())
	}
	if err := g.srv.pool.Add(p3.spec("p3")); err != nil {
		t.Fatal(err)
	}
	for i := range 4 * routing.DefaultBreakerFailures {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("with p3 beside them, request %d: %d, want 200", i, resp.StatusCode)
		}
	}
	if st := workerState(t, g, "p1"); st != routing.StateCircuitOpen {
		t.Errorf("p1, failing what p3 serves, is %s, want %s", st, routing.StateCircuitOpen)
	}
}

// A two-staged call's default TTFT objective is drawn from its prefill worker's cost model, where
// its first token is made, not from the decode worker's (a decode that receives its KV, a few
// milliseconds): with a prefill of about 100 ms, calls of about that TTFT meet 3x of it (the
// standard class's default).
func TestTwoStagedCallIsJudgedByItsPrefill(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.delay = 100 * time.Millisecond })
	dec := newFakeWorker(t, nil)
	ledger := &memLedger{}
	g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{pre.spec("p1"), decodeSpec(dec, "d1")}, Policy: "round_robin",
		Disaggregation: routing.DisaggregationConfig{PrefillPolicy: "round_robin", DecodePolicy: "round_robin"}},
		nil, func(d *Deps) { d.Ledger = ledger })
	const calls = 45 // past the cost models' 32 answers
	for i := range calls {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d", i, resp.StatusCode)
		}
	}
	eventuallyTrue(t, func() bool { return len(ledger.all()) == calls })
	met := 0
	for _, r := range ledger.all()[calls-5:] {
		if r.TTFT == tenants.VerdictMet {
			met++
		}
	}
	if met < 4 {
		t.Errorf("%d of the last 5 calls met their TTFT objective, want 4 at least: %+v", met, ledger.all()[calls-5:])
	}
}

// A two-staged call's first token comes after its prefill and the hand-off of its KV to the
// decode worker: once the decode worker has learnt its hand-offs, the call's predicted TTFT
// (ttft_pred_ms) and its default objective hold both, not the prefill's time alone. Each stage
// here takes at least 100 ms (the prefill's answer, the decode's first event), so both
// predictions, learnt from those times, are above 2 x 100 ms, and the standard class's default
// objective (3x the idle prediction) above 3 x 200 ms (a tenth below for the fits' spread).
func TestTwoStagedPredictionHoldsTheHandoff(t *testing.T) {
	const stage = 100 * time.Millisecond
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.delay = stage })
	dec := newFakeWorker(t, func(w *fakeWorker) { w.firstGap = stage })
	logs := &lockedBuffer{}
	g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{pre.spec("p1"), decodeSpec(dec, "d1")}, Policy: "round_robin",
		Disaggregation: routing.DisaggregationConfig{PrefillPolicy: "round_robin", DecodePolicy: "round_robin"}},
		nil, func(d *Deps) { d.Logger = slog.New(slog.NewJSONHandler(logs, nil)) })
	const calls = 36 // past the models' 32 answers
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	for i := range calls {
		resp := g.post(t, "/v1/chat/completions", testKey, body, nil)
		readEvents(t, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("call %d: %d", i, resp.StatusCode)
		}
	}
	var lines []map[string]any
	eventuallyTrue(t, func() bool { lines = logs.requestLines(t); return len(lines) == calls })
	last := lines[calls-1]
	pred, _ := last["ttft_pred_ms"].(float64)
	objective, _ := last["ttft_objective_ms"].(float64)
	if least := 0.9 * 2 * ms(stage); pred < least {
		t.Errorf("ttft_pred_ms %v, want at least %v: the prefill and the hand-off", last["ttft_pred_ms"], least)
	}
	if least := 0.9 * 3 * 2 * ms(stage); objective < least {
		t.Errorf("ttft_objective_ms %v, want at least %v: 3x the prefill and the hand-off", last["ttft_objective_ms"], least)
	}
	if got, _ := last["engine_ttft_ms"].(float64); got < 2*ms(stage) {
		t.Errorf("engine_ttft_ms %v, want the prefill's and the decode's first event, at least %v", last["engine_ttft_ms"], 2*ms(stage))
	}
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// While the prefill worker is prefilling a batch prompt, an interactive call is served whole by
// the decode worker, which prefills it itself: the prefill worker never sees it, the decode
// worker gets it as the client sent it (no kv_transfer_params), and the answer names no prefill
// worker. The batch call still goes in two stages.
func TestInteractiveCallIsServedLocallyBesideABusyPrefill(t *testing.T) {
	pre := newFakePrefill(t, "p1", func(p *fakePrefill) { p.hold = make(chan struct{}) })
	dec := newFakeWorker(t, nil)
	g := startDisaggregated(t, pre.spec("p1"), decodeSpec(dec, "d1"))
	batch := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
	waitFor(t, "the batch prefill to reach its worker", func() bool { return pre.started.Load() == 1 })

	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("interactive: status %d: %s", resp.StatusCode, data)
	}
	if got, gotPre := resp.Header.Get(headerWorker), resp.Header.Get(headerPrefillWorker); got != "d1" || gotPre != "" {
		t.Fatalf("interactive: served by %q, prefilled by %q; want d1 and no prefill worker", got, gotPre)
	}
	if n := pre.requests.Load(); n != 1 {
		t.Fatalf("the prefill worker got %d requests, want the batch call's alone", n)
	}
	if db := dec.body(); db["kv_transfer_params"] != nil || db["max_tokens"] == float64(1) {
		t.Fatalf("the decode worker got %v: want the interactive call as sent, to prefill itself", db)
	}

	close(pre.hold)
	resp = <-batch
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(headerPrefillWorker) != "p1" {
		t.Fatalf("batch: status %d, prefilled by %q: %s; want 200 in two stages", resp.StatusCode, resp.Header.Get(headerPrefillWorker), data)
	}
	if dkv, _ := dec.body()["kv_transfer_params"].(map[string]any); dkv["remote_engine_id"] != "p1" {
		t.Fatalf("batch: the decode worker got kv_transfer_params %v, want the prefill answer's", dkv)
	}
}

// An interactive call of a disaggregated model that finds no room on the decode pool preempts a
// batch call decoding there (its answer not begun), as a whole call would on its worker: the
// batch call goes back to the queue and is served again, prefill included, once; nothing fails.
func TestTwoStagedInteractivePreemptsABatchDecode(t *testing.T) {
	pre := newFakePrefill(t, "p", nil)
	hold := make(chan struct{})
	dw := newFakeWorker(t, func(w *fakeWorker) { w.hold = hold })
	dec := decodeSpec(dw, "d")
	dec.MaxConcurrency = 1
	g := startGatewayOn(t, routing.Config{Workers: []routing.WorkerSpec{pre.spec("p"), dec}, Policy: "round_robin"}, nil,
		func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
	var release sync.Once
	t.Cleanup(func() { release.Do(func() { close(hold) }) }) // a failed test's held calls end too
	batch := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
	waitFor(t, "the decode worker holds the batch call", func() bool { return dw.started.Load() == 1 })
	inter := g.postLater(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	waitFor(t, "the interactive call reaches the decode worker", func() bool { return dw.started.Load() == 2 })
	release.Do(func() { close(hold) })
	if resp := <-inter; resp.StatusCode != http.StatusOK || resp.Header.Get(headerClass) != "interactive" {
		t.Fatalf("interactive: %d in class %q", resp.StatusCode, resp.Header.Get(headerClass))
	}
	if resp := <-batch; resp.StatusCode != http.StatusOK || resp.Header.Get(headerPrefillWorker) != "p" {
		t.Fatalf("preempted batch call: %d, prefilled on %q; want 200 once requeued, in two stages", resp.StatusCode, resp.Header.Get(headerPrefillWorker))
	}
	if got := dw.requests.Load(); got != 3 {
		t.Errorf("the decode worker saw %d requests, want 3 (batch, interactive, batch again)", got)
	}
	if got := pre.requests.Load(); got < 2 {
		t.Errorf("the prefill worker saw %d requests, want the batch call's prompt twice (its KV is pulled once)", got)
	}
	if got := metricValue(t, g.reg, "usher_preempted_total"); got != 1 {
		t.Errorf("usher_preempted_total %v, want 1", got)
	}
}
