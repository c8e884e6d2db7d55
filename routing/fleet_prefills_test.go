package routing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/test/redistest"
)

// TestInteractivePrefillsToldAcrossReplicas: two replicas on one real Redis, in front of the same
// two workers. While a's interactive prompt is in prefill on w0, b's lower-class piece there
// waits (AwaitInteractive) and b's interactive request goes to w1; once a's first token is back
// the piece goes. Marks that are junk, oversized, b's own, numberless or for a worker b does not
// have count nothing; another replica's mark whose end never comes counts for fleetPrefillTTL.
func TestInteractivePrefillsToldAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	var engines []string
	for range 2 {
		e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("{}")) }))
		t.Cleanup(e.Close)
		engines = append(engines, e.URL)
	}
	clock := newFakeClock()
	ctx, cancel := context.WithCancel(context.Background())
	pools := map[string]*Pool{}
	stores := map[string]*RedisStore{}
	var stopped []chan struct{}
	for _, name := range []string{"a", "b"} {
		cfg := Config{Workers: []WorkerSpec{
			{ID: "w0", URL: engines[0], Models: []string{"m"}},
			{ID: "w1", URL: engines[1], Models: []string{"m"}},
		}}
		stores[name] = NewRedisStore(newRedisClient(t, srv), 0)
		p, _ := newTestPoolWith(t, cfg, Options{Now: clock.Now, Shares: stores[name]})
		pools[name] = p
		done := make(chan struct{})
		stopped = append(stopped, done)
		go func() { defer close(done); p.Run(ctx) }()
	}
	t.Cleanup(func() {
		cancel()
		for _, done := range stopped {
			<-done
		}
	})
	// Each replica's share of the workers, as the gateway's exchanges keep them.
	demand := func(string) ModelBacklog {
		return ModelBacklog{Interactive: 2, All: 4, InteractiveWeight: 1, Weight: 2}
	}
	for round := range 4 {
		if round == 2 {
			clock.Advance(ShareReportTTL) // past the start's hold, shares grow to the split
		}
		for _, name := range []string{"a", "b"} {
			if err := pools[name].SyncShares(ctx, demand); err != nil {
				t.Fatalf("%s's exchange of shares: %v", name, err)
			}
		}
	}
	a := picker{t: t, p: pools["a"], model: "m"}
	b := picker{t: t, p: pools["b"], model: "m"}
	counted := func(p *Pool, id string) int64 {
		w, err := p.find(id)
		if err != nil {
			t.Fatal(err)
		}
		return w.fleetPrefills.Load()
	}
	// Both subscribed before the first mark: a mark published before is lost by design.
	rdb := newRedisClient(t, srv)
	waitFor(t, "both replicas subscribed", func() bool {
		n, err := rdb.PubSubNumSub(context.Background(), PrefillMarksChannel).Result()
		return err == nil && n[PrefillMarksChannel] == 2
	})

	inter := a.pick("a's interactive request", Request{Interactive: true, PromptTokens: 10, TargetWorker: "w0"})
	waitFor(t, "b counting a's interactive prefill on w0", func() bool { return counted(pools["b"], "w0") == 1 })
	if n := counted(pools["a"], "w0"); n != 0 {
		t.Fatalf("a counts %d of the fleet's prefills on w0, want 0 (its own are its own)", n)
	}
	// w1 busier than w0 for b: its interactive request would take w0 but for a's prefill there.
	busy := b.pick("b's request decoding on w1", Request{PromptTokens: 10, TargetWorker: "w1"})
	busy.Prefilled()
	spread := b.pick("b's interactive request", Request{Interactive: true, PromptTokens: 10})
	if spread.Worker.ID() != "w1" {
		t.Errorf("b's interactive request went to %s beside a's prefill, want w1", spread.Worker.ID())
	}
	spread.Release(Outcome{})
	busy.Release(Outcome{})

	lower := b.pick("b's lower-class request", Request{PromptTokens: 10, TargetWorker: "w0"})
	waited := make(chan error, 1)
	go func() { waited <- lower.AwaitInteractive(context.Background()) }()
	select {
	case err := <-waited:
		t.Fatalf("b's piece went (%v) while a's interactive prompt is in prefill on its worker", err)
	case <-time.After(20 * time.Millisecond):
	}
	inter.Prefilled()
	select {
	case err := <-waited:
		if err != nil {
			t.Fatalf("b's piece after a's first token: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("b's piece still waits 5s after a's first token")
	}
	if n := counted(pools["b"], "w0"); n != 0 {
		t.Fatalf("b still counts %d of a's prefills on w0", n)
	}
	inter.Release(Outcome{})
	lower.Release(Outcome{})

	// Marks b must not count, then one it must: published in this order on one connection, so
	// the last one counted means the others were read.
	for _, payload := range []string{
		"not json", `{"r":"x","w":"w0"}`, `{"r":"x","w":"w0","n":0}`, `{"w":"w0","n":3}`,
		`{"r":"x","w":"nowhere","n":4}`, `{"r":"` + stores["b"].replica + `","w":"w0","n":5}`,
		`{"r":"x","w":"w0","n":6,"pad":"` + strings.Repeat("x", maxPrefillMarkBytes) + `"}`,
		`{"r":"x","w":"w1","n":7}`,
	} {
		if err := rdb.Publish(context.Background(), PrefillMarksChannel, payload).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "b counting x's prefill on w1", func() bool { return counted(pools["b"], "w1") == 1 })
	if n := counted(pools["b"], "w0"); n != 0 {
		t.Fatalf("b counts %d prefills on w0 from marks it should have dropped", n)
	}
	// x never tells the end: past fleetPrefillTTL it no longer counts.
	clock.Advance(fleetPrefillTTL - time.Millisecond)
	pools["b"].marks.expire()
	if n := counted(pools["b"], "w1"); n != 1 {
		t.Fatalf("x's mark expired before fleetPrefillTTL (b counts %d on w1)", n)
	}
	clock.Advance(2 * time.Millisecond)
	waitFor(t, "x's mark expired", func() bool { return counted(pools["b"], "w1") == 0 })
}
