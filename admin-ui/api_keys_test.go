package adminui

import "testing"

// TestTenantKeyManagementIsAPermission: through the admin API, a tenant credential without the
// manage_keys permission gets 403 on creating or revoking keys, and one with it mints keys only
// within its own tier (issue 10, item 2).
func TestTenantKeyManagementIsAPermission(t *testing.T) {
	g := startTenantsGateway(t)
	call := func(want int, method, path, token, body string) map[string]any {
		t.Helper()
		resp, out := g.admin(t, method, path, token, body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: got %d, want %d (%v)", method, path, resp.StatusCode, want, out)
		}
		return out
	}
	secretOf := func(out map[string]any) string { s, _ := out["secret"].(string); return s }
	idOf := func(out map[string]any) string { id, _ := out["key"].(map[string]any)["id"].(string); return id }
	call(201, "POST", "/tenants", rootToken, `{"id":"acme","tier":"pro"}`)
	plain := call(201, "POST", "/tenants/acme/keys", rootToken, `{"name":"plain"}`)
	manager := call(201, "POST", "/tenants/acme/keys", rootToken, `{"name":"mgr","tier":"free","manage_keys":true}`)

	call(403, "POST", "/tenants/acme/keys", secretOf(plain), `{"name":"more"}`)
	call(403, "DELETE", "/tenants/acme/keys/"+idOf(manager), secretOf(plain), "")
	call(403, "POST", "/tenants/acme/keys", secretOf(manager), `{"name":"stronger","tier":"pro"}`)
	call(403, "DELETE", "/tenants/acme/keys/"+idOf(plain), secretOf(manager), "") // a pro key
	child := call(201, "POST", "/tenants/acme/keys", secretOf(manager), `{"name":"child"}`)
	if tier, _ := child["key"].(map[string]any)["tier"].(string); tier != "free" {
		t.Errorf("key minted by a free-capped key: got tier %q, want free", tier)
	}
	call(204, "DELETE", "/tenants/acme/keys/"+idOf(child), secretOf(manager), "")
}
