package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/usherllm/usher/routing"
)

// pickyWorker answers a chat with a whole answer, but 500 (as SGLang does on input it fails to
// validate) to a request whose body holds "poison", or to every request when broken; it counts
// the inference requests it was sent.
func pickyWorker(t *testing.T, id string, broken bool) (routing.WorkerSpec, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		n.Add(1)
		body, _ := io.ReadAll(r.Body)
		if broken || bytes.Contains(body, []byte("poison")) {
			rw.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(rw, `{"object":"error","message":"Internal server error: TypeError","type":"InternalServerError","code":500}`)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprint(rw, `{"id":"c","object":"chat.completion","model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	}))
	t.Cleanup(srv.Close)
	return routing.WorkerSpec{ID: id, URL: srv.URL, Models: []string{testModel}}, &n
}

// A request every engine answers with a 500 is the request's fault: however often a tenant sends
// it, no worker's circuit opens, each copy is tried on server.max_attempts workers (3), and the
// client gets a 502; the others' requests are served throughout.
func TestPoisonousRequestOpensNoCircuit(t *testing.T) {
	a, aSent := pickyWorker(t, "a", false)
	b, bSent := pickyWorker(t, "b", false)
	c, cSent := pickyWorker(t, "c", false)
	g := startGateway(t, []routing.WorkerSpec{a, b, c}, nil)
	const poisonous = 4 * routing.DefaultBreakerFailures
	for i := range poisonous {
		resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","messages":[{"role":"user","content":"poison"}]}`, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("poisonous request %d: %d, want 502", i, resp.StatusCode)
		}
	}
	if sent := aSent.Load() + bSent.Load() + cSent.Load(); sent != 3*poisonous {
		t.Errorf("the workers were sent %d requests, want %d: each poisonous one on each worker once", sent, 3*poisonous)
	}
	for _, id := range []string{"a", "b", "c"} {
		if st := workerState(t, g, id); st != routing.StateHealthy {
			t.Errorf("worker %s is %s, want healthy: a tenant's request opened its circuit", id, st)
		}
	}
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a request beside them: %d, want 200", resp.StatusCode)
	}
}

// A worker whose engine answers every request with a 500 while the others serve them still
// opens its circuit: each of its errors is confirmed by another worker serving the request.
func TestBrokenWorkerStillOpensItsCircuit(t *testing.T) {
	bad, badSent := pickyWorker(t, "bad", true)
	good, _ := pickyWorker(t, "good", false)
	g := startGateway(t, []routing.WorkerSpec{bad, good}, nil)
	for i := range 4 * routing.DefaultBreakerFailures {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d, want 200 from the good worker", i, resp.StatusCode)
		}
	}
	if st := workerState(t, g, "bad"); st != routing.StateCircuitOpen {
		t.Errorf("the broken worker is %s, want %s", st, routing.StateCircuitOpen)
	}
	if n := badSent.Load(); n > routing.DefaultBreakerFailures {
		t.Errorf("the broken worker was sent %d requests, want at most %d before its circuit opened", n, routing.DefaultBreakerFailures)
	}
}
