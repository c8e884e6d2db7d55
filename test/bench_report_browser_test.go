package test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/usherllm/usher/test/bench"
)

// TestBenchHTMLReportInABrowser runs the same shared-prefix load through usher in front of three
// simulated workers under two routing policies, writes the HTML report of both side by side and
// opens it in headless Chromium: every plot is drawn with data, and the page fetches nothing.
// The screenshot is artifacts/bench/report.png at the repository's root.
func TestBenchHTMLReportInABrowser(t *testing.T) {
	var runs []bench.NamedReport
	for _, policy := range []string{"round_robin", "cache_aware"} {
		s := startStack(t, stackOptions{workers: 3, policy: policy})
		cfg := bench.Config{
			URL: s.url + "/v1", Model: model, Workload: bench.WorkloadSharedPrefix, Seed: 7, Rate: 60, Drain: 30 * time.Second,
			Tenants:      []bench.Tenant{{Name: "chat", Key: apiKey, Share: 1, Class: "interactive"}, {Name: "bulk", Key: apiKey, Share: 2, Class: "batch"}},
			SharedPrefix: bench.SharedPrefixConfig{Groups: 6, PromptsPerGroup: 10, SystemPromptLen: 512, QuestionLen: 16, OutputLen: 24},
			Window:       time.Second,
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		rep, err := bench.Run(ctx, cfg, bench.Options{})
		cancel()
		if err != nil {
			t.Fatalf("bench with %s: %v", policy, err)
		}
		runs = append(runs, bench.NamedReport{Name: policy, Report: rep})
	}
	page := filepath.Join(t.TempDir(), "report.html")
	f, err := os.Create(page)
	if err != nil {
		t.Fatal(err)
	}
	if err := bench.WriteHTML(f, runs); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	ctx := startBrowser(t)
	do(t, ctx, "open the report", chromedp.Navigate("file://"+page), chromedp.WaitVisible(chromedp.CSS("#summary")))
	type facts struct {
		Rows      []string       `json:"rows"`
		Scopes    []string       `json:"scopes"`
		Widest    float64        `json:"widest"`
		Charts    map[string]int `json:"charts"`
		Empty     []string       `json:"empty"`
		Bars      int            `json:"bars"`
		Fetched   []string       `json:"fetched"`
		Invisible int            `json:"invisible"`
	}
	got, err := chromedp.Run(ctx, chromedp.Evaluate[facts](`(() => {
		const charts = {}, empty = [];
		let invisible = 0;
		for (const svg of document.querySelectorAll('svg.chart')) {
			const kind = svg.dataset.kind;
			charts[kind] = (charts[kind] || 0) + 1;
			const r = svg.getBoundingClientRect();
			if (r.width < 100 || r.height < 50) invisible++;
			const marks = kind === 'workers' ? svg.querySelectorAll('rect.bar') : [...svg.querySelectorAll('path.series')].filter(p => p.getTotalLength() > 20);
			if (marks.length === 0) empty.push(kind + ' ' + svg.dataset.run);
		}
		return {
			rows: [...document.querySelectorAll('#summary tbody tr.run td:first-child')].map(td => td.textContent),
			scopes: [...document.querySelectorAll('#summary tbody tr.scope')].map(tr => tr.dataset.run + ' ' + tr.dataset.scope + ' ' + tr.dataset.name +
				' ' + (tr.querySelector('.ttft-p99').textContent !== '' && tr.querySelector('.e2e-p99').textContent !== '')),
			widest: Math.max(...[...document.querySelectorAll('svg.chart')].map(s => s.getBoundingClientRect().width)) / document.body.clientWidth,
			charts, empty, invisible,
			bars: document.querySelectorAll('rect.bar').length,
			fetched: performance.getEntriesByType('resource').map(e => e.name),
		};
	})()`))
	if err != nil {
		t.Fatalf("reading the page: %v", err)
	}
	if strings.Join(got.Rows, ",") != "round_robin,cache_aware" {
		t.Errorf("summary rows: got %v, want round_robin and cache_aware", got.Rows)
	}
	// Each run's classes and tenants have their own latency rows.
	var wantScopes []string
	for _, r := range runs {
		for _, s := range []string{"class interactive", "class batch", "tenant chat", "tenant bulk"} {
			wantScopes = append(wantScopes, r.Name+" "+s+" true")
		}
	}
	if strings.Join(got.Scopes, ",") != strings.Join(wantScopes, ",") {
		t.Errorf("summary rows of classes and tenants: got %v, want %v", got.Scopes, wantScopes)
	}
	// Two runs side by side share the page's width: each chart takes more than a third of it.
	if got.Widest < 0.4 {
		t.Errorf("widest chart: %.2f of the page's width, want at least 0.4", got.Widest)
	}
	for _, kind := range []string{"ttft-class", "e2e-class", "ttft-tenant", "e2e-tenant", "workers", "throughput", "tokens", "queue"} {
		if got.Charts[kind] != len(runs) {
			t.Errorf("%s plots: got %d, want one per run (%d)", kind, got.Charts[kind], len(runs))
		}
	}
	if len(got.Empty) > 0 || got.Invisible > 0 || got.Bars != 2*3 {
		t.Errorf("plots without data: %v; too small to see: %d; worker bars: %d, want 6", got.Empty, got.Invisible, got.Bars)
	}
	if len(got.Fetched) > 0 {
		t.Errorf("the page fetched %v; it must stand alone", got.Fetched)
	}
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := filepath.Join("..", "artifacts", "bench")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.png"), buf, 0o644); err != nil {
		t.Fatal(err)
	}
}
