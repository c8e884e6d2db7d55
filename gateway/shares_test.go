package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/test/redistest"
)

// peakEngine answers every inference request after a pause and counts the requests it
// holds at once, as an engine's own counters would.
type peakEngine struct {
	srv       *httptest.Server
	now, peak atomic.Int64
	served    atomic.Int64
	pause     time.Duration
}

func newPeakEngine(t *testing.T, pause time.Duration) *peakEngine {
	t.Helper()
	e := &peakEngine{pause: pause}
	e.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		n := e.now.Add(1)
		for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
		}
		time.Sleep(e.pause)
		e.now.Add(-1)
		e.served.Add(1)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// TestFleetKeepsWorkerWithinItsLimit: two gateway replicas on one Redis, each sent 24
// concurrent requests for one worker whose limit is 4. With the worker's limit split among
// them (routing.ShareStore) the engine never holds more than 4 at once, and every request is
// served; each replica alone would send it up to 4 of its own.
func TestFleetKeepsWorkerWithinItsLimit(t *testing.T) {
	srv := redistest.Start(t)
	engine := newPeakEngine(t, 20*time.Millisecond)
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{
		{ID: "w1", URL: engine.srv.URL, Models: []string{testModel}, MaxConcurrency: 4}}}
	var gws []*testGateway
	for range 2 {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})
		t.Cleanup(func() { rdb.Close() })
		g := startGatewayPool(t, rcfg, routing.Options{Shares: routing.NewRedisStore(rdb, 0)}, nil, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); g.srv.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		gws = append(gws, g)
	}
	const each = 24
	var wg sync.WaitGroup
	statuses := make(chan int, 2*each)
	for _, g := range gws {
		for range each {
			wg.Go(func() {
				resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
				statuses <- resp.StatusCode
			})
		}
	}
	wg.Wait()
	close(statuses)
	for code := range statuses {
		if code != http.StatusOK {
			t.Fatalf("a request got status %d, want every one 200", code)
		}
	}
	if got := engine.served.Load(); got != 2*each {
		t.Fatalf("the engine served %d requests, want %d", got, 2*each)
	}
	if peak := engine.peak.Load(); peak > 4 {
		t.Fatalf("the engine held %d requests at once, over the worker's limit 4", peak)
	}
}
