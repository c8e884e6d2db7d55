package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	adminui "github.com/usherllm/usher/admin-ui"
	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/sim"
)

const (
	model  = "demo-7b"
	apiKey = "sk-e2e-tenant-key"
)

// stack is a gateway in front of simulated workers, all over real HTTP on loopback.
type stack struct {
	url     string
	engines []*sim.Engine
	servers []*httptest.Server // the engines' listeners, in the same order
	ids     []string
	reg     *prometheus.Registry
}

type stackOptions struct {
	workers int
	policy  string
	sim     func(i int, c *sim.Config)
	server  func(c *gateway.Config)
	// routing, when not nil, changes the routing config, knowing the engines started.
	routing func(c *routing.Config, engines []*sim.Engine)
	// engineHandler, when not nil, wraps the HTTP handler of engine i.
	engineHandler func(i int, h http.Handler) http.Handler
	// tenants are more tenants beside "e2e" (apiKey).
	tenants []tenants.TenantSpec
	// logs, when not nil, receives the gateway's log as JSON lines, the access log included.
	logs io.Writer
}

func startStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	if o.workers == 0 {
		o.workers = 1
	}
	if o.policy == "" {
		o.policy = "round_robin"
	}
	s := &stack{reg: prometheus.NewRegistry()}
	var specs []routing.WorkerSpec
	for i := 0; i < o.workers; i++ {
		cfg := sim.DefaultConfig()
		cfg.Model = model
		cfg.TimeScale = 0.05
		if o.sim != nil {
			o.sim(i, &cfg)
		}
		engine, err := sim.New(cfg, sim.Options{})
		if err != nil {
			t.Fatal(err)
		}
		var h http.Handler = engine
		if o.engineHandler != nil {
			h = o.engineHandler(i, h)
		}
		srv := httptest.NewServer(h)
		t.Cleanup(func() { srv.Close(); engine.Close() })
		id := fmt.Sprintf("sim-%d", i)
		s.engines = append(s.engines, engine)
		s.servers = append(s.servers, srv)
		s.ids = append(s.ids, id)
		specs = append(specs, routing.WorkerSpec{ID: id, URL: srv.URL, Models: []string{model}})
	}
	rcfg := routing.Config{Workers: specs, Policy: o.policy}
	if o.routing != nil {
		o.routing(&rcfg, s.engines)
	}
	rcfg.SetDefaults()
	if err := rcfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pool, err := routing.NewPool(rcfg, routing.Options{Registerer: s.reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); pool.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	auth, err := tenants.NewStatic(append([]tenants.TenantSpec{{ID: "e2e", Name: "E2E",
		Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(apiKey)}}}}, o.tenants...))
	if err != nil {
		t.Fatal(err)
	}
	var gcfg gateway.Config
	if o.server != nil {
		o.server(&gcfg)
	}
	gcfg.SetDefaults()
	var logger *slog.Logger
	if o.logs != nil {
		logger = slog.New(slog.NewJSONHandler(o.logs, nil))
	}
	gw, err := gateway.New(gcfg, gateway.Deps{Pool: pool, Auth: auth, Registerer: s.reg, Gatherer: s.reg, Logger: logger,
		Admin: func(live *gateway.Server) (http.Handler, error) {
			return adminui.New(defaultAdminConfig(), adminui.Deps{Fleet: pool, Live: live, Admins: testAdmins{}})
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	s.url = srv.URL
	return s
}

const adminToken = "e2e-admin-token"

// testAdmins accepts adminToken.
type testAdmins struct{}

func (testAdmins) AuthenticateActor(_ context.Context, cred string) (tenants.Actor, error) {
	if cred != adminToken {
		return tenants.Actor{}, tenants.ErrUnauthenticated
	}
	return tenants.Actor{Name: "e2e-admin", Admin: true}, nil
}

// admin calls the admin API and decodes the JSON answer into out (when not nil).
func (s *stack) admin(t *testing.T, method, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest(method, s.url+"/admin/api/v1"+path, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// engine returns the engine behind the worker id.
func (s *stack) engine(t *testing.T, id string) *sim.Engine {
	t.Helper()
	for i, wid := range s.ids {
		if wid == id {
			return s.engines[i]
		}
	}
	t.Fatalf("no worker %q", id)
	return nil
}

func (s *stack) do(ctx context.Context, t *testing.T, path, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// sseReader reads server-sent events' data payloads one by one.
type sseReader struct{ sc *bufio.Scanner }

func newSSEReader(r io.Reader) *sseReader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	return &sseReader{sc: sc}
}

// next returns the next data payload, or false at the end of the stream.
func (r *sseReader) next() (string, bool) {
	for r.sc.Scan() {
		if data, ok := strings.CutPrefix(r.sc.Text(), "data:"); ok {
			return strings.TrimSpace(data), true
		}
	}
	return "", false
}

// eventually polls cond until it holds or the time runs out.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after %v", what, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func chat(content string, maxTokens int, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
		model, stream, maxTokens, content)
}

// defaultAdminConfig is the admin plane's configuration with every default.
func defaultAdminConfig() adminui.Config {
	var cfg adminui.Config
	cfg.SetDefaults()
	return cfg
}
