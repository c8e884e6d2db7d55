package bench

import (
	"fmt"
	"html"
	"html/template"
	"io"
	"math"
	"strconv"
	"strings"
)

// NamedReport is a report under the name a page shows it by (a policy, a tier, a file).
type NamedReport struct {
	Name   string
	Report *Report
}

// WriteHTML writes one self-contained HTML page about runs, side by side when there are
// several (a policy bake-off): a summary table, then for each run TTFT and end-to-end latency
// CDFs per class and per tenant, requests and cache hits per worker, and throughput and queue
// depth over time. The plots are inline SVG on shared axes; the page loads nothing else and
// runs no script. Names and labels are escaped.
func WriteHTML(w io.Writer, runs []NamedReport) error {
	if len(runs) == 0 {
		return fmt.Errorf("write html: no reports")
	}
	p := page{Runs: runs}
	cdfs := []struct {
		title, field string
		scopes       func(*Report) []Stats
		q            func(Stats) []float64
	}{
		{"Time to first token by class", "ttft-class", func(r *Report) []Stats { return r.Classes }, func(s Stats) []float64 { return s.TTFTQuantiles }},
		{"End-to-end latency by class", "e2e-class", func(r *Report) []Stats { return r.Classes }, func(s Stats) []float64 { return s.E2EQuantiles }},
		{"Time to first token by tenant", "ttft-tenant", func(r *Report) []Stats { return r.Tenants }, func(s Stats) []float64 { return s.TTFTQuantiles }},
		{"End-to-end latency by tenant", "e2e-tenant", func(r *Report) []Stats { return r.Tenants }, func(s Stats) []float64 { return s.E2EQuantiles }},
	}
	for _, c := range cdfs {
		sec := section{Title: c.title, Note: "share of requests (y) served within x ms, log scale"}
		var lo, hi float64
		for _, run := range runs {
			for _, s := range c.scopes(run.Report) {
				if q := c.q(s); len(q) > 0 {
					lo, hi = minPositive(lo, q[0]), max(hi, q[len(q)-1])
				}
			}
		}
		x := logAxis(lo, hi, "ms")
		for _, run := range runs {
			var ss []series
			for i, s := range c.scopes(run.Report) {
				q := c.q(s)
				if len(q) == 0 {
					continue
				}
				pts := make([]point, len(q))
				for p, v := range q {
					pts[p] = point{v, float64(p) / 100}
				}
				ss = append(ss, series{Name: s.Name, Color: colorOf(s.Name, i), Points: pts})
			}
			sec.Charts = append(sec.Charts, lineChart(c.field, run.Name, x, linearAxis(0, 1, ""), ss))
		}
		p.Sections = append(p.Sections, sec)
	}

	workers := section{Title: "Requests and prefix-cache hits per worker", Note: "bars: requests served; label: share of prompt tokens served from the cache"}
	most := 0
	for _, run := range runs {
		for _, l := range run.Report.Workers {
			most = max(most, l.Requests)
		}
	}
	for _, run := range runs {
		workers.Charts = append(workers.Charts, workerChart(run.Name, run.Report.Workers, most))
	}
	p.Sections = append(p.Sections, workers)

	over := []struct {
		title, field, note string
		values             func(Timeline) []series
	}{
		{"Throughput over time", "throughput", "requests completed per second",
			func(tl Timeline) []series {
				return []series{timeSeries("requests/s", "#1f77b4", tl, scale(floats(tl.Completed), 1/tl.StepSeconds))}
			}},
		{"Output tokens over time", "tokens", "output tokens received per second",
			func(tl Timeline) []series {
				return []series{timeSeries("output tokens/s", "#2ca02c", tl, scale(tl.OutputTokens, 1/tl.StepSeconds))}
			}},
		{"Queue depth over time", "queue", "requests outstanding (sent, not ended) and, when the gateway says, waiting in its queue",
			func(tl Timeline) []series {
				ss := []series{timeSeries("outstanding", "#ff7f0e", tl, floats(tl.Outstanding))}
				if tl.Queued != nil {
					ss = append(ss, timeSeries("queued at the gateway", "#d62728", tl, floats(tl.Queued)))
				}
				return ss
			}},
	}
	for _, o := range over {
		sec := section{Title: o.title, Note: o.note}
		var xmax, ymax float64
		all := make([][]series, len(runs))
		for i, run := range runs {
			if run.Report.Timeline.StepSeconds <= 0 {
				continue // a report without a timeline (older than it): "no data"
			}
			all[i] = o.values(run.Report.Timeline)
			for _, s := range all[i] {
				for _, pt := range s.Points {
					xmax, ymax = max(xmax, pt.X), max(ymax, pt.Y)
				}
			}
		}
		for i, run := range runs {
			sec.Charts = append(sec.Charts, lineChart(o.field, run.Name, linearAxis(0, xmax, "s"), linearAxis(0, ymax, ""), all[i]))
		}
		p.Sections = append(p.Sections, sec)
	}
	if err := pageTemplate.Execute(w, p); err != nil {
		return fmt.Errorf("write html: %w", err)
	}
	return nil
}

