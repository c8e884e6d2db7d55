package adminui

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

const adminToken = "admin-secret-token"

// tokenAdmins is an AdminAuthenticator with the admin token and one tenant credential.
type tokenAdmins struct{}

func (tokenAdmins) AuthenticateActor(_ context.Context, cred string) (tenants.Actor, error) {
	switch cred {
	case adminToken:
		return tenants.Actor{Name: "admin", Admin: true}, nil
	case testKey:
		return tenants.Actor{Name: "tenant:t1/k", TenantID: "t1"}, nil
	}
	return tenants.Actor{}, tenants.ErrUnauthenticated
}

func startAdminGateway(t *testing.T) (*testGateway, *fakeWorker) {
	t.Helper()
	w := newFakeWorker(t)
	return startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil), w
}

func TestAdminWorkersLifecycle(t *testing.T) {
	g, w := startAdminGateway(t)
	steps := []struct {
		name, method, path, body string
		status                   int
		check                    func(t *testing.T, out map[string]any)
	}{
		{"list", "GET", "/workers", "", 200, func(t *testing.T, out map[string]any) {
			if ws, _ := out["workers"].([]any); len(ws) != 1 {
				t.Fatalf("workers: got %v, want one", out["workers"])
			}
		}},
		{"add", "POST", "/workers", `{"id":"w2","url":"` + w.srv.URL + `","models":["m1"]}`, 201, func(t *testing.T, out map[string]any) {
			if out["id"] != "w2" || out["state"] != "healthy" {
				t.Fatalf("added: got %v", out)
			}
		}},
		{"change", "PUT", "/workers/w2", `{"url":"` + w.srv.URL + `/","models":["m1","m2"]}`, 200, func(t *testing.T, out map[string]any) {
			if out["url"] != w.srv.URL+"/" || len(out["models"].([]any)) != 2 {
				t.Fatalf("changed: got %v", out)
			}
		}},
		{"change another id", "PUT", "/workers/w2", `{"id":"w1","url":"` + w.srv.URL + `","models":["m1"]}`, 400, nil},
		{"change unknown", "PUT", "/workers/nope", `{"url":"` + w.srv.URL + `","models":["m1"]}`, 404, nil},
		{"add again", "POST", "/workers", `{"id":"w2","url":"` + w.srv.URL + `","models":["m1"]}`, 409, nil},
		{"add bad url", "POST", "/workers", `{"id":"w3","url":"nope","models":["m1"]}`, 400, nil},
		{"add a cloud metadata url", "POST", "/workers", `{"id":"w3","url":"http://169.254.169.254/latest","models":["m1"]}`, 400, func(t *testing.T, out map[string]any) {
			if msg, _ := out["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "allow_link_local_workers") {
				t.Errorf("message: got %q, want one naming allow_link_local_workers", msg)
			}
		}},
		{"add unknown field", "POST", "/workers", `{"id":"w3","url":"http://127.0.0.1:1","models":["m1"],"weight":3}`, 400, nil},
		{"add not json", "POST", "/workers", `id=w3`, 400, nil},
		{"add too large", "POST", "/workers", `{"id":"` + strings.Repeat("x", maxAdminBody) + `"}`, 413, nil},
		{"drain", "POST", "/workers/w2/drain", "", 200, func(t *testing.T, out map[string]any) {
			if out["state"] != "drained" {
				t.Fatalf("state after drain with nothing in flight: got %v, want drained", out["state"])
			}
		}},
		{"undrain", "POST", "/workers/w2/undrain", "", 200, func(t *testing.T, out map[string]any) {
			if out["state"] != "healthy" {
				t.Fatalf("state after undrain: got %v, want healthy", out["state"])
			}
		}},
		{"drain unknown", "POST", "/workers/nope/drain", "", 404, nil},
		{"remove", "DELETE", "/workers/w2", "", 204, nil},
		{"get removed", "GET", "/workers/w2", "", 404, nil},
		{"queue", "GET", "/queue", "", 200, func(t *testing.T, out map[string]any) {
			if qs, _ := out["queues"].([]any); len(qs) != 1 {
				t.Fatalf("queues: got %v, want one model", out["queues"])
			}
		}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			resp, out := g.admin(t, st.method, st.path, adminToken, st.body)
			if resp.StatusCode != st.status {
				t.Fatalf("status: got %d, want %d (%v)", resp.StatusCode, st.status, out)
			}
			if st.status >= 400 {
				if e, _ := out["error"].(map[string]any); e["message"] == "" || e["message"] == nil {
					t.Fatalf("error not in OpenAI's shape: %v", out)
				}
			}
			if st.check != nil {
				st.check(t, out)
			}
		})
	}
}

func TestAdminRefusesWithoutAValidToken(t *testing.T) {
	g, _ := startAdminGateway(t)
	for _, token := range []string{"", "wrong", tenants.HashKey(adminToken)} {
		resp, out := g.admin(t, "POST", "/workers/w1/drain", token, "")
		if code := errorCode(out); resp.StatusCode != http.StatusUnauthorized || code != "invalid_admin_token" {
			t.Fatalf("token %q: got %d %s, want 401 invalid_admin_token", token, resp.StatusCode, code)
		}
		if strings.Contains(toJSON(out), "wrong") {
			t.Fatalf("the error repeats the credential: %v", out)
		}
	}
	if resp, _ := g.admin(t, "GET", "/workers/w1", adminToken, ""); resp.StatusCode != 200 {
		t.Fatalf("the worker: got %d, want 200", resp.StatusCode)
	}
	// A tenant may use the admin API for its own objects, never for the fleet.
	for _, call := range [][2]string{{"GET", "/workers"}, {"POST", "/workers/w1/drain"}, {"GET", "/pins"}, {"GET", "/queue"}} {
		if resp, out := g.admin(t, call[0], call[1], testKey, ""); resp.StatusCode != http.StatusForbidden || errorCode(out) != "admin_required" {
			t.Fatalf("tenant credential on %s %s: got %d %s, want 403 admin_required", call[0], call[1], resp.StatusCode, errorCode(out))
		}
	}
}

