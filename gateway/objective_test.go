package gateway

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
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

// testClock is a clock that moves only when told.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// slowEngine answers three output tokens after moving the gateway's clock by delay: the time
// the engine took to its first token, as the gateway measures it. Nothing else moves the clock,
// so the tokens after the first take no time. status, when set, is answered instead.
type slowEngine struct {
	clock  *testClock
	delay  atomic.Int64
	status atomic.Int64
}

func (e *slowEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return
	}
	body, _ := io.ReadAll(r.Body)
	e.clock.advance(time.Duration(e.delay.Load()))
	if s := e.status.Load(); s != 0 {
		http.Error(w, `{"error":{"message":"injected"}}`, int(s))
		return
	}
	usage := `{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}`
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a b c"}}],"usage":%s}`, usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 3 {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
}

// slowEngines starts a slowEngine on clock for each delay, worker "w0", "w1", ... of testModel.
func slowEngines(t *testing.T, clock *testClock, delays ...time.Duration) ([]routing.WorkerSpec, []*slowEngine) {
	t.Helper()
	var specs []routing.WorkerSpec
	var engines []*slowEngine
	for i, d := range delays {
		e := &slowEngine{clock: clock}
		e.delay.Store(int64(d))
		srv := httptest.NewServer(e)
		t.Cleanup(srv.Close)
		specs = append(specs, routing.WorkerSpec{ID: fmt.Sprint("w", i), URL: srv.URL, Models: []string{testModel}})
		engines = append(engines, e)
	}
	return specs, engines
}

