package gateway

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
)

// pathEcho is an admin plane that answers every request with its method and path.
var pathEcho = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, r.Method+" "+r.URL.Path)
})

func TestAdminPlaneMountedAtAdmin(t *testing.T) {
	w := newFakeWorker(t, nil)
	var live *Server
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) {
		d.Admin = func(s *Server) (http.Handler, error) { live = s; return pathEcho, nil }
	})
	if live != g.srv {
		t.Fatal("Admin was not given the Server being built")
	}
	call := func(method, path string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(method, g.url+path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for _, c := range [][2]string{{"GET", "/admin"}, {"GET", "/admin/"}, {"POST", "/admin/api/v1/workers"}, {"DELETE", "/admin/x/y"}} {
		if resp, body := call(c[0], c[1]); resp.StatusCode != 200 || body != c[0]+" "+c[1] {
			t.Errorf("%s %s: got %d %q, want the admin plane's answer", c[0], c[1], resp.StatusCode, body)
		}
	}
	if resp, body := call("GET", "/adminx"); resp.StatusCode != 404 || !strings.Contains(body, `"not_found"`) {
		t.Errorf("GET /adminx: got %d %q, want the data plane's 404", resp.StatusCode, body)
	}
	g.srv.BeginShutdown()
	if resp, _ := call("GET", "/admin/"); !resp.Close {
		t.Error("a stopping gateway's admin answer does not close the connection")
	}
}

func TestNoAdminPlaneNoAdminRoutes(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp, err := http.Get(g.url + "/admin/api/v1/workers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("got %d, want 404", resp.StatusCode)
	}
}

func TestAdminPlaneErrorFailsNew(t *testing.T) {
	cfg := Config{}
	cfg.SetDefaults()
	pool, err := routing.NewPool(routing.Config{Policy: "round_robin"}, routing.Options{})
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	_, err = New(cfg, Deps{Pool: pool, Auth: tierAuth{fallbackTier}, Admin: func(*Server) (http.Handler, error) { return nil, boom }})
	if !errors.Is(err, boom) {
		t.Fatalf("got %v, want the admin plane's error", err)
	}
}