type page struct {
	Runs     []NamedReport
	Sections []section
}

type section struct {
	Title, Note string
	Charts      []template.HTML
}

var pageTemplate = template.Must(template.New("report").Funcs(template.FuncMap{
	"ms":  func(v float64) string { return fmt.Sprintf("%.0f", v) },
	"pct": func(v float64) string { return fmt.Sprintf("%.1f%%", 100*v) },
	"f2":  func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"scope": func(run, kind string, s Stats) scopeRow {
		return scopeRow{Run: run, Kind: kind, Stats: s}
	},
	"jain": func(f Fairness) string {
		if f.Windows == 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.3f (min %.3f)", f.JainMean, f.JainMin)
	},
}).Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>usher bench report</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 12px}h2{font-size:17px;margin:28px 0 2px}
p.note{color:#666;margin:0 0 8px;font-size:12px}
table{border-collapse:collapse;margin:8px 0;font-size:12px}th,td{padding:3px 6px;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}th,.nowrap{white-space:nowrap}
tr.scope td:first-child{padding-left:18px;color:#555}tr.run td{border-top:1px solid #bbb;font-weight:600}
.row{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:16px}
svg.chart{display:block;width:100%;height:auto;background:#fafafa;border:1px solid #e4e4e4;border-radius:4px}
svg text{font:11px system-ui,sans-serif;fill:#333}
svg .title{font-size:13px;font-weight:600}svg .grid{stroke:#e6e6e6}svg .axis{stroke:#999}
</style></head><body>
<h1>usher bench report</h1>
<table id="summary"><thead><tr><th>run</th><th>workload</th><th>elapsed s</th><th>sent</th><th>ok</th><th>failed</th><th>dropped</th><th>req/s</th><th>out tok/s</th>
<th>TTFT p50</th><th>p99</th><th>E2E p50</th><th>p99</th><th>cache hit</th><th>worker max/mean</th><th>Jain</th><th>objective met</th></tr></thead><tbody>
{{range .Runs}}{{$o := .Report.Overall}}<tr class="run"><td>{{.Name}}</td><td>{{.Report.Run.Workload}}</td><td>{{printf "%.1f" .Report.ElapsedSeconds}}</td><td>{{$o.Sent}}</td><td>{{$o.OK}}</td><td>{{$o.Failed}}</td><td>{{$o.Dropped}}</td>
<td>{{f2 $o.RequestsPerSecond}}</td><td>{{printf "%.1f" $o.OutputTokensPerSecond}}</td><td>{{ms $o.TTFT.P50}}</td><td>{{ms $o.TTFT.P99}}</td><td>{{ms $o.E2E.P50}}</td><td>{{ms $o.E2E.P99}}</td>
<td>{{pct $o.CacheHitRate}}</td><td>{{f2 .Report.WorkerLoadRatio}}</td><td class="nowrap" title="over {{.Report.Fairness.Windows}} windows of {{.Report.Fairness.WindowSeconds}} s">{{jain .Report.Fairness}}</td><td></td></tr>
{{$run := .Name}}{{range .Report.Classes}}{{template "scope" scope $run "class" .}}{{end}}{{if gt (len .Report.Tenants) 1}}{{range .Report.Tenants}}{{template "scope" scope $run "tenant" .}}{{end}}{{end}}
{{end}}</tbody></table>
<p class="note">latencies in ms; indented rows are each run's classes and tenants (the overall figures mix them); {{range $i, $r := .Runs}}{{if $i}}; {{end}}{{$r.Name}}: {{$r.Report.Run.URL}} model {{$r.Report.Run.Model}}{{end}}</p>
{{range .Sections}}<h2>{{.Title}}</h2><p class="note">{{.Note}}</p>
<div class="row">{{range .Charts}}{{.}}{{end}}</div>
{{end}}</body></html>
{{define "scope"}}{{$s := .Stats}}<tr class="scope" data-run="{{.Run}}" data-scope="{{.Kind}}" data-name="{{$s.Name}}"><td class="nowrap">{{.Kind}} {{$s.Name}}</td><td></td><td></td><td>{{$s.Sent}}</td><td>{{$s.OK}}</td><td>{{$s.Failed}}</td><td>{{$s.Dropped}}</td>
<td>{{f2 $s.RequestsPerSecond}}</td><td>{{printf "%.1f" $s.OutputTokensPerSecond}}</td><td class="ttft-p50">{{ms $s.TTFT.P50}}</td><td class="ttft-p99">{{ms $s.TTFT.P99}}</td><td class="e2e-p50">{{ms $s.E2E.P50}}</td><td class="e2e-p99">{{ms $s.E2E.P99}}</td>
<td>{{pct $s.CacheHitRate}}</td><td></td><td></td><td class="attainment nowrap">{{with $s.Attainment}}<span title="TTFT {{ms .TTFTObjectiveMs}} ms{{if .TPOTObjectiveMs}}, TPOT {{ms .TPOTObjectiveMs}} ms{{end}}: {{.Met}} of {{.Judged}} met; goodput {{f2 .GoodputPerSecond}} req/s">{{pct .Share}}</span>{{end}}</td></tr>
{{end}}`))

// scopeRow is one class or tenant of a run in the summary table.
type scopeRow struct {
	Run, Kind string
	Stats     Stats
}

// The plots: a small SVG line chart and a bar chart, drawn here so the page needs nothing else.

type point struct{ X, Y float64 }

type series struct {
	Name, Color string
	Points      []point
}

// axis maps values to [0, 1] along a chart side, linearly or by log10.
type axis struct {
	lo, hi float64
	log    bool
	step   float64 // between ticks of a linear axis
	unit   string
}

// linearAxis spans lo to hi rounded up to a whole number of steps, a step being 1, 2 or 5 times
// a power of ten (about five of them).
func linearAxis(lo, hi float64, unit string) axis {
	if hi <= lo {
		hi = lo + 1
	}
	a := axis{lo: lo, unit: unit, step: niceCeil((hi - lo) / 5)}
	a.hi = lo + math.Ceil((hi-lo)/a.step-1e-9)*a.step
	return a
}

// logAxis spans whole decades around [lo, hi]; without positive values, 1 to 10.
func logAxis(lo, hi float64, unit string) axis {
	if lo <= 0 || hi <= 0 {
		return axis{lo: 1, hi: 10, log: true, unit: unit}
	}
	a := axis{lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi))), log: true, unit: unit}
	if a.hi <= a.lo {
		a.hi = a.lo * 10
	}
	return a
}

func (a axis) frac(v float64) float64 {
	if a.log {
		v = max(v, a.lo)
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// ticks are the values labelled on the axis: decades (and 2 and 5 times them when few) on a log
// axis, every step on a linear one.
func (a axis) ticks() []float64 {
	var out []float64
	if a.log {
		decades := math.Log10(a.hi / a.lo)
		for d := a.lo; d <= a.hi*1.0001; d *= 10 {
			out = append(out, d)
			if decades <= 3 && d*10 <= a.hi*1.0001 {
				out = append(out, 2*d, 5*d)
			}
		}
		return out
	}
	for i := 0; a.lo+float64(i)*a.step <= a.hi+a.step/1e6; i++ {
		out = append(out, a.lo+float64(i)*a.step)
	}
	return out
}

func tickLabel(v float64) string {
	switch {
	case v >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case v >= 100 || v == math.Trunc(v):
		return fmt.Sprintf("%.0f", v)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

const (
	chartW, chartH                       = 720, 300
	padLeft, padRight, padTop, padBottom = 48, 12, 26, 56
	plotW, plotH                         = chartW - padLeft - padRight, chartH - padTop - padBottom
	legendRow                            = 14
	maxLegend                            = 6
)

// lineChart draws series on the axes, titled by the run's name; kind names the plot for tests
// and styles (data-kind).
func lineChart(kind, title string, x, y axis, ss []series) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" data-kind="%s" data-run="%s" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		html.EscapeString(kind), html.EscapeString(title), chartW, chartH, chartW, chartH, html.EscapeString(title))
	fmt.Fprintf(&b, `<text class="title" x="%d" y="16">%s</text>`, padLeft, html.EscapeString(title))
	px := func(v float64) float64 { return padLeft + x.frac(v)*plotW }
	py := func(v float64) float64 { return padTop + (1-y.frac(v))*plotH }
	for _, t := range x.ticks() {
		fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`,
			px(t), padTop, px(t), padTop+plotH, px(t), padTop+plotH+14, tickLabel(t))
	}
	for _, t := range y.ticks() {
		fmt.Fprintf(&b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`,
			padLeft, py(t), padLeft+plotW, py(t), padLeft-4, py(t)+4, tickLabel(t))
	}
	fmt.Fprintf(&b, `<rect class="axis" x="%d" y="%d" width="%d" height="%d" fill="none"/>`, padLeft, padTop, plotW, plotH)
	if x.unit != "" {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text>`, padLeft+plotW, padTop+plotH+28, x.unit)
	}
	if len(ss) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle" fill="#999">no data</text>`, padLeft+plotW/2, padTop+plotH/2)
	}
	for i, s := range ss {
		var d strings.Builder
		for j, pt := range s.Points {
			cmd := 'L'
			if j == 0 {
				cmd = 'M'
			}
			fmt.Fprintf(&d, "%c%.1f %.1f", cmd, px(pt.X), py(pt.Y))
		}
		fmt.Fprintf(&b, `<path class="series" data-series="%s" d="%s" fill="none" stroke="%s" stroke-width="2"/>`,
			html.EscapeString(s.Name), d.String(), s.Color)
		if i < maxLegend {
			lx, ly := padLeft+(i%3)*(plotW/3), padTop+plotH+40+(i/3)*legendRow
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="10" height="10" fill="%s"/><text x="%d" y="%d">%s</text>`,
				lx, ly-9, s.Color, lx+14, ly, html.EscapeString(truncate(s.Name, 24)))
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// workerChart draws one horizontal bar per worker, its length the requests served (most is the
// longest bar of all runs), labelled with the requests and the cache hit rate.
func workerChart(title string, loads []WorkerLoad, most int) template.HTML {
	const rowH, labelW = 22, 110
	h := max(chartH/2, padTop+len(loads)*rowH+12)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" data-kind="workers" data-run="%s" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		html.EscapeString(title), chartW, h, chartW, h, html.EscapeString(title))
	fmt.Fprintf(&b, `<text class="title" x="%d" y="16">%s</text>`, padLeft, html.EscapeString(title))
	if len(loads) == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#999">no worker named (X-Usher-Worker)</text>`, padLeft, padTop+20)
	}
	barMax := float64(chartW - labelW - 150)
	for i, l := range loads {
		y := padTop + i*rowH
		w := barMax * float64(l.Requests) / float64(max(1, most))
		label := fmt.Sprintf("%d req", l.Requests)
		if l.PromptTokens > 0 {
			label += fmt.Sprintf(" · %.0f%% cached", 100*l.CacheHitRate)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%s</text><rect class="bar" data-worker="%s" x="%d" y="%d" width="%.1f" height="%d" fill="#1f77b4"/>`,
			labelW-6, y+14, html.EscapeString(truncate(l.Worker, 16)), html.EscapeString(l.Worker), labelW, y+2, w, rowH-6)
		if l.PromptTokens > 0 {
			fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%d" fill="#2ca02c" opacity="0.7"/>`, labelW, y+rowH-7, w*l.CacheHitRate, 3)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d">%s</text>`, float64(labelW)+w+6, y+14, label)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func timeSeries(name, color string, tl Timeline, ys []float64) series {
	s := series{Name: name, Color: color, Points: make([]point, len(ys))}
	for i, y := range ys {
		s.Points[i] = point{(float64(i) + 0.5) * tl.StepSeconds, y}
	}
	return s
}

func floats(xs []int) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = float64(x)
	}
	return out
}

func scale(xs []float64, k float64) []float64 {
	out := make([]float64, len(xs))
	for i, x := range xs {
		out[i] = x * k
	}
	return out
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func minPositive(a, b float64) float64 {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

// classColors colour the classes alike on every plot; palette colours other scopes (tenants) by
// their place, which is the configuration's order in every run.
var (
	classColors = map[string]string{"interactive": "#d62728", "standard": "#1f77b4", "batch": "#2ca02c", classUnspecified: "#7f7f7f"}
	palette     = []string{"#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22", "#1f77b4", "#2ca02c"}
)

func colorOf(name string, i int) string {
	if c, ok := classColors[name]; ok {
		return c
	}
	return palette[i%len(palette)]
}