// syncBuffer is a log sink safe for the handler's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Each answered request is judged against its tier's objective for its class, tightened (never
// loosened) by its headers: TTFT as the client saw it, TPOT over the tokens after the first; a
// whole answer against TTFT + TPOT x (tokens - 1); a worker's failure is a miss. The verdicts
// reach the ledger, the metrics and the access log.
func TestObjectivesJudgeEveryAnswer(t *testing.T) {
	pro := &tenants.Tier{Name: "pro", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassInteractive,
		Weight: 1, Models: []string{"*"},
		Objectives: tenants.ClassObjectives{Interactive: tenants.Objective{TTFT: 500 * time.Millisecond, TPOT: 100 * time.Millisecond, Percentile: 99}}}
	clock := &testClock{now: time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)}
	engine := &slowEngine{clock: clock}
	srv := httptest.NewServer(engine)
	t.Cleanup(srv.Close)
	ledger, logs := &memLedger{}, &syncBuffer{}
	g := startGatewayWith(t, []routing.WorkerSpec{{ID: "w", URL: srv.URL, Models: []string{testModel}}}, nil, func(d *Deps) {
		d.Auth, d.Ledger, d.Now = tierAuth{pro}, ledger, clock.Now
		d.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	met, missed := tenants.VerdictMet, tenants.VerdictMissed
	tests := []struct {
		name       string
		body       string
		delay      time.Duration
		status     int
		hdr        map[string]string
		ttft, tpot tenants.Verdict
		ttftMs     int64 // the objective in the access log
	}{
		{"stream in time", streamBody, 400 * time.Millisecond, 0, nil, met, met, 500},
		{"stream late", streamBody, 600 * time.Millisecond, 0, nil, missed, met, 500},
		{"header tightens", streamBody, 300 * time.Millisecond, 0, map[string]string{headerTTFTObjectiveMs: "200"}, missed, met, 200},
		{"header cannot loosen", streamBody, 600 * time.Millisecond, 0, map[string]string{headerTTFTObjectiveMs: "5000"}, missed, met, 500},
		{"huge header is the tier's", streamBody, 400 * time.Millisecond, 0, map[string]string{headerTTFTObjectiveMs: "99999999999999999999999"}, met, met, 500},
		{"whole within ttft + 2 tpot", chatBody, 650 * time.Millisecond, 0, nil, met, met, 500},
		{"whole late", chatBody, 750 * time.Millisecond, 0, nil, missed, missed, 500},
		{"whole, tpot tightened", chatBody, 650 * time.Millisecond, 0, map[string]string{headerTPOTObjectiveMs: "50"}, missed, missed, 500},
		{"worker failed", streamBody, 0, http.StatusInternalServerError, nil, missed, missed, 500},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine.delay.Store(int64(tt.delay))
			engine.status.Store(int64(tt.status))
			resp := g.post(t, "/v1/chat/completions", testKey, tt.body, tt.hdr)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			var got []tenants.UsageRecord
			eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == i+1 })
			if r := got[i]; r.TTFT != tt.ttft || r.TPOT != tt.tpot {
				t.Errorf("ledger: got ttft %v tpot %v, want %v %v", r.TTFT, r.TPOT, tt.ttft, tt.tpot)
			}
			eventuallyTrue(t, func() bool { return strings.Count(logs.String(), "msg=request") == i+1 })
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			want := fmt.Sprintf("ttft_objective_ms=%d tpot_objective_ms=", tt.ttftMs)
			if last := lines[len(lines)-1]; !strings.Contains(last, want) || !strings.Contains(last, "ttft_verdict="+tt.ttft.String()+" tpot_verdict="+tt.tpot.String()) {
				t.Errorf("access log: got %q, want %q and the verdicts %v, %v", last, want, tt.ttft, tt.tpot)
			}
		})
	}
	a := g.srv.metrics.attainment
	for _, c := range []struct {
		name   string
		got    float64
		wanted float64
	}{
		{"ttft met", testutil.ToFloat64(a.ttft.WithLabelValues("pro", "t1", "interactive", testModel, "met")), 3},
		{"ttft missed", testutil.ToFloat64(a.ttft.WithLabelValues("pro", "t1", "interactive", testModel, "missed")), 6},
		{"tpot met", testutil.ToFloat64(a.tpot.WithLabelValues("pro", "t1", "interactive", testModel, "met")), 6},
		{"tpot missed", testutil.ToFloat64(a.tpot.WithLabelValues("pro", "t1", "interactive", testModel, "missed")), 3},
		{"requests met (goodput)", testutil.ToFloat64(a.requests.WithLabelValues("pro", "t1", "interactive", testModel, "met")), 3},
		{"requests missed", testutil.ToFloat64(a.requests.WithLabelValues("pro", "t1", "interactive", testModel, "missed")), 6},
	} {
		if c.got != c.wanted {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.wanted)
		}
	}
	g.srv.ForgetTenant("t1")
	if n := testutil.CollectAndCount(a.requests); n != 0 {
		t.Errorf("after the tenant is forgotten: got %d series, want none", n)
	}
	// A tenant of the same id counts from zero in series of its own, not in the forgotten ones.
	engine.delay.Store(0)
	engine.status.Store(0)
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	eventuallyTrue(t, func() bool { return testutil.CollectAndCount(a.requests) == 1 })
	if got := testutil.ToFloat64(a.requests.WithLabelValues("pro", "t1", "interactive", testModel, "met")); got != 1 {
		t.Errorf("after the tenant came back: got %v requests met, want 1", got)
	}
}

// The default objective is the model's, not the serving worker's: on two workers whose cost
// models learnt idle times of 50 and 200 ms, an interactive answer of 180 ms from the faster
// one meets it (about twice the typical 125 ms), where twice the faster worker's own 50 ms
// would have missed, and both workers' answers are held to the same objective.
func TestDefaultObjectiveIsTheModels(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)}
	specs, engines := slowEngines(t, clock, 200*time.Millisecond, 50*time.Millisecond)
	slow, fast := engines[0], engines[1]
	ledger, logs := &memLedger{}, &syncBuffer{}
	g := startGatewayWith(t, specs, nil, func(d *Deps) {
		d.Auth, d.Ledger, d.Now = tierAuth{opsTier}, ledger, clock.Now
		d.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	const warm = 80
	for range warm {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	slow.delay.Store(int64(180 * time.Millisecond))
	fast.delay.Store(int64(180 * time.Millisecond))
	objectives := map[string]int{}
	for i, w := range []string{"w1", "w0"} {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, map[string]string{headerPriority: "interactive", headerTarget: w})
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get(headerWorker); got != w {
			t.Fatalf("served by %q, want %s", got, w)
		}
		var got []tenants.UsageRecord
		eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == warm+i+1 })
		if v := got[warm+i].TTFT; v != tenants.VerdictMet {
			t.Errorf("%s: 180 ms to the first token %v, want met", w, v)
		}
		eventuallyTrue(t, func() bool { return strings.Count(logs.String(), "msg=request") == warm+i+1 })
		objectives[w] = lastLogInt(t, logs.String(), "ttft_objective_ms")
	}
	// The first answer taught the models a little before the second: the same within 5%.
	if a, b := objectives["w0"], objectives["w1"]; 20*(max(a, b)-min(a, b)) > max(a, b) {
		t.Errorf("objectives %v ms, want the same on both workers", objectives)
	}
}

