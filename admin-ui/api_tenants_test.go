package adminui

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const rootToken = "root-admin-token-of-24-characters-or-more"

func TestTenantAdminAPI(t *testing.T) {
	g := startTenantsGateway(t)
	mustStatus := func(want int, method, path, token, body string) map[string]any {
		t.Helper()
		resp, out := g.admin(t, method, path, token, body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: got %d, want %d (%v)", method, path, resp.StatusCode, want, out)
		}
		return out
	}
	mustStatus(201, "POST", "/tenants", rootToken, `{"id":"acme","name":"Acme","tier":"pro"}`)
	mustStatus(201, "POST", "/tenants", rootToken, `{"id":"globex","name":"Globex'; DROP TABLE tenants; --","tier":"free"}`)
	mustStatus(409, "POST", "/tenants", rootToken, `{"id":"acme","name":"Again"}`)
	mustStatus(400, "POST", "/tenants", rootToken, `{"id":"bad id!","name":"x"}`)
	mustStatus(400, "POST", "/tenants", rootToken, `not json`)
	mustStatus(400, "POST", "/tenants", rootToken, `{"id":"x","name":"x","color":"red"}`)
	mustStatus(413, "POST", "/tenants", rootToken, `{"id":"x","name":"`+strings.Repeat("y", maxAdminBody)+`"}`)
	if got := mustStatus(200, "GET", "/tenants/globex", rootToken, "")["name"]; got != "Globex'; DROP TABLE tenants; --" {
		t.Fatalf("name with SQL metacharacters: got %q", got)
	}

	created := mustStatus(201, "POST", "/tenants/acme/keys", rootToken, `{"name":"ci"}`)
	secret, _ := created["secret"].(string)
	keyID, _ := created["key"].(map[string]any)["id"].(string)
	if !strings.HasPrefix(secret, "usk_") {
		t.Fatalf("created key: %v", created)
	}
	// The key works on the data plane, and its list never shows the secret.
	if resp := g.post(t, "/v1/chat/completions", secret, chatBody, nil); resp.StatusCode != 200 {
		t.Fatalf("new key on the data plane: %d", resp.StatusCode)
	}
	if keys := mustStatus(200, "GET", "/tenants/acme/keys", rootToken, ""); strings.Contains(toJSON(keys), secret[len(secret)-20:]) {
		t.Fatal("the key list shows the secret")
	}

	// A tenant acting with its own key: its own objects only, and nothing of the fleet.
	mustStatus(200, "GET", "/tenants/acme", secret, "")
	mustStatus(404, "GET", "/tenants/globex", secret, "")
	mustStatus(404, "GET", "/tenants/globex/keys", secret, "")
	mustStatus(404, "POST", "/tenants/globex/keys", secret, `{"name":"steal"}`)
	mustStatus(403, "POST", "/tenants", secret, `{"id":"evil","name":"Evil"}`)
	mustStatus(403, "POST", "/tenants/acme/suspend", secret, "")
	mustStatus(403, "GET", "/workers", secret, "")
	if list := mustStatus(200, "GET", "/tenants", secret, ""); len(list["tenants"].([]any)) != 1 {
		t.Fatalf("a tenant lists other tenants: %v", list)
	}

	// Suspend stops the tenant's keys; resume brings them back; revoke ends the key.
	mustStatus(200, "POST", "/tenants/acme/suspend", rootToken, "")
	eventually(t, func() bool { return g.post(t, "/v1/chat/completions", secret, chatBody, nil).StatusCode == 401 })
	mustStatus(200, "POST", "/tenants/acme/resume", rootToken, "")
	eventually(t, func() bool { return g.post(t, "/v1/chat/completions", secret, chatBody, nil).StatusCode == 200 })
	mustStatus(204, "DELETE", "/tenants/acme/keys/"+keyID, rootToken, "")
	eventually(t, func() bool { return g.post(t, "/v1/chat/completions", secret, chatBody, nil).StatusCode == 401 })
	// Revoking again changes nothing and says so the same way, without a second audit entry.
	mustStatus(204, "DELETE", "/tenants/acme/keys/"+keyID, rootToken, "")
	if revokes := strings.Count(toJSON(mustStatus(200, "GET", "/audit?object=key:"+keyID, rootToken, "")), `"key.revoke"`); revokes != 1 {
		t.Fatalf("audit entries of the key's revocation after two revokes: got %d, want 1", revokes)
	}
	mustStatus(404, "DELETE", "/tenants/acme/keys/nokey", rootToken, "")

	if tiers := mustStatus(200, "GET", "/tiers", rootToken, ""); len(tiers["tiers"].([]any)) != 2 {
		t.Fatalf("tiers: %v", tiers)
	}
	page := mustStatus(200, "GET", "/audit?limit=2", rootToken, "")
	if entries, _ := page["entries"].([]any); len(entries) != 2 || page["next_before"] == nil {
		t.Fatalf("audit page of 2 with a cursor: %v", page)
	}
	next := mustStatus(200, "GET", "/audit?limit=50&before="+page["next_before"].(string), rootToken, "")
	if entries, _ := next["entries"].([]any); len(entries) < 4 {
		t.Fatalf("audit second page: %v", next)
	}
	if strings.Contains(toJSON(page)+toJSON(next), secret) {
		t.Fatal("the audit log shows a key's secret")
	}
	mustStatus(400, "GET", "/audit?limit=zero", rootToken, "")
	mustStatus(204, "DELETE", "/tenants/globex", rootToken, "")
	mustStatus(404, "GET", "/tenants/globex", rootToken, "")
}

