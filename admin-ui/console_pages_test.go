package adminui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/tenants"
)

// TestConsoleWorkersOfferWhatTheSourceAllows: a worker of the config file has no Remove button
// (the page says where it is declared instead) but can be drained; a worker added through the
// console can be removed; a refused action comes back to the Workers page with its message.
func TestConsoleWorkersOfferWhatTheSourceAllows(t *testing.T) {
	g := startTenantsGateway(t)
	b := newBrowser(t, g.url)
	csrf := b.signIn(rootToken)
	if resp, body := b.do("POST", "/admin/workers", url.Values{"csrf": {csrf}, "id": {"w9"}, "url": {"http://127.0.0.1:9"}, "models": {testModel}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("add w9: got %d: %s", resp.StatusCode, body)
	}
	_, page := b.do("GET", "/admin/workers", nil)
	for _, id := range []string{"w1", "w2"} {
		if strings.Contains(page, `id="remove-`+id+`"`) {
			t.Errorf("config worker %s: the page offers Remove", id)
		}
		if !regexp.MustCompile(`id="fixed-` + id + `"[^>]*>from the config file<`).MatchString(page) {
			t.Errorf("config worker %s: the page does not say it comes from the config file", id)
		}
		if !strings.Contains(page, `id="drain-`+id+`"`) {
			t.Errorf("config worker %s: the page does not offer Drain", id)
		}
	}
	if !strings.Contains(page, `id="remove-w9"`) || strings.Contains(page, `id="fixed-w9"`) {
		t.Error("worker w9 added in the console: the page does not offer Remove")
	}

	resp, _ := b.do("POST", "/admin/workers/nope/drain", url.Values{"csrf": {csrf}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/workers" {
		t.Fatalf("refused drain: got %d to %q, want 303 back to /admin/workers", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp, page = b.do("GET", "/admin/workers", nil)
	m := regexp.MustCompile(`<div class="flash err" id="error">([^<]*)</div>`).FindStringSubmatch(page)
	if resp.StatusCode != 200 || m == nil || !strings.Contains(m[1], "nope") {
		t.Fatalf("after a refused drain: got %d, error %q, want the Workers page naming nope", resp.StatusCode, m)
	}
	if _, page = b.do("GET", "/admin/workers", nil); strings.Contains(page, `id="error"`) {
		t.Error("the refusal is shown again on the next page")
	}
}

// TestConsoleSessionsPage: the forms come before the list, the page says how many pins the
// search finds, and lists them sessionsPageSize at a time with next and previous links.
func TestConsoleSessionsPage(t *testing.T) {
	g := startTenantsGateway(t)
	const pins = sessionsPageSize + 10
	for i := range pins {
		body := fmt.Sprintf(`{"model":%q,"tenant":"acme","key":"s%03d","worker":"w1"}`, testModel, i)
		if resp, out := g.admin(t, "POST", "/pins", rootToken, body); resp.StatusCode != 200 {
			t.Fatalf("pin %d: %d %v", i, resp.StatusCode, out)
		}
	}
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	_, page := b.do("GET", "/admin/sessions", nil)
	form, list := strings.Index(page, `id="pin-form"`), strings.Index(page, `id="pins"`)
	if form < 0 || list < 0 || form > list {
		t.Errorf("pin form at %d, list at %d: want the form first", form, list)
	}
	if move := strings.Index(page, `id="move-form"`); move < 0 || move > list {
		t.Errorf("move form at %d, list at %d: want the form first", move, list)
	}
	total := regexp.MustCompile(`id="pins-total">([^<]*)<`).FindStringSubmatch(page)
	if total == nil || total[1] != fmt.Sprintf("%d pins", pins) {
		t.Errorf("total: got %q, want %q", total, fmt.Sprintf("%d pins", pins))
	}
	rows := func(page string) int { return strings.Count(page, `class="mono pin-key"`) }
	if n := rows(page); n != sessionsPageSize {
		t.Errorf("first page: got %d pins, want %d", n, sessionsPageSize)
	}
	if strings.Contains(page, `id="pins-prev"`) {
		t.Error("first page: a Previous link")
	}
	next := regexp.MustCompile(`href="(/admin/sessions\?[^"]*)" id="pins-next"`).FindStringSubmatch(page)
	if next == nil {
		t.Fatal("first page: no Next link")
	}
	_, page = b.do("GET", strings.ReplaceAll(next[1], "&amp;", "&"), nil)
	if n := rows(page); n != 10 || !strings.Contains(page, "s059") || strings.Contains(page, "s000") {
		t.Errorf("second page: got %d pins, want the last 10 (s050 to s059)", n)
	}
	if strings.Contains(page, `id="pins-next"`) || !strings.Contains(page, `id="pins-prev"`) {
		t.Error("last page: want a Previous link and no Next")
	}
	_, page = b.do("GET", "/admin/sessions?worker=w2", nil)
	if total := regexp.MustCompile(`id="pins-total">([^<]*)<`).FindStringSubmatch(page); total == nil || total[1] != "0 pins" {
		t.Errorf("search of w2: got %q, want 0 pins", total)
	}
}

// TestConsoleUsageSpreadsAWeek: hours of one day in a 7-day view are bars at different x, a
// day rolled up by the ledger is spread over its hours, and the page's numbers are thousands
// separated.
func TestConsoleUsageSpreadsAWeek(t *testing.T) {
	g, store := startTenantsReplica(t, t.TempDir()+"/usher.db", rootToken)
	day := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	rows := map[tenants.UsageKey]tenants.UsageCounts{}
	for _, h := range []int{1, 9, 20} {
		rows[tenants.UsageKey{Tenant: "acme", Key: "k", Model: testModel, Class: tenants.ClassBatch, Start: day.Add(time.Duration(h) * time.Hour)}] =
			tenants.UsageCounts{Requests: 1000, PromptTokens: 1_234_567, CompletionTokens: 1000}
	}
	// A day the ledger rolled up (its hours gone) is spread over its 24 hours.
	rolled := day.Add(-48*time.Hour + 5*time.Hour)
	rows[tenants.UsageKey{Tenant: "acme", Key: "k", Model: testModel, Class: tenants.ClassBatch, Start: rolled}] = tenants.UsageCounts{PromptTokens: 2400}
	if err := store.AddUsage(context.Background(), "", rows); err != nil {
		t.Fatal(err)
	}
	if err := store.RollUp(context.Background(), day.Add(-24*time.Hour), day.Add(-30*24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	resp, page := b.do("GET", "/admin/usage?days=7", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("usage page: got %d", resp.StatusCode)
	}
	chart := page[strings.Index(page, `id="usage-by-class"`):]
	chart = chart[:strings.Index(chart, "</svg>")]
	xs := map[string]bool{}
	for _, m := range regexp.MustCompile(`<rect x="([0-9.]+)"`).FindAllStringSubmatch(chart, -1) {
		xs[m[1]] = true
	}
	if len(xs) != 3+24 {
		t.Errorf("bars of three hours of one day and of a rolled-up day in a 7-day view: got %d x positions (%v), want 27 different", len(xs), xs)
	}
	if n := strings.Count(chart, ": 100 tokens</title>"); n != 24 {
		t.Errorf("the rolled-up day's 2,400 tokens: got %d bars of 100, want 24", n)
	}
	for _, want := range []string{`id="usage-requests">3,000<`, ">3,706,101<", "top of the scale: 1,235,567 tokens"} {
		if !strings.Contains(page, want) {
			t.Errorf("usage page: no %q", want)
		}
	}
}

// TestOverviewChartsTellClassesApart: each class's line has its own colour and dash pattern,
// and the page has a legend of them.
func TestOverviewChartsTellClassesApart(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	var samples []OverviewSample
	for i := range 3 {
		s := OverviewSample{At: now.Add(time.Duration(i-2) * historyStep)}
		for _, cl := range queue.Classes() {
			s.Classes = append(s.Classes, ClassSample{Class: cl, RequestsPerSecond: float64(i + int(cl))})
		}
		samples = append(samples, s)
	}
	svg := string(historyCharts(samples, now)[0].SVG)
	seen := map[string]string{}
	for _, m := range regexp.MustCompile(`data-series="([a-z]+)"[^>]* stroke="([^"]+)"[^>]*?(?: stroke-dasharray="([^"]+)")?/>`).FindAllStringSubmatch(svg, -1) {
		look := m[2] + " " + m[3]
		for cl, other := range seen {
			if other == look || strings.Fields(other)[0] == m[2] {
				t.Errorf("classes %s and %s are drawn alike: %q, %q", cl, m[1], other, look)
			}
		}
		seen[m[1]] = look
	}
	if len(seen) != len(queue.Classes()) {
		t.Fatalf("lines: got %v, want one per class", seen)
	}
	g := startTenantsGateway(t)
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	_, page := b.do("GET", "/admin/overview", nil)
	for _, cl := range queue.Classes() {
		if !strings.Contains(page, `class="legend-class" data-series="`+cl.String()+`"`) {
			t.Errorf("overview: no legend of %s", cl)
		}
	}
}