// A bad objective header is the client's 400, in OpenAI's shape, and counts in no attainment.
func TestBadObjectiveHeaders(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	for name, hdr := range map[string]map[string]string{
		"ttft not a number": {headerTTFTObjectiveMs: "soon"},
		"ttft zero":         {headerTTFTObjectiveMs: "0"},
		"ttft negative":     {headerTTFTObjectiveMs: "-5"},
		"ttft fraction":     {headerTTFTObjectiveMs: "1.5"},
		"tpot not a number": {headerTPOTObjectiveMs: "fast"},
	} {
		t.Run(name, func(t *testing.T) {
			resp := g.post(t, "/v1/chat/completions", testKey, chatBody, hdr)
			got := decodeAnswer(t, resp)
			e, _ := got["error"].(map[string]any)
			if resp.StatusCode != http.StatusBadRequest || e["type"] != "invalid_request_error" || !strings.Contains(fmt.Sprint(e["message"]), "-Objective-Ms") {
				t.Fatalf("got %d %v, want 400 invalid_request_error naming the header", resp.StatusCode, got)
			}
		})
	}
	if n := testutil.CollectAndCount(g.srv.metrics.attainment.requests); n != 0 {
		t.Errorf("got %d attainment series, want none: a client's error is not judged", n)
	}
	if w.requests.Load() != 0 {
		t.Errorf("the worker got %d requests, want none", w.requests.Load())
	}
}

// With no objective configured, the defaults are relative to the worker's idle prediction: until
// the cost model can predict, a request is unjudged, unless its client stated an objective.
func TestDefaultObjectiveWithoutPredictionIsUnjudged(t *testing.T) {
	w := newFakeWorker(t, nil)
	ledger := &memLedger{}
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) { d.Ledger = ledger })
	for _, hdr := range []map[string]string{nil, {headerTTFTObjectiveMs: "3600000"}} {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, hdr)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var got []tenants.UsageRecord
	eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == 2 })
	if got[0].TTFT != tenants.VerdictUnjudged || got[0].TPOT != tenants.VerdictUnjudged {
		t.Errorf("no objective, no prediction: got %v %v, want unjudged", got[0].TTFT, got[0].TPOT)
	}
	if got[1].TTFT != tenants.VerdictMet || got[1].TPOT != tenants.VerdictUnjudged {
		t.Errorf("the client's own TTFT objective of an hour: got %v %v, want ttft met, tpot unjudged", got[1].TTFT, got[1].TPOT)
	}
	a := g.srv.metrics.attainment
	if n := testutil.ToFloat64(a.requests.WithLabelValues("fallback", "t1", "standard", testModel, "unjudged")); n != 1 {
		t.Errorf("unjudged requests: got %v, want 1", n)
	}
}

