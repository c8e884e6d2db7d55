package bench

import (
	"bytes"
	"encoding/json"
	"flag"
	"strings"
	"testing"
	"time"
)

// Each request is judged as usher judges it: TTFT at the first chunk, TPOT over the tokens after
// it, a whole answer against TTFT + TPOT x (tokens - 1), a 5xx missed, a 4xx and a drop not judged.
func TestAttainmentJudgesAsUsher(t *testing.T) {
	o := Objective{TTFT: 500 * time.Millisecond, TPOT: 100 * time.Millisecond}
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	results := []result{
		{ok: true, chunks: []time.Duration{ms(400), ms(500), ms(600)}, e2e: ms(600), outputTokens: 3}, // met
		{ok: true, chunks: []time.Duration{ms(600), ms(650)}, e2e: ms(650), outputTokens: 2},          // TTFT missed
		{ok: true, chunks: []time.Duration{ms(100), ms(400)}, e2e: ms(400), outputTokens: 2},          // TPOT 300 ms: missed
		{ok: true, whole: true, chunks: []time.Duration{ms(650)}, e2e: ms(650), outputTokens: 3},      // whole within 700: met
		{ok: true, whole: true, chunks: []time.Duration{ms(750)}, e2e: ms(750), outputTokens: 3},      // whole late: both missed
		{status: 503, code: "no_worker"},  // usher failed it: missed
		{status: 429, code: "rate_limit"}, // the client's: not judged
		{dropped: true},                   // never sent: not judged
	}
	a := attain(results, o, 2*time.Second)
	want := Attainment{TTFTObjectiveMs: 500, TPOTObjectiveMs: 100, Judged: 6, Met: 2, Missed: 4, TTFTMissed: 3, TPOTMissed: 3,
		Share: 2.0 / 6, GoodputPerSecond: 1}
	if *a != want {
		t.Errorf("got %+v, want %+v", *a, want)
	}
}

// --objective gives the classes named their attainment in the JSON and the text report.
func TestObjectiveFlagReachesTheReport(t *testing.T) {
	var cfg Config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--objective", "interactive=500ms/80ms", "--objective", "batch=10s"}); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Objectives; got["interactive"] != (Objective{500 * time.Millisecond, 80 * time.Millisecond}) || got["batch"] != (Objective{TTFT: 10 * time.Second}) {
		t.Fatalf("objectives: got %+v", got)
	}
	for _, bad := range []string{"interactive", "=1s", "interactive=soon", "interactive=-1s", "interactive=1s/0s"} {
		if err := fs.Parse([]string{"--objective", bad}); err == nil {
			t.Errorf("--objective %q: got no error", bad)
		}
	}
	results := []result{
		{ok: true, class: "interactive", chunks: []time.Duration{time.Millisecond}, e2e: time.Millisecond, outputTokens: 1},
		{ok: true, class: "standard", chunks: []time.Duration{time.Millisecond}, e2e: time.Millisecond, outputTokens: 1},
	}
	rep := buildReport(cfg.withDefaults(), results, time.Second)
	var text bytes.Buffer
	rep.WriteTable(&text)
	if !strings.Contains(text.String(), "attainment class interactive: 100.0% met TTFT <= 500 ms, TPOT <= 80 ms (1 of 1 judged") ||
		strings.Contains(text.String(), "attainment class standard") {
		t.Errorf("text report: got %s, want interactive's attainment only", text.String())
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if a := back.Classes[0].Attainment; back.Classes[0].Name != "interactive" || a == nil || a.Met != 1 || back.Classes[1].Attainment != nil {
		t.Errorf("JSON classes: got %+v", back.Classes)
	}
	var html bytes.Buffer
	if err := WriteHTML(&html, []NamedReport{{Name: "run", Report: rep}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(html.String(), `<td class="attainment nowrap"><span title="TTFT 500 ms, TPOT 80 ms: 1 of 1 met; goodput 1.00 req/s">100.0%</span></td>`) {
		t.Errorf("HTML report: no attainment cell for interactive")
	}
}
