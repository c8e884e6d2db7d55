package bench

import (
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestWriteHTMLSummaryHasClassAndTenantRows: the summary gives each class's and each tenant's
// TTFT and end-to-end p50 and p99, not only the overall figures a batch flood dominates.
func TestWriteHTMLSummaryHasClassAndTenantRows(t *testing.T) {
	ms := time.Millisecond
	var results []result
	for i := range 20 {
		results = append(results,
			result{tenant: 0, ok: true, chunks: []time.Duration{10 * ms}, e2e: 30 * ms, outputTokens: 1, class: "interactive"},
			result{tenant: 1, ok: true, chunks: []time.Duration{time.Duration(900+i) * ms}, e2e: 2 * time.Second, outputTokens: 1, class: "batch"})
	}
	rep := buildReport(Config{Window: time.Second, Tenants: []Tenant{{Name: "chat", Share: 1}, {Name: "bulk", Share: 1}}}, results, time.Second)
	var buf strings.Builder
	if err := WriteHTML(&buf, []NamedReport{{Name: "demo", Report: rep}}); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`<tr class="scope" data-run="demo" data-scope="(\w+)" data-name="(\w+)">.*?<td class="ttft-p50">(\d+)</td><td class="ttft-p99">(\d+)</td><td class="e2e-p50">(\d+)</td><td class="e2e-p99">(\d+)</td>`)
	var got []string
	for _, m := range row.FindAllStringSubmatch(strings.ReplaceAll(buf.String(), "\n", ""), -1) {
		got = append(got, strings.Join(m[1:], " "))
	}
	want := []string{"class interactive 10 10 30 30", "class batch 910 919 2000 2000", "tenant chat 10 10 30 30", "tenant bulk 910 919 2000 2000"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("summary rows: got %q, want %q", got, want)
	}
}