// The defaults: for interactive TTFT 2x the idle prediction plus one idle step (its TPOT), TPOT 3x
// the step; for standard 3x and 4x; none for batch; never below the floors; a tier's own objective wins; a client's
// header tightens either.
func TestDefaultObjectives(t *testing.T) {
	tier := &tenants.Tier{Name: "t", Objectives: tenants.ClassObjectives{Standard: tenants.Objective{TTFT: 2 * time.Second}}}
	p := routing.Prediction{TTFT: 400 * time.Millisecond, TPOT: 40 * time.Millisecond}
	tiny := routing.Prediction{TTFT: time.Millisecond, TPOT: 100 * time.Microsecond}
	tests := []struct {
		name    string
		class   queue.Class
		p       routing.Prediction
		ok      bool
		askTTFT time.Duration
		want    objective
	}{
		{"interactive", queue.Interactive, p, true, 0, objective{840 * time.Millisecond, 120 * time.Millisecond}},
		{"interactive, tiny prediction", queue.Interactive, tiny, true, 0, objective{routing.MinTTFTObjective, minTPOTObjective}},
		{"interactive, no prediction", queue.Interactive, p, false, 0, objective{}},
		// Before the workers learn their steps, none: the floor would judge every answer missed.
		{"interactive, steps not learnt", queue.Interactive, routing.Prediction{TTFT: p.TTFT}, true, 0, objective{800 * time.Millisecond, 0}},
		{"standard, steps not learnt: the tier's ttft", queue.Standard, routing.Prediction{TTFT: p.TTFT}, true, 0, objective{2 * time.Second, 0}},
		{"interactive, tightened", queue.Interactive, p, true, 100 * time.Millisecond, objective{100 * time.Millisecond, 120 * time.Millisecond}},
		{"interactive, not loosened", queue.Interactive, p, true, time.Hour, objective{840 * time.Millisecond, 120 * time.Millisecond}},
		{"standard: the tier's ttft, 4x tpot", queue.Standard, p, true, 0, objective{2 * time.Second, 160 * time.Millisecond}},
		{"standard, no prediction: the tier's", queue.Standard, p, false, 0, objective{2 * time.Second, 0}},
		{"batch: none", queue.Batch, p, true, 0, objective{}},
		{"batch: the client's", queue.Batch, p, true, time.Second, objective{time.Second, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := &call{tier: tier, class: tt.class, askedTTFT: tt.askTTFT}
			if got := cl.objectiveGiven(tt.p, tt.ok); got != tt.want {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// judge's rules for what the client saw: TPOT over the tokens after the first, a client that
// left judged on what it saw, a client's error not judged, usher's failure missed.
func TestJudge(t *testing.T) {
	start := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	tier := &tenants.Tier{Name: "t", Objectives: tenants.ClassObjectives{Interactive: tenants.Objective{TTFT: time.Second, TPOT: 100 * time.Millisecond}}}
	s := &Server{}
	tests := []struct {
		name         string
		stream       bool
		ttft         time.Duration
		tokens       int
		end          time.Duration // after start
		err          error
		judged       bool
		ttftV, tpotV tenants.Verdict
	}{
		{"tpot within", true, 500 * time.Millisecond, 11, 1500 * time.Millisecond, nil, true, tenants.VerdictMet, tenants.VerdictMet},
		{"tpot over", true, 500 * time.Millisecond, 11, 1600 * time.Millisecond, nil, true, tenants.VerdictMet, tenants.VerdictMissed},
		{"one token: no tpot", true, 500 * time.Millisecond, 1, 500 * time.Millisecond, nil, true, tenants.VerdictMet, tenants.VerdictUnjudged},
		{"left after the first byte", true, 500 * time.Millisecond, 3, time.Hour, errClientGone, true, tenants.VerdictMet, tenants.VerdictUnjudged},
		{"left before, in time", true, 0, 0, 500 * time.Millisecond, errClientGone, true, tenants.VerdictUnjudged, tenants.VerdictUnjudged},
		{"left before, already late", true, 0, 0, 2 * time.Second, errClientGone, true, tenants.VerdictMissed, tenants.VerdictUnjudged},
		{"deadline passed in the queue", true, 0, 0, time.Minute, queue.ErrDeadlineExceeded, true, tenants.VerdictMissed, tenants.VerdictMissed},
		{"no worker", false, 0, 0, time.Second, routing.ErrNoWorker, true, tenants.VerdictMissed, tenants.VerdictMissed},
		{"rate limited: the client's", true, 0, 0, 0, &tenants.LimitError{Limit: tenants.LimitTokens}, false, tenants.VerdictUnjudged, tenants.VerdictUnjudged},
		{"queue full: a refusal", true, 0, 0, 0, queue.ErrQueueFull, false, tenants.VerdictUnjudged, tenants.VerdictUnjudged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := &call{start: start, tier: tier, class: queue.Interactive, classed: true, stream: tt.stream, ttft: tt.ttft,
				usage: usage{CompletionTokens: tt.tokens}}
			v := s.judge(cl, tt.err, start.Add(tt.end))
			if v.judged != tt.judged || v.ttft != tt.ttftV || v.tpot != tt.tpotV {
				t.Errorf("got judged %v ttft %v tpot %v, want %v %v %v", v.judged, v.ttft, v.tpot, tt.judged, tt.ttftV, tt.tpotV)
			}
		})
	}
}

// countingEngine counts the requests that reach an engine.
type countingEngine struct {
	http.Handler
	posts atomic.Int64
}

func (e *countingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		e.posts.Add(1)
	}
	e.Handler.ServeHTTP(w, r)
}

// A client that asked to be refused rather than served late (X-Usher-Objective-Miss: reject) is
// told at once, 429 objective_unreachable with a Retry-After, when the worker's cost model
// predicts a first token past its objective; the engine never sees the request. Without the
// header the same request is served, late, and counted as missed; within reach, it is served.
func TestObjectiveUnreachableRefusedWhenAsked(t *testing.T) {
	pro := &tenants.Tier{Name: "pro", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassInteractive,
		Weight: 1, Models: []string{"*"},
		Objectives: tenants.ClassObjectives{Interactive: tenants.Objective{TTFT: time.Second, Percentile: 99}}}
	// The queue keeps the real clock, and a deadline is set by the gateway's: this one starts at
	// the real time and only moves ahead of it, so a deadline it sets is never in the queue's past.
	clock := &testClock{now: time.Now()}
	slow := &slowEngine{clock: clock}
	slow.delay.Store(int64(300 * time.Millisecond))
	engine := &countingEngine{Handler: slow}
	srv := httptest.NewServer(engine)
	t.Cleanup(srv.Close)
	ledger := &memLedger{}
	g := startGatewayWith(t, []routing.WorkerSpec{{ID: "w", URL: srv.URL, Models: []string{testModel}}}, nil, func(d *Deps) {
		d.Auth, d.Ledger, d.Now = tierAuth{pro}, ledger, clock.Now
	})
	send := func(hdr map[string]string) *http.Response {
		t.Helper()
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, hdr)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	// Until the worker's cost model has learnt, nobody can tell: a request that asked is served.
	if resp := send(map[string]string{headerObjectiveMiss: "reject", headerTTFTObjectiveMs: "1"}); resp.StatusCode != http.StatusOK {
		t.Fatalf("before the model has learnt: got %d, want 200", resp.StatusCode)
	}
	for range 40 {
		if resp := send(nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("teaching the model: got %d", resp.StatusCode)
		}
	}
	eventuallyTrue(t, func() bool { return len(ledger.all()) == 41 })

	tests := []struct {
		name     string
		hdr      map[string]string
		status   int
		verdict  tenants.Verdict // of a served request
		answered bool            // the engine saw it
	}{
		{"within reach", map[string]string{headerObjectiveMiss: "reject"}, http.StatusOK, tenants.VerdictMet, true},
		{"out of reach, asked to be told", map[string]string{headerObjectiveMiss: "REJECT", headerTTFTObjectiveMs: "200"}, http.StatusTooManyRequests, 0, false},
		{"out of reach, served late", map[string]string{headerTTFTObjectiveMs: "200"}, http.StatusOK, tenants.VerdictMissed, true},
		{"out of reach, serve said", map[string]string{headerObjectiveMiss: "serve", headerTTFTObjectiveMs: "200"}, http.StatusOK, tenants.VerdictMissed, true},
		{"bad value", map[string]string{headerObjectiveMiss: "sometimes"}, http.StatusBadRequest, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			records, posts := len(ledger.all()), engine.posts.Load()
			resp := g.post(t, "/v1/chat/completions", testKey, streamBody, tt.hdr)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("got %d %s, want %d", resp.StatusCode, body, tt.status)
			}
			if got := engine.posts.Load() - posts; got != map[bool]int64{true: 1}[tt.answered] {
				t.Errorf("the engine saw %d requests, want %v", got, tt.answered)
			}
			switch tt.status {
			case http.StatusTooManyRequests:
				if !strings.Contains(string(body), `"code":"objective_unreachable"`) || resp.Header.Get("Retry-After") == "" {
					t.Errorf("got %s with Retry-After %q, want objective_unreachable and a Retry-After", body, resp.Header.Get("Retry-After"))
				}
			case http.StatusBadRequest:
				if !strings.Contains(string(body), headerObjectiveMiss) {
					t.Errorf("got %s, want the header named", body)
				}
			default:
				var got []tenants.UsageRecord
				eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == records+1 })
				if v := got[records].TTFT; v != tt.verdict {
					t.Errorf("ttft verdict: got %v, want %v", v, tt.verdict)
				}
			}
		})
	}
}