// eventually polls cond for up to two seconds (the directory's refresh).
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 400; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("condition still false after 2s")
}

func TestFleetChangesReachTheAuditLog(t *testing.T) {
	g := startTenantsGateway(t)
	if resp, out := g.admin(t, "POST", "/workers/w1/drain", rootToken, ""); resp.StatusCode != 200 {
		t.Fatalf("drain: %d %v", resp.StatusCode, out)
	}
	if resp, out := g.admin(t, "POST", "/workers/w1/undrain", rootToken, ""); resp.StatusCode != 200 {
		t.Fatalf("undrain: %d %v", resp.StatusCode, out)
	}
	_, page := g.admin(t, "GET", "/audit?limit=10", rootToken, "")
	got := toJSON(page)
	for _, want := range []string{"worker.drain", "worker.undrain"} {
		if !strings.Contains(got, want) {
			t.Fatalf("audit log has no %s: %s", want, got)
		}
	}
}

// TestStorageFailureIs503 is issue 26's weak spot: a database that cannot be written answered
// 400 to a tenant's creation, which tells automation the request itself was wrong. A failure of
// the store is 503 storage_unavailable with a Retry-After, in the admin API's error shape.
func TestStorageFailureIs503(t *testing.T) {
	g, store := startTenantsReplica(t, filepath.Join(t.TempDir(), "usher.db"), rootToken)
	if resp, out := g.admin(t, "POST", "/tenants", rootToken, `{"id":"acme","tier":"pro"}`); resp.StatusCode != 201 {
		t.Fatalf("create a tenant: got %d %v", resp.StatusCode, out)
	}
	store.Close() // the database is gone
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/tenants", `{"id":"newco","tier":"pro"}`},
		{"POST", "/tenants/acme/keys", `{"name":"ci"}`},
		{"GET", "/tenants", ""},
	} {
		resp, out := g.admin(t, c.method, c.path, rootToken, c.body)
		e, _ := out["error"].(map[string]any)
		if resp.StatusCode != 503 || e["code"] != "storage_unavailable" || e["type"] != "server_error" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s %s with the database gone: got %d %v (Retry-After %q), want 503 storage_unavailable with Retry-After",
				c.method, c.path, resp.StatusCode, out, resp.Header.Get("Retry-After"))
		}
	}
}
