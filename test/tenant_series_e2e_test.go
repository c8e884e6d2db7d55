package test

import (
	"bufio"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

// Tenants that come and go leave no metric series behind (issue 10, item 11: 10,294 series were
// left after 10k tenants): usher serve, tenants created, served and deleted through the admin
// API, and the per-tenant series back at the baseline.
func TestServeForgetsDeletedTenantsSeries(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.001
	_, worker := simtest.Start(t, cfg)
	dir := t.TempDir()
	const token = "an-admin-token-of-24-characters"
	p := startServe(t, "tenant series", func(listen string) string {
		return "server:\n  listen: " + listen + "\n" +
			"routing:\n  workers:\n    - {id: w1, url: \"" + worker.URL + "\", models: [" + model + "]}\n" +
			"database:\n  url: sqlite:" + filepath.Join(dir, "usher.db") + "\n" +
			"admin: {token: " + token + "}\n"
	})
	series := func() int {
		resp, err := http.Get(p.url + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		n := 0
		for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
			if strings.HasPrefix(sc.Text(), "usher_queue_tokens_served_total{") {
				n++
			}
		}
		return n
	}
	const tenants = 50
	for i := range tenants {
		id := fmt.Sprintf("t%d", i)
		if resp, out := call(t, "POST", p.url+"/admin/api/v1/tenants", token, `{"id":"`+id+`"}`); resp.StatusCode != http.StatusCreated {
			t.Fatalf("create tenant %s: %d %v", id, resp.StatusCode, out)
		}
		resp, out := call(t, "POST", p.url+"/admin/api/v1/tenants/"+id+"/keys", token, `{"name":"k"}`)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("create key of %s: %d %v", id, resp.StatusCode, out)
		}
		secret, _ := out["secret"].(string)
		if resp, out := call(t, "POST", p.url+"/v1/chat/completions", secret, chat("hello", 4, false)); resp.StatusCode != http.StatusOK {
			t.Fatalf("request of %s: %d %v", id, resp.StatusCode, out)
		}
	}
	if got := series(); got != tenants {
		t.Fatalf("per-tenant series after %d tenants were served: got %d, want %d", tenants, got, tenants)
	}
	for i := range tenants {
		if resp, out := call(t, "DELETE", p.url+fmt.Sprintf("/admin/api/v1/tenants/t%d", i), token, ""); resp.StatusCode/100 != 2 {
			t.Fatalf("delete tenant t%d: %d %v", i, resp.StatusCode, out)
		}
	}
	if got := series(); got != 0 {
		t.Fatalf("per-tenant series after every tenant was deleted: got %d, want 0", got)
	}
}