// A call whose queue deadline is its objective's slack leaves the queue refused as
// objective_unreachable (429, Retry-After), whether the queue saw it could not make it or its
// wait ran out; any other call's queue errors are untouched.
func TestObjectiveMissedInTheQueue(t *testing.T) {
	unreachable := &queue.Rejection{Reason: queue.DeadlineUnreachable, RetryAfter: 3 * time.Second}
	tests := []struct {
		name       string
		held       bool
		err        error
		code       string
		retry      time.Duration
		retryLeast time.Duration
	}{
		{"unreachable, held to the objective", true, unreachable, "objective_unreachable", 3 * time.Second, 0},
		{"wait ran out, held to the objective", true, queue.ErrDeadlineExceeded, "objective_unreachable", 0, minObjectiveRetry},
		{"queue full, held to the objective", true, &queue.Rejection{Reason: queue.QueueFull, RetryAfter: time.Second}, "queue_full", time.Second, 0},
		{"unreachable, the client's deadline", false, unreachable, "deadline_unreachable", 3 * time.Second, 0},
		{"wait ran out, the client's deadline", false, queue.ErrDeadlineExceeded, "deadline_exceeded", 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := &call{rejectMiss: tt.held, objectiveDeadline: tt.held}
			got := ErrorFor(cl.objectiveMissed(tt.err))
			if got.Code != tt.code || tt.retry > 0 && got.RetryAfter != tt.retry || got.RetryAfter < tt.retryLeast {
				t.Errorf("got %s retry %v, want %s retry %v (at least %v)", got.Code, got.RetryAfter, tt.code, tt.retry, tt.retryLeast)
			}
		})
	}
}

