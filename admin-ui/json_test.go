package adminui

import (
	"regexp"
	"testing"
)

var snakeCase = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// jsonKeys calls bad for every object key in v, at any depth, that is not snake_case.
func jsonKeys(v any, path string, bad func(path string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if !snakeCase.MatchString(k) {
				bad(path + "." + k)
			}
			jsonKeys(x, path+"."+k, bad)
		}
	case []any:
		for _, x := range v {
			jsonKeys(x, path+"[]", bad)
		}
	}
}

func TestAdminAPIAnswersSnakeCase(t *testing.T) {
	g := startTenantsGateway(t)
	consoleFixture(t, g)
	if resp, out := g.admin(t, "POST", "/pins", rootToken, `{"model":"`+testModel+`","tenant":"acme","key":"s1","worker":"w2","ttl_seconds":90}`); resp.StatusCode != 200 {
		t.Fatalf("pin: %d %v", resp.StatusCode, out)
	}
	reads := map[string]map[string]any{}
	for _, path := range []string{"/workers", "/workers/w1", "/pins", "/queue", "/overview", "/tenants", "/tenants/acme",
		"/tenants/acme/keys", "/tiers", "/audit"} {
		resp, out := g.admin(t, "GET", path, rootToken, "")
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %v", path, resp.StatusCode, out)
		}
		jsonKeys(out, path, func(key string) { t.Errorf("GET %s: key %s is not snake_case", path, key) })
		reads[path] = out
	}
	pins := reads["/pins"]["pins"].([]any)
	for _, p := range pins {
		p := p.(map[string]any)
		ttl, _ := p["ttl_seconds"].(float64)
		if want := map[string]float64{"s0": 3600, "s1": 90}[p["key"].(string)]; ttl <= want-5 || ttl > want {
			t.Errorf("pin %v: got ttl_seconds %v, want about %v", p["key"], p["ttl_seconds"], want)
		}
	}
	tier := reads["/tiers"]["tiers"].([]any)[0].(map[string]any)
	if d, _ := tier["deadlines_seconds"].(map[string]any); d["interactive"] != float64(30) || d["batch"] != float64(1800) {
		t.Errorf("tier deadlines: got %v, want interactive 30 and batch 1800 seconds", tier["deadlines_seconds"])
	}
	if o, _ := tier["objectives"].(map[string]any); o["interactive"] == nil || o["interactive"].(map[string]any)["percentile"] != float64(99) {
		t.Errorf("tier objectives: got %v, want interactive's with the default percentile 99", tier["objectives"])
	}
	class := reads["/queue"]["queues"].([]any)[0].(map[string]any)["classes"].([]any)[0].(map[string]any)
	if _, ok := class["oldest_wait_seconds"]; !ok {
		t.Errorf("queue class: got %v, want oldest_wait_seconds", class)
	}
}
