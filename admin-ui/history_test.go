package adminui

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestOverviewHistory: each sample keeps the classes as the Overview showed them and the
// fleet's cache hit rate over the step, the API returns them oldest first, and the console
// draws one chart per figure with the samples' points.
func TestOverviewHistory(t *testing.T) {
	g := startTenantsGateway(t)
	g.plane.record() // nothing served yet: no cache hit rate
	g.admin(t, "POST", "/tenants", rootToken, `{"id":"acme","name":"Acme"}`)
	_, created := g.admin(t, "POST", "/tenants/acme/keys", rootToken, `{"name":"load"}`)
	secret, _ := created["secret"].(string)
	for range 3 {
		if resp := g.post(t, "/v1/chat/completions", secret, chatBody, nil); resp.StatusCode != 200 {
			t.Fatalf("chat: got %d, want 200", resp.StatusCode)
		}
	}
	g.plane.record()

	_, out := g.admin(t, "GET", "/overview", rootToken, "")
	hist, _ := out["history"].([]any)
	if len(hist) != 2 {
		t.Fatalf("history: got %v, want two samples", out["history"])
	}
	first, second := hist[0].(map[string]any), hist[1].(map[string]any)
	if _, ok := first["cache_hit_rate"]; ok {
		t.Errorf("first sample: got a cache hit rate %v, want none (no step before it)", first["cache_hit_rate"])
	}
	if second["cache_hit_rate"] != float64(0) {
		t.Errorf("second sample: cache hit rate %v, want 0 (15 prompt tokens, none cached)", second["cache_hit_rate"])
	}
	var ttft float64
	for _, c := range second["classes"].([]any) {
		ttft += c.(map[string]any)["ttft_p99_seconds"].(float64)
	}
	if ttft <= 0 {
		t.Errorf("second sample: no class has a TTFT p99 after 3 requests: %v", second["classes"])
	}

	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	_, page := b.do("GET", "/admin/overview/live", nil)
	for _, id := range []string{"rps", "ttft", "queued", "shed", "cache"} {
		if !strings.Contains(page, `id="chart-`+id+`"`) {
			t.Errorf("the overview has no chart %q", id)
		}
	}
	points := regexp.MustCompile(`data-chart="(\w+)" data-points="(\d+)"`).FindAllStringSubmatch(page, -1)
	want := map[string]string{"rps": "6", "ttft": "6", "queued": "6", "shed": "6", "cache": "1"} // 2 samples x 3 classes; 1 cache step
	for _, m := range points {
		if want[m[1]] != m[2] {
			t.Errorf("chart %s: %s points, want %s", m[1], m[2], want[m[1]])
		}
	}
	if len(points) != len(want) {
		t.Errorf("charts: got %v", points)
	}
}

// TestHistoryKeepsTheLastSamples: the ring holds historyLen samples, dropping the oldest, and a
// step in which the fleet's counters fell (a worker left) has no cache hit rate.
func TestHistoryKeepsTheLastSamples(t *testing.T) {
	var h history
	t0 := time.Unix(1_700_000_000, 0)
	for i := range historyLen + 10 {
		h.add(OverviewSample{At: t0.Add(time.Duration(i) * historyStep)}, int64(100*i), int64(50*i))
	}
	got := h.list()
	if len(got) != historyLen || !got[0].At.Equal(t0.Add(10*historyStep)) {
		t.Fatalf("got %d samples from %v, want %d from %v", len(got), got[0].At, historyLen, t0.Add(10*historyStep))
	}
	if r := got[len(got)-1].CacheHitRate; r == nil || *r != 0.5 {
		t.Errorf("last cache hit rate: got %v, want 0.5", r)
	}
	h.add(OverviewSample{At: t0.Add(time.Hour)}, 10, 5)
	if r := h.list()[historyLen-1].CacheHitRate; r != nil {
		t.Errorf("cache hit rate after the counters fell: got %v, want none", *r)
	}
}

// TestConsoleOverviewAndForms: states with no worker are not coloured, circuit_open reads as
// words, the add-worker form leaves max concurrency to be learned, Move pins does not propose
// moving a worker's pins to itself, and the pages name a favicon that is served.
func TestConsoleOverviewAndForms(t *testing.T) {
	g := startTenantsGateway(t)
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	_, overview := b.do("GET", "/admin/overview", nil)
	for _, want := range []string{`id="workers-healthy"><div class="num state-healthy">2<`, `id="workers-unhealthy"><div class="num">0<`,
		`id="workers-circuit_open"><div class="num">0</div><div class="label">circuit open<`, `rel="icon" href="/admin/static/favicon.svg"`} {
		if !strings.Contains(overview, want) {
			t.Errorf("overview lacks %s", want)
		}
	}
	_, workers := b.do("GET", "/admin/workers", nil)
	if m := regexp.MustCompile(`<input name="max_concurrency"[^>]*>`).FindString(workers); m == "" || strings.Contains(m, "value=") {
		t.Errorf("add-worker max concurrency: got %q, want an empty field (learned)", m)
	}
	_, sessions := b.do("GET", "/admin/sessions", nil)
	move := sessions[strings.Index(sessions, `id="move-form"`):]
	from := regexp.MustCompile(`name="from"><option>(\w+)<`).FindStringSubmatch(move)
	to := regexp.MustCompile(`name="to">.*?<option selected>(\w+)<`).FindStringSubmatch(move)
	if from == nil || to == nil || from[1] == to[1] {
		t.Errorf("move pins: from %v to %v, want two different workers", from, to)
	}
	if resp, body := b.do("GET", "/admin/static/favicon.svg", nil); resp.StatusCode != 200 || !strings.Contains(body, "<svg") {
		t.Errorf("favicon: got %d", resp.StatusCode)
	}
}

func TestChartLabels(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{milliseconds(20000), "20 s"}, {milliseconds(1500), "1.5 s"}, {milliseconds(50), "50 ms"}, {milliseconds(0.5), "0.5 ms"},
		{trimFloat(roundUp(0)), "1"}, {trimFloat(roundUp(99.8)), "100"}, {trimFloat(roundUp(0.13)), "0.2"}, {trimFloat(roundUp(200)), "200"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
