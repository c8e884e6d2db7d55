package adminui

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
)

// TestConsoleAttainmentWorstFirst: the Attainment page sums each tier per class and lists the
// tenants the worst first, a tenant below its tier's percentile marked missed.
func TestConsoleAttainmentWorstFirst(t *testing.T) {
	g, store := startTenantsReplica(t, t.TempDir()+"/usher.db", rootToken)
	for _, tn := range []struct{ id, tier string }{{"acme", "pro"}, {"globex", "pro"}, {"initech", "free"}} {
		if resp, _ := g.admin(t, "POST", "/tenants", rootToken, `{"id":"`+tn.id+`","tier":"`+tn.tier+`"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("create %s: got %d", tn.id, resp.StatusCode)
		}
	}
	hour := time.Now().UTC().Truncate(time.Hour)
	key := func(tenant, class string) tenants.UsageKey {
		return tenants.UsageKey{Tenant: tenant, Key: "k", Model: testModel, Class: class, Start: hour}
	}
	if err := store.AddUsage(context.Background(), "", map[tenants.UsageKey]tenants.UsageCounts{
		key("acme", tenants.ClassInteractive):    {Requests: 1000, ObjectivesMet: 1000, TTFTMet: 1000},
		key("globex", tenants.ClassInteractive):  {Requests: 100, ObjectivesMet: 90, ObjectivesMissed: 10, TTFTMet: 90, TTFTMissed: 10},
		key("initech", tenants.ClassBatch):       {Requests: 5},
		key("initech", tenants.ClassInteractive): {Requests: 10, ObjectivesMet: 5, ObjectivesMissed: 5, TTFTMet: 5, TTFTMissed: 5},
	}); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	resp, page := b.do("GET", "/admin/attainment?days=1", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("attainment page: got %d", resp.StatusCode)
	}
	tenantsTable := page[strings.Index(page, `id="attainment-tenants"`):]
	order := []string{">initech<", ">globex<", ">acme<"} // 50%, 90%, 100%; initech's unjudged batch last
	last := -1
	for _, name := range order {
		i := strings.Index(tenantsTable, name)
		if i < last || i < 0 {
			t.Fatalf("tenants table: %s at %d, after %d: want the worst first (%v) in %s", name, i, last, order, tenantsTable)
		}
		last = i
	}
	if !strings.Contains(tenantsTable, `class="missed"><td>pro</td><td><a href="/admin/usage?tenant=globex">globex</a></td><td>interactive</td><td class="n">90.0%</td>`) {
		t.Errorf("globex: want its row missed at 90.0%% of pro's promise, got %s", tenantsTable)
	}
	tiers := page[strings.Index(page, `id="attainment-tiers"`):strings.Index(page, `id="attainment-tenants"`)]
	if !strings.Contains(tiers, `<td>pro</td><td>interactive</td><td class="n">99.1%</td>`) || !strings.Contains(tiers, `<td>free</td><td>interactive</td><td class="n">50.0%</td>`) {
		t.Errorf("tiers table: want pro interactive at 1090/1100 = 99.1%%, free at 50.0%%; got %s", tiers)
	}
	if strings.Index(tiers, ">free<") > strings.Index(tiers, ">pro<") {
		t.Errorf("tiers table: want free (the worse) first, got %s", tiers)
	}
	if resp, _ := b.do("GET", "/admin/attainment?days=0", nil); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("days=0: got %d, want 400", resp.StatusCode)
	}
}
