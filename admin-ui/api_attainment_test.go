package adminui

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
)

// GET /attainment reports per tenant and class the ledger's verdicts over the window, the worst
// first, each with its tier and the percentile it promises.
func TestAttainmentAPI(t *testing.T) {
	g, store := startTenantsReplica(t, t.TempDir()+"/usher.db", rootToken)
	for _, id := range []string{"acme", "globex"} {
		if resp, _ := g.admin(t, "POST", "/tenants", rootToken, `{"id":"`+id+`","tier":"pro"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: got %d", id, resp.StatusCode)
		}
	}
	hour := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	key := func(tenant string) tenants.UsageKey {
		return tenants.UsageKey{Tenant: tenant, Key: "k", Model: testModel, Class: tenants.ClassInteractive, Start: hour}
	}
	if err := store.AddUsage(context.Background(), "", map[tenants.UsageKey]tenants.UsageCounts{
		key("acme"):   {Requests: 100, TTFTMet: 99, TTFTMissed: 1, TPOTMet: 100, ObjectivesMet: 99, ObjectivesMissed: 1},
		key("globex"): {Requests: 10, TTFTMet: 8, TTFTMissed: 2, TPOTMet: 10, ObjectivesMet: 8, ObjectivesMissed: 2},
	}); err != nil {
		t.Fatal(err)
	}
	resp, out := g.admin(t, "GET", "/attainment?tier=pro", rootToken, "")
	rows, _ := out["attainment"].([]any)
	if resp.StatusCode != http.StatusOK || len(rows) != 2 {
		t.Fatalf("got %d %v, want two rows", resp.StatusCode, out)
	}
	worst, best := rows[0].(map[string]any), rows[1].(map[string]any)
	if worst["tenant"] != "globex" || worst["share"] != 0.8 || worst["kept"] != false || worst["tier"] != "pro" || worst["percentile"] != 99.0 {
		t.Errorf("first row: got %v, want globex at 0.8 of 99%%, not kept", worst)
	}
	if best["tenant"] != "acme" || best["share"] != 0.99 || best["kept"] != true || best["objectives_missed"] != 1.0 {
		t.Errorf("second row: got %v, want acme at 0.99, kept", best)
	}
	if resp, out := g.admin(t, "GET", "/attainment?tier=free", rootToken, ""); resp.StatusCode != http.StatusOK || len(out["attainment"].([]any)) != 0 {
		t.Errorf("tier free: got %d %v, want no rows", resp.StatusCode, out)
	}
}