// A call's due (queue.Request.Due) is the last moment its dispatch meets its TTFT objective:
// its start plus its objective (the model's: relative to the median of the workers' idle
// predictions for its prompt) less the least idle prediction of a worker; none before any worker
// can predict, and none for a class without an objective (batch by default).
func TestDueIsTheLastDispatchThatMeetsTheObjective(t *testing.T) {
	clock := &testClock{now: time.Now()}
	specs, _ := slowEngines(t, clock, 40*time.Millisecond, 10*time.Millisecond)
	g := startGatewayWith(t, specs, nil, func(d *Deps) { d.Auth = tierAuth{everyClassTier}; d.Now = clock.Now })
	cl := &call{model: testModel, promptTokens: 5, tier: everyClassTier, class: queue.Standard, start: clock.Now()}
	if due := g.srv.due(cl); !due.IsZero() {
		t.Fatalf("before any worker can predict: due %v, want none", due)
	}
	for range 80 {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	var idle []routing.Prediction
	fastest := time.Duration(math.MaxInt64)
	for wp := range g.srv.pool.Predictions(testModel, 5, 0) {
		idle = append(idle, wp.Idle)
		fastest = min(fastest, wp.Idle.TTFT)
	}
	if len(idle) != 2 {
		t.Fatalf("%d workers predict after 80 answers, want 2", len(idle))
	}
	// The objective is the model's (the mean of the two idle predictions, the median of two);
	// the worker that leaves the most is the one fastest idle.
	want := routing.TTFTObjective(routing.TypicalPrediction(idle), standardObjectiveFactor, tenants.MaxObjectiveTTFT) - fastest
	cl.start = clock.Now().Add(-30 * time.Millisecond) // it has waited 30 ms already
	if due, wantDue := g.srv.due(cl), cl.start.Add(want); !due.Equal(wantDue) {
		t.Fatalf("due %v after its start, want %v", due.Sub(cl.start), want)
	}
	cl.class = queue.Batch
	if due := g.srv.due(cl); !due.IsZero() {
		t.Fatalf("batch: due %v, want none", due)
	}
}

// The size of the pieces lower-class prompts go in follows the interactive TTFT verdicts a piece
// may have made: a miss placed behind a lower-class prefill on its worker, with little wait in
// usher's queue, shrinks it; a miss with no lower-class prefill there (an answer late at an idle
// engine, end to end), one that waited in usher's queue for a quarter of its objective or more,
// one whose client tightened its own objective, a lower-class miss and a call never placed leave
// it as it was.
func TestPieceLearnsFromMissesBehindLowerPrefill(t *testing.T) {
	pro := &tenants.Tier{Name: "pro", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassInteractive,
		Weight: 1, Models: []string{"*"},
		Objectives: tenants.ClassObjectives{Interactive: tenants.Objective{TTFT: 500 * time.Millisecond, Percentile: 99}}}
	clock := &testClock{now: time.Date(2026, 12, 7, 15, 0, 0, 0, time.UTC)}
	specs, engines := slowEngines(t, clock, 100*time.Millisecond)
	g := startGatewayWith(t, specs, nil, func(d *Deps) { d.Auth, d.Now = tierAuth{pro}, clock.Now })
	piece := func() float64 { return metricValue(t, g.reg, "usher_routing_prefill_piece_tokens") }
	send := func() {
		t.Helper()
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send() // in time: the pool has seen an interactive prompt, its piece is the slack
	eventuallyTrue(t, func() bool { return piece() > 0 })
	whole := piece()
	engines[0].delay.Store(int64(600 * time.Millisecond))
	send() // late at an engine with nothing else in prefill (judged before its last bytes)
	if got := piece(); got != whole {
		t.Fatalf("after a miss at an engine prefilling nothing else: piece %v, want %v", got, whole)
	}

	judged := func(class queue.Class, worker string, behind bool, queued time.Duration, v tenants.Verdict) {
		g.srv.teachPiece(&call{class: class, tier: pro, worker: worker, behindLower: behind, queued: queued},
			verdicts{judged: true, objective: objective{ttft: 500 * time.Millisecond}, ttft: v})
	}
	// A hostile tenant tightens its own objective to 1 ms so that every request of its misses.
	for range 20 {
		g.srv.teachPiece(&call{class: queue.Interactive, tier: pro, worker: "w0", behindLower: true, askedTTFT: time.Millisecond},
			verdicts{judged: true, objective: objective{ttft: time.Millisecond}, ttft: tenants.VerdictMissed})
	}
	judged(queue.Interactive, "w0", true, 125*time.Millisecond, tenants.VerdictMissed)
	judged(queue.Standard, "w0", true, 0, tenants.VerdictMissed)
	judged(queue.Interactive, "", true, 0, tenants.VerdictMissed)
	judged(queue.Interactive, "w0", true, 0, tenants.VerdictUnjudged)
	if got := piece(); got != whole {
		t.Fatalf("after misses no piece made: piece %v, want %v", got, whole)
	}
	judged(queue.Interactive, "w0", true, 0, tenants.VerdictMissed)
	if got := piece(); got >= whole {
		t.Errorf("after a miss behind a lower-class prefill: piece %v, want less than %v", got, whole)
	}
}

// lastLogInt is the integer value of key in the last line of a text log (key=value).
func lastLogInt(t *testing.T, log, key string) int {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(log), "\n")
	last := lines[len(lines)-1]
	at := strings.Index(last, key+"=")
	if at < 0 {
		t.Fatalf("no %s in %q", key, last)
	}
	v, err := strconv.Atoi(strings.TrimPrefix(strings.Fields(last[at:])[0], key+"="))
	if err != nil {
		t.Fatalf("%s in %q: %v", key, last, err)
	}
	return v
}
