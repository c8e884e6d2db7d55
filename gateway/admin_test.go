package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

const adminToken = "admin-secret-token"

// tokenAdmins is an AdminAuthenticator with one token.
type tokenAdmins struct{}

func (tokenAdmins) AuthenticateAdmin(_ context.Context, cred string) (string, error) {
	if cred != adminToken {
		return "", tenants.ErrUnauthenticated
	}
	return "admin:test", nil
}

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

func startAdminGateway(t *testing.T) (*testGateway, *fakeWorker) {
	t.Helper()
	w := newFakeWorker(t, nil)
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) { d.Admins = tokenAdmins{} })
	return g, w
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
		{"add again", "POST", "/workers", `{"id":"w2","url":"` + w.srv.URL + `","models":["m1"]}`, 409, nil},
		{"add bad url", "POST", "/workers", `{"id":"w3","url":"nope","models":["m1"]}`, 400, nil},
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
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("token %q: got %d, want 401", token, resp.StatusCode)
		}
		if strings.Contains(toJSON(out), "wrong") {
			t.Fatalf("the error repeats the credential: %v", out)
		}
	}
	if resp, _ := g.admin(t, "GET", "/workers/w1", adminToken, ""); resp.StatusCode != 200 {
		t.Fatalf("the worker: got %d, want 200", resp.StatusCode)
	}
	// A tenant's API key is not an admin credential.
	if resp, _ := g.admin(t, "GET", "/workers", testKey, ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("tenant key on the admin API: got %d, want 401", resp.StatusCode)
	}
}

func TestDrainedWorkerGetsNoNewRequests(t *testing.T) {
	a := newFakeWorker(t, nil)
	b := newFakeWorker(t, nil)
	g := startGatewayWith(t, []routing.WorkerSpec{a.spec("a"), b.spec("b")}, nil, func(d *Deps) { d.Admins = tokenAdmins{} })
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

func toJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
