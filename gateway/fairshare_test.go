package gateway

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/redistest"
)

// fleetQueue is one replica's queue of model m1, its fair share kept in the Redis at addr.
func fleetQueue(t *testing.T, addr string) *queue.Queue {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	fs, err := tenants.NewFairShareCounters(tenants.FairShareOptions{Redis: rdb, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.New(queue.Config{}, queue.Options{Model: testModel, Registerer: prometheus.NewRegistry(),
		FairShare: fleetFairShare{fs}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	q.SetCapacity(queue.Capacity{Requests: 1})
	return q
}

func mustGrant(t *testing.T, tk *queue.Ticket, err error) *queue.Grant {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-tk.Ready():
	default:
		t.Fatal("request not dispatched, want dispatched")
	}
	g, err := tk.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func stdReq(tenant string) queue.Request {
	return queue.Request{Tenant: tenant, Class: queue.Standard, PromptTokens: 100}
}

// serveInOrder serves every ticket of named on a one-slot queue whose slot first holds, and
// returns the tenants in the order they were dispatched.
func serveInOrder(t *testing.T, first *queue.Grant, named map[*queue.Ticket]string) []string {
	t.Helper()
	var order []string
	g := first
	for {
		g.Done(queue.Usage{PromptTokens: 100})
		if len(named) == 0 {
			return order
		}
		g = nil
		for tk, name := range named {
			select {
			case <-tk.Ready():
				g = mustGrant(t, tk, nil)
				order = append(order, name)
				delete(named, tk)
			default:
			}
		}
		if g == nil {
			t.Fatalf("nothing dispatched after a Done; served so far %v", order)
		}
	}
}

func syncOK(t *testing.T, q *queue.Queue) {
	t.Helper()
	if err := q.SyncFairShare(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestFleetOrderOverRedis: two replicas' queues sharing one Redis. The heavy tenant is served on
// A; on B, where it arrived first, the light tenant goes before it, by the fleet's counters.
// With Redis cut, both go on by their own counters and lose no request; restored, the charges
// made meanwhile reach the fleet, and B's order follows them again.
func TestFleetOrderOverRedis(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	a, b := fleetQueue(t, proxy.Addr()), fleetQueue(t, proxy.Addr())

	for range 5 {
		tk, err := a.Enqueue(stdReq("heavy"))
		mustGrant(t, tk, err).Done(queue.Usage{PromptTokens: 100})
	}
	syncOK(t, a)
	busy, err := b.Enqueue(stdReq("other"))
	first := mustGrant(t, busy, err)
	named := map[*queue.Ticket]string{}
	for range 3 {
		for _, who := range []string{"heavy", "light"} {
			tk, err := b.Enqueue(stdReq(who))
			if err != nil {
				t.Fatal(err)
			}
			named[tk] = who
		}
	}
	syncOK(t, b)
	if got, want := serveInOrder(t, first, named), []string{"light", "light", "light", "heavy", "heavy", "heavy"}; !slices.Equal(got, want) {
		t.Errorf("B served %v, want %v (heavy has 500 from A)", got, want)
	}
	syncOK(t, b)

	// Cut: A serves light 6 times on its own counters; nothing is refused or lost.
	proxy.Cut()
	for range 6 {
		tk, err := a.Enqueue(stdReq("light"))
		mustGrant(t, tk, err).Done(queue.Usage{PromptTokens: 100})
	}
	start := time.Now()
	if err := a.SyncFairShare(context.Background()); err == nil {
		t.Fatal("SyncFairShare with Redis cut: got nil, want an error")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("SyncFairShare with Redis cut took %v, want it bounded by the store's timeout", d)
	}
	proxy.Restore()
	deadline := time.Now().Add(5 * time.Second)
	for a.SyncFairShare(context.Background()) != nil {
		if time.Now().After(deadline) {
			t.Fatal("SyncFairShare does not succeed after Restore")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The fleet: heavy 800 (5 on A, 3 on B), light 900 (3 on B, 6 on A during the cut). B, told
	// of the cut's charges, now serves heavy first.
	busy, err = b.Enqueue(stdReq("other"))
	first = mustGrant(t, busy, err)
	named = map[*queue.Ticket]string{}
	for _, who := range []string{"light", "heavy"} {
		tk, err := b.Enqueue(stdReq(who))
		if err != nil {
			t.Fatal(err)
		}
		named[tk] = who
	}
	syncOK(t, b)
	if got, want := serveInOrder(t, first, named), []string{"heavy", "light"}; !slices.Equal(got, want) {
		t.Errorf("B served %v after the cut, want %v (light's charges during the cut counted)", got, want)
	}
}

// TestGatewaySharesFairShare: with Deps.FairShare, a served request's charge reaches the fleet's
// counters while the Server runs; with Redis cut, requests are still served, and their charges
// reach the fleet once it is back.
func TestGatewaySharesFairShare(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	fs, err := tenants.NewFairShareCounters(tenants.FairShareOptions{Redis: rdb})
	if err != nil {
		t.Fatal(err)
	}
	w := newFakeWorker(t, nil)
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) { d.FairShare = fs })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.srv.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	// counter reads t1's fleet counter (in the default tier's default class) through a client
	// of its own, straight to Redis.
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { direct.Close() })
	reader, err := tenants.NewFairShareCounters(tenants.FairShareOptions{Redis: direct})
	if err != nil {
		t.Fatal(err)
	}
	counter := func() float64 {
		f, err := reader.Exchange(context.Background(), testModel, nil,
			[]tenants.FairShareCharge{{Tenant: "t1", Class: int(queue.Standard)}})
		if err != nil {
			t.Fatal(err)
		}
		return f.Counters[0]
	}
	waitCounter := func(what string, ok func(float64) bool) float64 {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			c := counter()
			if ok(c) {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("tenant t1's fleet counter %s, want %s", strconv.FormatFloat(c, 'g', -1, 64), what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	one := waitCounter("> 0 after a served request", func(c float64) bool { return c > 0 })
	// The charge is in Redis; its exchange's answer may still be on its way back (a busy
	// machine), and an answer lost to the cut below would have the queue send the charge again,
	// the error of one batch the store allows. Two more exchanges answered mean it came back.
	oks := func() float64 {
		return metricLabelValue(t, g.reg, "usher_queue_fair_share_exchanges_total", "result", "ok")
	}
	seen := oks()
	deadline := time.Now().Add(5 * time.Second)
	for oks() < seen+2 {
		if time.Now().After(deadline) {
			t.Fatalf("fair-share exchanges answered: %v, want %v", oks(), seen+2)
		}
		time.Sleep(10 * time.Millisecond)
	}

	proxy.Cut()
	for range 2 {
		if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d with Redis cut, want 200", resp.StatusCode)
		}
	}
	time.Sleep(3 * fairShareEvery) // exchanges fail meanwhile
	proxy.Restore()
	waitCounter("3 requests' charge once Redis is back", func(c float64) bool { return c == 3*one })
}

// replicaLoad keeps each of its tenants backlogged on one replica's one-slot queue and serves
// one request at a time.
type replicaLoad struct {
	q       *queue.Queue
	waiting map[*queue.Ticket]string
	current *queue.Grant
}

func newReplicaLoad(t *testing.T, q *queue.Queue, tenants ...string) *replicaLoad {
	t.Helper()
	r := &replicaLoad{q: q, waiting: map[*queue.Ticket]string{}}
	for _, who := range tenants {
		for range 2 {
			r.add(t, who)
		}
	}
	r.take(t)
	return r
}

func (r *replicaLoad) add(t *testing.T, who string) {
	t.Helper()
	tk, err := r.q.Enqueue(stdReq(who))
	if err != nil {
		t.Fatal(err)
	}
	r.waiting[tk] = who
}

// take finds the one request dispatched, sends another of its tenant and returns the tenant.
func (r *replicaLoad) take(t *testing.T) string {
	t.Helper()
	for tk, who := range r.waiting {
		select {
		case <-tk.Ready():
			r.current = mustGrant(t, tk, nil)
			delete(r.waiting, tk)
			r.add(t, who)
			return who
		default:
		}
	}
	t.Fatal("nothing dispatched")
	return ""
}

// step ends the request in service and returns the tenant served next.
func (r *replicaLoad) step(t *testing.T) string {
	t.Helper()
	r.current.Done(queue.Usage{PromptTokens: 100})
	return r.take(t)
}

// TestFleetSharesCapacityMaxMin: replica A has a heavy tenant and light1 backlogged, replica B
// light1 and light2, each replica one request at a time. Ordered by the fleet's counters, A
// serves heavy more, since light1 is also served on B: each tenant gets about a third of the
// fleet's service (max-min fair). Each replica alone splits its own half evenly: light1 gets
// half of everything, heavy and light2 a quarter each.
func TestFleetSharesCapacityMaxMin(t *testing.T) {
	const steps = 300
	for _, tc := range []struct {
		name  string
		fleet bool
	}{{"fleet", true}, {"alone", false}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			var a, b *queue.Queue
			if tc.fleet {
				a, b = fleetQueue(t, srv.Addr()), fleetQueue(t, srv.Addr())
			} else {
				a, b = aloneQueue(t), aloneQueue(t)
			}
			ra := newReplicaLoad(t, a, "heavy", "light1")
			rb := newReplicaLoad(t, b, "light1", "light2")
			served := map[string]int{}
			for i := range steps {
				served[ra.step(t)]++
				served[rb.step(t)]++
				if i%3 == 2 { // a batch every three dispatches, as every 50 ms under load
					syncOK(t, a)
					syncOK(t, b)
				}
			}
			want := map[string][2]int{"heavy": {195, 205}, "light1": {195, 205}, "light2": {195, 205}}
			if !tc.fleet {
				want = map[string][2]int{"heavy": {148, 152}, "light1": {298, 302}, "light2": {148, 152}}
			}
			for who, w := range want {
				if n := served[who]; n < w[0] || n > w[1] {
					t.Errorf("%s served %d of %d, want %d..%d (all: %v)", who, n, 2*steps, w[0], w[1], served)
				}
			}
		})
	}
}

// aloneQueue is one replica's queue of model m1 without a fleet.
func aloneQueue(t *testing.T) *queue.Queue {
	t.Helper()
	q, err := queue.New(queue.Config{}, queue.Options{Model: testModel, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Close)
	q.SetCapacity(queue.Capacity{Requests: 1})
	return q
}
