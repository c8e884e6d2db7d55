package routing

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// memFeed is an in-memory PrefixFeed: every batch goes to every subscriber of its model.
type memFeed struct {
	mu   sync.Mutex
	subs map[string][]chan []byte
}

func (f *memFeed) PublishPrefixes(_ context.Context, model string, batch []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, ch := range f.subs[model] {
		ch <- batch
	}
	return nil
}

func (f *memFeed) SubscribePrefixes(ctx context.Context, model string, fn func([]byte)) error {
	ch := make(chan []byte, 64)
	f.mu.Lock()
	if f.subs == nil {
		f.subs = map[string][]chan []byte{}
	}
	f.subs[model] = append(f.subs[model], ch)
	f.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case b := <-ch:
			fn(b)
		}
	}
}

// startSharingPool builds a cache_aware pool of n workers on feed and runs its policy (only: no
// health checks against the workers' unroutable URLs) until the test ends.
func startSharingPool(t *testing.T, n int, feed PrefixFeed) *Pool {
	t.Helper()
	cfg := Config{Workers: testWorkers(n, "m"), Policy: "cache_aware"}
	cfg.Concurrency.Initial = DefaultMaxConcurrency
	p, err := NewPool(cfg, Options{Prefixes: feed})
	if err != nil {
		t.Fatal(err)
	}
	ca := p.snap.Load().models["m"].policy.(*CacheAware)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ca.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func TestCacheAwareSharesInsertsAmongReplicas(t *testing.T) {
	feed := &memFeed{}
	a, b := startSharingPool(t, 3, feed), startSharingPool(t, 3, feed)
	groups := []string{strings.Repeat("alpha ", 100), strings.Repeat("beta ", 100), strings.Repeat("gamma ", 100)}
	routedOnA := map[string]string{}
	for i, g := range groups {
		l, err := a.Pick(context.Background(), &Request{Model: "m", Prompt: g + fmt.Sprint(i), Tokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		routedOnA[g] = l.Worker.ID()
		l.Release(Outcome{})
	}
	received := b.metrics.cacheShared.WithLabelValues("m", "received")
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(received) < float64(len(groups)) {
		if time.Now().After(deadline) {
			t.Fatalf("replica B applied %v inserts, want %d", testutil.ToFloat64(received), len(groups))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := testutil.ToFloat64(a.metrics.cacheShared.WithLabelValues("m", "received")); got != 0 {
		t.Errorf("replica A applied %v of its own inserts, want 0", got)
	}
	// In the other order: on its own, B would send gamma to w0.
	for _, g := range []string{groups[2], groups[1], groups[0]} {
		l, err := b.Pick(context.Background(), &Request{Model: "m", Prompt: g + "another question", Tokens: 1})
		if err != nil {
			t.Fatal(err)
		}
		if l.Worker.ID() != routedOnA[g] || l.Route != RouteCacheHit {
			t.Errorf("%s... on B: got %s by %s, want %s by %s as on A", g[:6], l.Worker.ID(), l.Route, routedOnA[g], RouteCacheHit)
		}
		l.Release(Outcome{})
	}
}

func TestCacheAwareShareBounds(t *testing.T) {
	c, _ := newTestCacheAware(t, CacheAwareConfig{})
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	c.share = newShare(&memFeed{}, policyEnv{model: "m", metrics: p.metrics})
	c.members = map[string]bool{"w0": true}
	big := strings.Repeat("x", shareMaxBytes/2)
	c.mu.Lock()
	c.share.add("w0", "", big)
	c.share.add("w0", "", big)
	c.share.add("w0", "", "y") // over the byte bound
	bytesKept := len(c.share.pending)
	c.share.pending, c.share.pendingBytes = nil, 0
	for range shareMaxInserts + 1 { // the last one over the count bound
		c.share.add("w0", "", "z")
	}
	countKept := len(c.share.pending)
	c.mu.Unlock()
	if bytesKept != 2 || countKept != shareMaxInserts {
		t.Errorf("pending inserts: got %d under the byte bound and %d under the count bound, want 2 and %d", bytesKept, countKept, shareMaxInserts)
	}
	if got := testutil.ToFloat64(c.share.dropped); got != 2 {
		t.Errorf("dropped: got %v, want 2", got)
	}

	// Batches naming unknown workers, malformed or oversized change nothing.
	for _, b := range []string{
		`{"r":"other","i":[{"w":"w9","p":"hello"}]}`,
		`{"r":"other","i":[{"w":"w0","p":""}]}`,
		`not json`,
		`{"r":"other","i":[{"w":"w0","p":"` + strings.Repeat("a", shareMaxBatch) + `"}]}`,
	} {
		c.applyBatch([]byte(b))
	}
	if _, nodes, _ := c.CachedBytes("w0"); nodes != 0 {
		t.Errorf("after bad batches the tree has %d nodes, want 0", nodes)
	}
	c.applyBatch([]byte(`{"r":"other","i":[{"w":"w0","p":"hello"}]}`))
	if got, _, _ := c.CachedBytes("w0"); got != 5 {
		t.Errorf("after a good batch w0 mirrors %d bytes, want 5", got)
	}
}

// TestCacheAwareLearnsAndSharesConcurrently runs picks, their outcomes, other replicas' batches
// and evictions at once (for the race detector), then checks the tree's invariants.
func TestCacheAwareLearnsAndSharesConcurrently(t *testing.T) {
	c, clock := newTestCacheAware(t, CacheAwareConfig{MaxBytesPerWorker: 4000})
	ws := cacheWorkers(t, 4)
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	c.share = newShare(&memFeed{}, policyEnv{model: "m", metrics: p.metrics})
	c.WorkersChanged(ws)
	systems := []string{strings.Repeat("alpha ", 60), strings.Repeat("beta ", 60), strings.Repeat("gamma ", 60)}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				clock.advance(time.Millisecond)
				prompt := fmt.Sprintf("%sq%d", systems[(g+i)%len(systems)], i%7)
				_, _, pred := c.pickLearning(context.Background(), choice{Request: &Request{Model: "m", Prompt: prompt}}, ws)
				c.learn(pred, Outcome{PromptTokens: len(prompt) / 4, CachedTokens: (i % 3) * len(prompt) / 12, CacheReported: true})
			}
		})
	}
	wg.Go(func() {
		for i := range 200 {
			c.applyBatch(fmt.Appendf(nil, `{"r":"other","i":[{"w":"w%d","p":"%sremote %d"}]}`, i%4, systems[i%3], i))
			if i%50 == 0 {
				c.Evict()
				c.publish(context.Background())
			}
		}
	})
	wg.Wait()
	checkTree(t, c.tree)
	for id, limit := range c.Limits() {
		if limit <= 0 || limit > 4000 {
			t.Errorf("limit of %s: got %d, want in (0, 4000]", id, limit)
		}
	}
}
