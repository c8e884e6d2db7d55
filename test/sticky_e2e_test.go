package test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/redistest"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

// replica is one gateway process's worth of parts: its own pool and server, sharing workers
// and Redis with the other replicas.
type replica struct {
	url string
}

func startReplica(t *testing.T, specs []routing.WorkerSpec, policy string, rdb redis.UniversalClient) *replica {
	t.Helper()
	// The workers fail by answering errors, never by being slow, so the check's timeout is
	// generous: a 40 ms bound failed the first check on a loaded machine, and the first
	// request then found no healthy worker (503).
	cfg := routing.Config{Workers: specs, Policy: policy,
		Health: routing.HealthConfig{Interval: 500 * time.Millisecond, Timeout: 500 * time.Millisecond, HealthyThreshold: 1, UnhealthyThreshold: 1}}
	// Likewise each pin lookup may take its time: past the pin timeout (50 ms by default) a
	// replica routes by consistent hashing, which on a loaded machine made the replicas
	// disagree for reasons this test is not about.
	cfg.Models = map[string]routing.ModelConfig{model: {Policy: policy, Pins: routing.PinConfig{Timeout: 500 * time.Millisecond}}}
	cfg.SetDefaults()
	store := routing.NewRedisStore(rdb, 0)
	return &replica{url: serveReplica(t, cfg, routing.Options{Pins: store, Drains: store})}
}

// serveReplica runs a pool of cfg with opts and, in front of it, a gateway for the tenant "e2e"
// with key apiKey; both stop when the test ends. It returns the gateway's URL.
func serveReplica(t *testing.T, cfg routing.Config, opts routing.Options) string {
	t.Helper()
	pool, err := routing.NewPool(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); pool.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	auth, err := tenants.NewStatic([]tenants.TenantSpec{{ID: "e2e", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(apiKey)}}}})
	if err != nil {
		t.Fatal(err)
	}
	var gcfg gateway.Config
	gcfg.SetDefaults()
	gw, err := gateway.New(gcfg, gateway.Deps{Pool: pool, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	go gw.Run(ctx)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return srv.URL
}

// session sends one request of a session and returns the worker that served it.
func (r *replica) session(t *testing.T, id string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chat("hi "+id, 2, false)))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("X-Session-ID", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session %s: status %d", id, resp.StatusCode)
	}
	return resp.Header.Get("X-Usher-Worker")
}

func TestPinnedRoutingAcrossReplicasWithFailoverAndRedisLoss(t *testing.T) {
	for _, policy := range []string{"sticky_session", "manual"} {
		t.Run(policy, func(t *testing.T) { testPinnedRouting(t, policy) })
	}
}

func testPinnedRouting(t *testing.T, policy string) {
	rs := redistest.Start(t)
	var specs []routing.WorkerSpec
	engines := map[string]*sim.Engine{}
	for i := 0; i < 3; i++ {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.TimeScale = model, 0.01
		engine, srv := simtest.Start(t, cfg)
		id := fmt.Sprintf("sim-%d", i)
		engines[id] = engine
		specs = append(specs, routing.WorkerSpec{ID: id, URL: srv.URL, Models: []string{model}})
	}
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { rdb.Close() })
	a := startReplica(t, specs, policy, rdb)
	b := startReplica(t, specs, policy, rdb)

	sessions := make([]string, 12)
	pinned := map[string]string{}
	for i := range sessions {
		sessions[i] = fmt.Sprintf("s%d", i)
		pinned[sessions[i]] = a.session(t, sessions[i])
	}
	for _, s := range sessions {
		if got := b.session(t, s); got != pinned[s] {
			t.Fatalf("session %s: replica a sent it to %s, replica b to %s", s, pinned[s], got)
		}
	}

	// The worker of s0 dies: its sessions fail over and both replicas agree on the new worker.
	dead := pinned["s0"]
	engines[dead].SetFaults(sim.Faults{Unhealthy: true, ErrorRate: 1})
	moved := a.session(t, "s0")
	if moved == dead {
		t.Fatalf("session s0 still served by the dead worker %s", dead)
	}
	eventually(t, 2*time.Second, "both replicas agree on s0's new worker", func() bool {
		return b.session(t, "s0") == moved && a.session(t, "s0") == moved
	})

	// Redis goes away: requests still flow and a session still lands on one worker.
	rs.Stop()
	for _, s := range sessions[1:4] {
		first := a.session(t, s)
		if again := b.session(t, s); again != first {
			t.Fatalf("without Redis, session %s went to %s then %s", s, first, again)
		}
	}
}
