package adminui

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The admin plane is tested as it runs: mounted on a real gateway, over real HTTP, in front of
// fake OpenAI-compatible workers.

const (
	testModel = "m1"
	testKey   = "sk-test-key"
	chatBody  = `{"model":"m1","messages":[{"role":"user","content":"hello"}]}`
	// Headers of the data plane the tests read and send.
	headerWorker    = "X-Usher-Worker"
	headerSessionID = "X-Session-ID"
)

// fakeWorker answers every chat completion with a short non-streaming answer and its usage, and
// every other request (health checks, metric scrapes) with 200.
type fakeWorker struct {
	srv      *httptest.Server
	requests atomic.Int64
}

func newFakeWorker(t testing.TB) *fakeWorker {
	t.Helper()
	w := &fakeWorker{}
	w.srv = httptest.NewServer(w)
	t.Cleanup(w.srv.Close)
	return w
}

func (w *fakeWorker) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		rw.WriteHeader(http.StatusOK)
		return
	}
	w.requests.Add(1)
	rw.Header().Set("Content-Type", "application/json")
	fmt.Fprint(rw, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],`+
		`"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8}}`)
}

func (w *fakeWorker) spec(id string) routing.WorkerSpec {
	return routing.WorkerSpec{ID: id, URL: w.srv.URL, Models: []string{testModel}}
}

// setup is what a test gateway is built from; startGateway fills what a test leaves unset.
type setup struct {
	Config  Config
	Pool    *routing.Pool
	Auth    tenants.Authenticator
	Admins  Authenticator
	Tenants *tenants.Admin
	// Sessions keeps console sessions server-side; nil: signed cookies alone.
	Sessions SessionStore
	// Board and Replica share this replica's reports with others'; nil: none.
	Board   ReplicaBoard
	Replica string
	Now     func() time.Time // the admin plane's clock; nil: time.Now
	Logger  *slog.Logger     // the admin plane's log; nil: discard
	// TrustedProxies is the gateway's server.trusted_proxies; the admin plane reads client
	// addresses through it, as serve wires them.
	TrustedProxies []string
}

type testGateway struct {
	url   string
	plane *Plane // the admin plane mounted on it
}

// startGateway starts a gateway with the admin plane in front of specs, routed round robin, with
// tenant t1 holding testKey and tokenAdmins as its admins; change, when set, changes the parts.
func startGateway(t *testing.T, specs []routing.WorkerSpec, change func(*setup)) *testGateway {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var s setup
	if change != nil {
		change(&s)
	}
	if s.Pool == nil {
		s.Pool = newPool(t, specs, "round_robin")
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Pool.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if s.Auth == nil {
		auth, err := tenants.NewStatic([]tenants.TenantSpec{{ID: "t1", Name: "T1",
			Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(testKey)}}}})
		if err != nil {
			t.Fatal(err)
		}
		s.Auth = auth
	}
	if s.Admins == nil {
		s.Admins = tokenAdmins{}
	}
	s.Config.SetDefaults()
	cfg := gateway.Config{TrustedProxies: s.TrustedProxies}
	cfg.SetDefaults()
	var plane *Plane
	gw, err := gateway.New(cfg, gateway.Deps{Pool: s.Pool, Auth: s.Auth, Admin: func(live *gateway.Server) (http.Handler, error) {
		p, err := New(s.Config, Deps{Fleet: s.Pool, Live: live, Admins: s.Admins, Tenants: s.Tenants, Sessions: s.Sessions, Board: s.Board, Replica: s.Replica, Now: s.Now, Logger: s.Logger,
			ClientAddr: live.ClientAddr})
		plane = p
		return p, err
	}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	return &testGateway{url: srv.URL, plane: plane}
}

func newPool(t *testing.T, specs []routing.WorkerSpec, policy string) *routing.Pool {
	t.Helper()
	cfg := routing.Config{Workers: specs, Policy: policy}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	pool, err := routing.NewPool(cfg, routing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return pool
}

// post sends a data-plane request with key as its bearer credential and the headers hdr.
func (g *testGateway) post(t *testing.T, path, key, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// admin calls the admin API with token as its bearer credential and decodes the JSON answer.
func (g *testGateway) admin(t *testing.T, method, path, token, body string) (*http.Response, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, g.url+"/admin/api/v1"+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
