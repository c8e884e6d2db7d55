package gateway

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"
	"time"

	"github.com/usherllm/usher/routing"
)

// faultyWorker answers every inference request with answer and counts them; GETs (health,
// metrics, /props) get slots as llama.cpp's server reports them when slots is non-zero.
func faultyWorker(t *testing.T, slots int, answer http.HandlerFunc) (routing.WorkerSpec, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			if r.URL.Path == "/props" && slots > 0 {
				fmt.Fprintf(rw, `{"total_slots":%d}`, slots)
			}
			return
		}
		n.Add(1)
		// Read to the end, as an engine does: only then does net/http watch the connection
		// and cancel r's context when the client goes away.
		_, _ = io.Copy(io.Discard, r.Body)
		answer(rw, r)
	}))
	t.Cleanup(srv.Close)
	return routing.WorkerSpec{URL: srv.URL, Models: []string{testModel}}, &n
}

func withID(spec routing.WorkerSpec, id string) routing.WorkerSpec {
	spec.ID = id
	return spec
}

// workerState is the state of worker id in g's pool.
func workerState(t *testing.T, g *testGateway, id string) routing.WorkerState {
	t.Helper()
	st, err := g.srv.pool.Worker(id)
	if err != nil {
		t.Fatal(err)
	}
	return st.State
}

// A worker's 429 says it is full, not broken: the call goes to another worker, the full one's
// breaker does not count it, and when no worker is left the client gets a 429 with the worker's
// Retry-After (before: the 429 was relayed as it came, without Retry-After, and never tried
// elsewhere).
func TestBusyWorkerSendsTheCallElsewhere(t *testing.T) {
	busy, busyCalls := faultyWorker(t, 0, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Retry-After", "7")
		http.Error(rw, `{"error":{"message":"too many requests"}}`, http.StatusTooManyRequests)
	})
	ok := newFakeWorker(t, nil)
	g := startGatewayOn(t, routing.Config{Policy: "round_robin",
		Workers: []routing.WorkerSpec{withID(busy, "busy"), ok.spec("ok")}}, nil, nil)
	for i := range 2 * routing.DefaultBreakerFailures {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "ok" {
			t.Fatalf("request %d: %d from %q, want 200 from the worker with room", i, resp.StatusCode, resp.Header.Get(headerWorker))
		}
	}
	if busyCalls.Load() == 0 {
		t.Fatal("no request tried the busy worker; the test proves nothing")
	}
	if st := workerState(t, g, "busy"); st != routing.StateHealthy {
		t.Errorf("the busy worker is %s after its 429s, want healthy", st)
	}

	g = startGatewayOn(t, routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{withID(busy, "busy")}}, nil, nil)
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "7" {
		t.Fatalf("only a busy worker: %d with Retry-After %q, want 429 with 7", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := decodeError(t, resp); e.Code != "workers_busy" || e.Type != "rate_limit_error" {
		t.Errorf("error %+v, want rate_limit_error workers_busy", e)
	}
}

// A worker that answers 200 and then closes before any byte reached the client has served
// nothing: the call goes to another worker, whole answers and streams alike (before: the client
// got a 502, or a stream holding only an error event).
func TestWorkerThatClosesBeforeAnyByteIsRetried(t *testing.T) {
	closing, closed := faultyWorker(t, 0, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("Content-Length", "100")
		rw.WriteHeader(http.StatusOK)
		rw.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	})
	ok := newFakeWorker(t, nil)
	g := startGatewayOn(t, routing.Config{Policy: "round_robin",
		Workers: []routing.WorkerSpec{withID(closing, "closing"), ok.spec("ok")}}, nil, nil)
	for _, body := range []string{chatBody, streamBody, chatBody, streamBody} {
		resp := g.post(t, "/v1/chat/completions", testKey, body, nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "ok" {
			t.Fatalf("%s: %d from %q, want 200 from the worker that answers", body, resp.StatusCode, resp.Header.Get(headerWorker))
		}
		if strings.Contains(body, `"stream":true`) {
			if events := readEvents(t, resp.Body); len(events) == 0 || strings.Contains(strings.Join(events, ""), "error") {
				t.Errorf("stream: events %q, want the answering worker's", events)
			}
		}
	}
	if closed.Load() == 0 {
		t.Fatal("no request tried the closing worker; the test proves nothing")
	}
}

// A worker that takes a whole-answer request and never answers is cut off after a bound that
// follows the output the call may cost, not after server.upstream_header_timeout (10 minutes).
func TestSilentWorkerOfAWholeAnswerIsCutOff(t *testing.T) {
	hung, _ := faultyWorker(t, 0, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	g := startGatewayOn(t, routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{withID(hung, "hung")}},
		func(c *Config) { c.UpstreamIdleTimeout = 100 * time.Millisecond; c.MaxAttempts = 1 }, nil)
	done := g.postLater(t, "/v1/chat/completions", testKey, `{"model":"m1","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, nil)
	select {
	case resp := <-done:
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("got %d, want 502", resp.StatusCode)
		}
		if e := decodeError(t, resp); e.Code != "upstream_error" || !strings.Contains(e.Message, "sent nothing") {
			t.Errorf("error %+v, want upstream_error saying the worker sent nothing", e)
		}
	case <-time.After(time.Minute):
		t.Fatal("the call to a silent worker was not cut off within a minute")
	}
}

// What usher cannot assemble from a slot engine's stream is not the worker's failure: an error
// the engine reports inside the stream reaches the client as a 502 and the worker's breaker
// stays closed however often a tenant provokes it.
func TestUnassemblableAnswerIsNotTheWorkersFailure(t *testing.T) {
	slot, _ := faultyWorker(t, 2, func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"error\":{\"message\":\"the prompt is odd\",\"code\":400}}\n\ndata: [DONE]\n\n")
	})
	g := startTierGateway(t, []routing.WorkerSpec{withID(slot, "slot")}, everyClassTier)
	waitForSlotEngine(t, g, "slot")
	for i := range 2 * routing.DefaultBreakerFailures {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "batch"})
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("request %d: %d, want 502", i, resp.StatusCode)
		}
	}
	if st := workerState(t, g, "slot"); st != routing.StateHealthy {
		t.Errorf("the worker is %s, want healthy: an answer usher could not assemble opened its breaker", st)
	}
}

// readUpTo reads a whole answer, or one byte more than the bound, whatever its first buffer.
func TestReadUpTo(t *testing.T) {
	long := strings.Repeat("x", 5000)
	for _, tc := range []struct {
		name        string
		in          string
		first, max  int64
		want        string
		wantFailure bool
	}{
		{"fits its first buffer", "hello", 512, 100, "hello", false},
		{"grows", long, 1, 10000, long, false},
		{"at the bound", long[:100], 16, 100, long[:100], false},
		{"one byte over the bound", long[:101], 16, 100, long[:101], false},
		{"far over the bound", long, 16, 100, long[:101], false},
		{"empty", "", 1, 100, "", false},
		{"broken off", "partial", 512, 100, "partial", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r io.Reader = iotest.OneByteReader(strings.NewReader(tc.in))
			if tc.wantFailure {
				r = io.MultiReader(strings.NewReader(tc.in), iotest.ErrReader(io.ErrUnexpectedEOF))
			}
			got, err := readUpTo(r, tc.first, tc.max)
			if (err != nil) != tc.wantFailure || string(got) != tc.want {
				t.Fatalf("got %d bytes, %v; want %d bytes, failure %v", len(got), err, len(tc.want), tc.wantFailure)
			}
		})
	}
}
