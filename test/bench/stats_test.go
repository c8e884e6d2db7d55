package bench

import (
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		name   string
		sorted []float64
		p      float64
		want   float64
	}{
		{"empty", nil, 50, 0},
		{"one", []float64{7}, 99, 7},
		{"median of odd", []float64{1, 2, 3}, 50, 2},
		{"median of even interpolates", []float64{1, 2, 3, 4}, 50, 2.5},
		{"p90 of 1..11", []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, 90, 10},
		{"p99 interpolates", []float64{0, 100}, 99, 99},
		{"p0 is min", []float64{3, 4}, 0, 3},
		{"p100 is max", []float64{3, 4}, 100, 4},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.sorted, tc.p); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	got := summarize([]float64{4, 1, 3, 2})
	want := Summary{Count: 4, Mean: 2.5, P50: 2.5, P90: 3.7, P99: 3.97, Max: 4}
	if got.Count != want.Count || got.Max != want.Max || math.Abs(got.P90-want.P90) > 1e-9 ||
		math.Abs(got.P99-want.P99) > 1e-9 || got.Mean != want.Mean || got.P50 != want.P50 {
		t.Errorf("got %+v, want %+v", got, want)
	}
}

func TestJainIndex(t *testing.T) {
	tests := []struct {
		name string
		xs   []float64
		want float64
	}{
		{"none", nil, 0},
		{"equal", []float64{5, 5, 5, 5}, 1},
		{"one takes all of four", []float64{9, 0, 0, 0}, 0.25},
		{"one and two", []float64{1, 2}, 0.9},
		{"all zero", []float64{0, 0}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := JainIndex(tc.xs); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestFairnessWindows(t *testing.T) {
	cfg := Config{Window: time.Second, Tenants: []Tenant{{Name: "a", Share: 1}, {Name: "b", Share: 2}, {Name: "idle", Share: 1}}}
	ms := time.Millisecond
	results := []result{
		// a: 10 prompt tokens at 100ms, 4 output tokens over two chunks at 100ms and 1100ms.
		{tenant: 0, ok: true, sentAt: 0, chunks: []time.Duration{100 * ms, 1100 * ms}, e2e: 1100 * ms, promptTokens: 10, outputTokens: 4},
		// b: 20 prompt and 2 output tokens in window 0, then 24 in window 1.
		{tenant: 1, ok: true, sentAt: 0, chunks: []time.Duration{500 * ms}, e2e: 600 * ms, promptTokens: 20, outputTokens: 2},
		{tenant: 1, ok: true, sentAt: 1200 * ms, chunks: []time.Duration{300 * ms}, e2e: 300 * ms, promptTokens: 20, outputTokens: 4},
		// a failure keeps a demanding in window 1 but serves nothing.
		{tenant: 0, status: 429, sentAt: 1500 * ms, e2e: ms},
	}
	f := fairness(cfg, results, 2*time.Second)
	wantTokens := map[string][]float64{"a": {12, 2}, "b": {22, 24}, "idle": {0, 0}}
	if !reflect.DeepEqual(f.Tokens, wantTokens) {
		t.Errorf("tokens: got %v, want %v", f.Tokens, wantTokens)
	}
	// Normalized by share: window 0 a=12, b=11; window 1 a=2, b=12. The idle tenant had no
	// demand and does not count.
	want := []float64{JainIndex([]float64{12, 11}), JainIndex([]float64{2, 12})}
	if !reflect.DeepEqual(f.Jain, want) {
		t.Errorf("jain: got %v, want %v", f.Jain, want)
	}
	if f.JainMin != want[1] || math.Abs(f.JainMean-(want[0]+want[1])/2) > 1e-12 {
		t.Errorf("got mean %v min %v, want %v and %v", f.JainMean, f.JainMin, (want[0]+want[1])/2, want[1])
	}
}

func TestFairnessQueuedBasis(t *testing.T) {
	cfg := Config{Window: time.Second, Tenants: []Tenant{{Name: "a", Share: 1}, {Name: "b", Share: 1}, {Name: "c", Share: 1}}}
	ms := time.Millisecond
	results := []result{
		// a and b waited in the gateway's queue in window 0; c was served at once and does not
		// count as backlogged, though it got far more tokens.
		{tenant: 0, ok: true, hasQueueMs: true, queueMs: 200, chunks: []time.Duration{300 * ms}, e2e: 300 * ms, promptTokens: 9, outputTokens: 1},
		{tenant: 1, ok: true, hasQueueMs: true, queueMs: 100, chunks: []time.Duration{300 * ms}, e2e: 300 * ms, promptTokens: 9, outputTokens: 1},
		{tenant: 2, ok: true, hasQueueMs: true, queueMs: 0, chunks: []time.Duration{300 * ms}, e2e: 300 * ms, promptTokens: 99, outputTokens: 1},
		// In window 1 only b is backlogged: refused with 429.
		{tenant: 1, status: 429, sentAt: 1500 * ms},
	}
	f := fairness(cfg, results, 2*time.Second)
	if f.Basis != "queued" || !reflect.DeepEqual(f.Jain, []float64{1, 1}) || f.Windows != 2 {
		t.Errorf("got basis %q jain %v windows %d, want queued [1 1] 2", f.Basis, f.Jain, f.Windows)
	}
}

func TestSchedulePoissonRate(t *testing.T) {
	cfg := Config{Rate: 100, Tenants: []Tenant{{Name: "a", Share: 1}}}.withDefaults()
	s := newSchedule(cfg, NewRandom(RandomConfig{InputLen: 1, OutputLen: 1}, 0))
	var last time.Duration
	const n = 5000
	for i := 0; i < n; i++ {
		a, ok := s.next()
		if !ok || a.at < last {
			t.Fatalf("arrival %d: got %v after %v (ok %v), want arrivals in order", i, a.at, last, ok)
		}
		last = a.at
	}
	// Mean gap 10 ms; the mean of 5000 exponential gaps is within 5% with high probability,
	// and the seed makes it the same every run.
	if mean := last.Seconds() / n; math.Abs(mean-0.01) > 0.0005 {
		t.Errorf("mean gap: got %v s, want 0.01 s", mean)
	}
}

func TestScheduleTimedKeepsTraceTimes(t *testing.T) {
	cfg := Config{Tenants: []Tenant{{Name: "a", Share: 1}, {Name: "b", Share: 3}}}.withDefaults()
	rows := make([]traceRow, 4000)
	for i := range rows {
		rows[i] = traceRow{at: time.Duration(i) * time.Millisecond, in: 1, out: 1}
	}
	s := newSchedule(cfg, newTrace(TraceConfig{TimeScale: 2, TokenScale: 1}, 0, rows))
	perTenant := [2]int{}
	for i := 0; ; i++ {
		a, ok := s.next()
		if !ok {
			break
		}
		if want := time.Duration(i) * time.Millisecond / 2; a.at != want {
			t.Fatalf("arrival %d: got %v, want %v", i, a.at, want)
		}
		perTenant[a.tenant]++
	}
	if b := perTenant[1]; b < 2850 || b > 3150 {
		t.Errorf("tenant b (share 3 of 4): got %d of 4000, want about 3000", b)
	}
}

// TestFairnessTraceWeighsTenantsEqually: in a trace workload the share sets the arrival mix,
// so a tenant with ten times the share that gets as many tokens is treated fairly, not ten
// times worse.
func TestFairnessTraceWeighsTenantsEqually(t *testing.T) {
	ms := time.Millisecond
	results := []result{
		{tenant: 0, ok: true, chunks: []time.Duration{100 * ms}, e2e: 200 * ms, promptTokens: 10, outputTokens: 10},
		{tenant: 1, ok: true, chunks: []time.Duration{100 * ms}, e2e: 200 * ms, promptTokens: 10, outputTokens: 10},
	}
	tenants := []Tenant{{Name: "big", Share: 10}, {Name: "small", Share: 1}}
	for _, tt := range []struct {
		workload string
		weighted bool
		want     float64
	}{
		{WorkloadTrace, false, 1},
		{WorkloadRandom, true, JainIndex([]float64{20.0 / 10, 20})},
	} {
		f := fairness(Config{Window: time.Second, Workload: tt.workload, Tenants: tenants}, results, time.Second)
		if f.Weighted != tt.weighted || f.Windows != 1 || math.Abs(f.JainMean-tt.want) > 1e-12 {
			t.Errorf("%s: got weighted %v, %d windows, Jain %v; want %v, 1, %v", tt.workload, f.Weighted, f.Windows, f.JainMean, tt.weighted, tt.want)
		}
	}
}

func TestTableSaysNAWithoutBackloggedWindows(t *testing.T) {
	rep := buildReport(Config{Window: time.Second, Tenants: []Tenant{{Name: "a", Share: 1}}}, nil, time.Second)
	var buf strings.Builder
	rep.WriteTable(&buf)
	if !strings.Contains(buf.String(), "fairness: Jain n/a") || strings.Contains(buf.String(), "0.000") {
		t.Errorf("fairness without backlogged windows: got\n%s\nwant n/a, no 0.000", buf.String())
	}
}

func TestTimeline(t *testing.T) {
	ms := time.Millisecond
	results := []result{
		// Sent at 0, queued 150 ms, first token at 250 ms, done at 450 ms: 4 tokens over 2 chunks.
		{ok: true, sentAt: 0, hasQueueMs: true, queueMs: 150, chunks: []time.Duration{250 * ms, 450 * ms}, e2e: 450 * ms, outputTokens: 4},
		// Sent at 300 ms, failed at 350 ms.
		{sentAt: 300 * ms, hasQueueMs: true, e2e: 50 * ms, status: 429},
		{dropped: true, sentAt: 300 * ms},
	}
	tl := timeline(results, time.Second)
	want := Timeline{StepSeconds: 0.1, Completed: []int{0, 0, 0, 0, 1, 0, 0, 0, 0, 0}, OutputTokens: []float64{0, 0, 2, 0, 2, 0, 0, 0, 0, 0},
		Outstanding: []int{1, 1, 1, 2, 1, 0, 0, 0, 0, 0}, Queued: []int{1, 1, 0, 0, 0, 0, 0, 0, 0, 0}}
	if !reflect.DeepEqual(tl, want) {
		t.Errorf("got %+v, want %+v", tl, want)
	}
}

func TestAxes(t *testing.T) {
	for _, tt := range []struct {
		a    axis
		want []float64
	}{
		{linearAxis(0, 0.95, "s"), []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
		{linearAxis(0, 37, "s"), []float64{0, 10, 20, 30, 40}},
		{linearAxis(0, 0, ""), []float64{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1}},
		{logAxis(3, 480, "ms"), []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000}},
		{logAxis(0, 0, "ms"), []float64{1, 2, 5, 10}},
	} {
		if got := tt.a.ticks(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%+v: ticks %v, want %v", tt.a, got, tt.want)
		}
	}
	if f := logAxis(1, 100, "").frac(10); math.Abs(f-0.5) > 1e-12 {
		t.Errorf("10 on a 1-100 log axis: got %v, want 0.5", f)
	}
}

// TestWriteHTMLEscapesNames: run, tenant and worker names reach the page as text, never markup.
func TestWriteHTMLEscapesNames(t *testing.T) {
	ms := time.Millisecond
	results := []result{{tenant: 0, ok: true, chunks: []time.Duration{10 * ms}, e2e: 20 * ms, promptTokens: 4, outputTokens: 1,
		worker: `w"><script>alert(1)</script>`, class: "interactive"}}
	rep := buildReport(Config{Window: time.Second, Tenants: []Tenant{{Name: "<img src=x onerror=alert(2)>", Share: 1}}}, results, time.Second)
	var buf strings.Builder
	if err := WriteHTML(&buf, []NamedReport{{Name: "<b>run</b>", Report: rep}}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"<script>", "<img", "<b>run"} {
		if strings.Contains(buf.String(), bad) {
			t.Errorf("the page holds %q unescaped", bad)
		}
	}
	if !strings.Contains(buf.String(), "&lt;b&gt;run&lt;/b&gt;") {
		t.Error("the run's name is missing")
	}
	// A report of an older bench, without percentiles or a timeline, draws empty plots.
	buf.Reset()
	if err := WriteHTML(&buf, []NamedReport{{Name: "old", Report: &Report{Classes: []Stats{{Name: "batch"}}}}}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "NaN") || strings.Contains(buf.String(), "Inf") || strings.Count(buf.String(), "no data") != 7 {
		t.Errorf("page of a report without data: %d plots say no data, want 7; NaN or Inf: %v",
			strings.Count(buf.String(), "no data"), strings.Contains(buf.String(), "NaN"))
	}
	if err := WriteHTML(&buf, nil); err == nil {
		t.Error("WriteHTML of no reports: got nil, want an error")
	}
}

func TestTimelineSteps(t *testing.T) {
	for _, tt := range []struct {
		elapsed time.Duration
		step    float64
	}{{time.Second, 0.1}, {26 * time.Second, 1}, {10 * time.Minute, 5}} {
		if got := timeline(nil, tt.elapsed).StepSeconds; got != tt.step {
			t.Errorf("run of %v: step %vs, want %vs", tt.elapsed, got, tt.step)
		}
	}
}