// errorCode is the code of an answer in OpenAI's error shape, or "".
func errorCode(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	code, _ := e["code"].(string)
	return code
}

func TestDrainedWorkerGetsNoNewRequests(t *testing.T) {
	a := newFakeWorker(t)
	b := newFakeWorker(t)
	g := startGateway(t, []routing.WorkerSpec{a.spec("a"), b.spec("b")}, nil)
	if resp, _ := g.admin(t, "POST", "/workers/a/drain", adminToken, ""); resp.StatusCode != 200 {
		t.Fatalf("drain: %d", resp.StatusCode)
	}
	for i := 0; i < 6; i++ {
		if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil); resp.Header.Get(headerWorker) != "b" {
			t.Fatalf("request %d went to %q while a drains", i, resp.Header.Get(headerWorker))
		}
	}
	if a.requests.Load() != 0 {
		t.Fatalf("the drained worker got %d requests", a.requests.Load())
	}
}

func TestPinnedSessionLandsOnTheChosenWorker(t *testing.T) {
	a := newFakeWorker(t)
	b := newFakeWorker(t)
	specs := []routing.WorkerSpec{a.spec("a"), b.spec("b")}
	g := startGateway(t, specs, func(s *setup) { s.Pool = newPool(t, specs, "sticky_session") })
	for _, worker := range []string{"b", "a"} {
		body := `{"model":"m1","tenant":"t1","key":"sess-1","worker":"` + worker + `","ttl_seconds":60}`
		if resp, out := g.admin(t, "POST", "/pins", adminToken, body); resp.StatusCode != 200 {
			t.Fatalf("pin: %d %v", resp.StatusCode, out)
		}
		for i := 0; i < 3; i++ {
			resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerSessionID: "sess-1"})
			if got := resp.Header.Get(headerWorker); got != worker {
				t.Fatalf("pinned to %s: request %d went to %q", worker, i, got)
			}
		}
	}
	resp, out := g.admin(t, "GET", "/pins?worker=a", adminToken, "")
	if pins, _ := out["pins"].([]any); resp.StatusCode != 200 || len(pins) != 1 {
		t.Fatalf("pins of a: got %d %v, want one", resp.StatusCode, out)
	}
	if resp, _ := g.admin(t, "POST", "/workers/a/drain", adminToken, ""); resp.StatusCode != 200 {
		t.Fatalf("drain a: %d", resp.StatusCode)
	}
	if _, out := g.admin(t, "GET", "/pins?worker=a", adminToken, ""); len(out["pins"].([]any)) != 0 {
		t.Fatalf("pins of a after its drain: got %v, want none", out)
	}
	resp, out = g.admin(t, "POST", "/pins", adminToken, `{"model":"m1","tenant":"t1","key":"sess-2","worker":"a"}`)
	if msg, _ := out["error"].(map[string]any)["message"].(string); resp.StatusCode != 409 || errorCode(out) != "worker_draining" || !strings.Contains(msg, "draining") {
		t.Fatalf("pin to the drained a: got %d %v, want 409 worker_draining saying so", resp.StatusCode, out)
	}
	if resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerSessionID: "sess-1"}); resp.Header.Get(headerWorker) != "b" {
		t.Fatalf("session of a drained worker went to %q, want b", resp.Header.Get(headerWorker))
	}
	if resp, _ := g.admin(t, "DELETE", "/pins?model=m1&tenant=t1&key=sess-1", adminToken, ""); resp.StatusCode != 204 {
		t.Fatalf("unpin: got %d, want 204", resp.StatusCode)
	}
	if _, out := g.admin(t, "GET", "/pins", adminToken, ""); len(out["pins"].([]any)) != 0 {
		t.Fatalf("pins after unpin: %v", out)
	}
	for _, bad := range []string{`{"model":"m1"}`, `{"model":"m1","tenant":"t1","key":"k","worker":"zz"}`, `{"model":"nope","tenant":"t1","key":"k","worker":"a"}`} {
		if resp, _ := g.admin(t, "POST", "/pins", adminToken, bad); resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Fatalf("pin %s: got %d, want a 4xx", bad, resp.StatusCode)
		}
	}
}

// TestPinRefusedOnAModelRoutedWithoutPins: a pin that would be listed but never followed is
// refused with 409 and a message that says why.
func TestPinRefusedOnAModelRoutedWithoutPins(t *testing.T) {
	g, _ := startAdminGateway(t) // round robin
	resp, out := g.admin(t, "POST", "/pins", adminToken, `{"model":"m1","tenant":"t1","key":"s1","worker":"w1"}`)
	e, _ := out["error"].(map[string]any)
	if resp.StatusCode != 409 || e["code"] != "pins_ignored" || !strings.Contains(e["message"].(string), "round_robin") {
		t.Fatalf("pin on a round-robin model: got %d %v, want 409 pins_ignored naming the policy", resp.StatusCode, out)
	}
	if _, out := g.admin(t, "GET", "/pins", adminToken, ""); len(out["pins"].([]any)) != 0 {
		t.Fatalf("pins after the refusal: got %v, want none", out["pins"])
	}
}
