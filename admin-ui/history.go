package adminui

import (
	"context"
	"fmt"
	"html/template"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/usherllm/usher/queue"
)

// The Overview's charts of the last minutes: Run samples the fleet every historyStep and keeps the
// last historyLen samples in memory (about 20 KB), so the charts show the minutes before the page
// was opened. Each replica keeps its own: the charts show this replica's traffic.
const (
	historyStep = 5 * time.Second
	historyLen  = 120 // 10 minutes
)

// OverviewSample is the fleet at one moment of the Overview's history.
type OverviewSample struct {
	At time.Time `json:"at"`
	// Classes are in class order, each as the Overview showed it then.
	Classes []ClassSample `json:"classes"`
	// CacheHitRate is the share of the prompt tokens served since the previous sample that the
	// workers' prefix caches held; absent when none were served.
	CacheHitRate *float64 `json:"cache_hit_rate,omitempty"`
}

// ClassSample is one class in an OverviewSample.
type ClassSample struct {
	Class             queue.Class `json:"class"`
	RequestsPerSecond float64     `json:"requests_per_second"` // over the 10 s before
	TTFTP99Seconds    float64     `json:"ttft_p99_seconds"`    // over the 60 s before
	ShedRate          float64     `json:"shed_rate"`           // over the 60 s before
	Queued            int         `json:"queued"`
}

// history is the ring of samples. Safe for concurrent use.
type history struct {
	mu      sync.Mutex       // guards the fields below
	samples []OverviewSample // at most historyLen, oldest first
	// prompt and cached are the fleet's token counters at the last sample; primed once read.
	prompt, cached int64
	primed         bool
}

// add appends s, with the cache hit rate since the last sample from the fleet's counters (which
// only grow, unless a worker left: then the step has no rate).
func (h *history) add(s OverviewSample, prompt, cached int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if dp, dc := prompt-h.prompt, cached-h.cached; h.primed && dp > 0 && dc >= 0 {
		r := float64(dc) / float64(dp)
		s.CacheHitRate = &r
	}
	h.prompt, h.cached, h.primed = prompt, cached, true
	if len(h.samples) == historyLen {
		h.samples = append(h.samples[:0], h.samples[1:]...)
	}
	h.samples = append(h.samples, s)
}

// list returns a copy of the samples, oldest first.
func (h *history) list() []OverviewSample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append(make([]OverviewSample, 0, len(h.samples)), h.samples...)
}

// sampleHistory samples the fleet for the Overview's charts every historyStep until ctx ends;
// Run runs it.
func (p *Plane) sampleHistory(ctx context.Context) {
	p.record()
	t := time.NewTicker(historyStep)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.record()
		}
	}
}

// record adds one sample of the fleet now. Cost: one overview.
func (p *Plane) record() {
	o, err := p.overviewNow()
	if err != nil {
		p.log.Warn("overview sample", "err", err)
		return
	}
	s := OverviewSample{At: o.At, Classes: make([]ClassSample, len(o.Classes))}
	for i, c := range o.Classes {
		s.Classes[i] = ClassSample{Class: c.Class, RequestsPerSecond: c.RequestsPerSecond, TTFTP99Seconds: c.TTFTP99Seconds,
			ShedRate: c.ShedRate, Queued: c.Queued}
	}
	var prompt, cached int64
	for _, w := range p.fleet.Workers() {
		prompt += w.PromptTokens
		cached += w.CachedTokens
	}
	p.hist.add(s, prompt, cached)
}

// historyChart is one chart of the Overview: its id, title and inline SVG.
type historyChart struct {
	ID, Title string
	SVG       template.HTML
}

// classStrokes are the classes' lines on the charts: colours far apart in hue (blue, orange,
// green, told apart also by most colour-blind readers) and a dash pattern each, so the lines
// read apart in grey too.
var classStrokes = map[queue.Class]stroke{
	queue.Interactive: {color: "#1f5bd6"},
	queue.Standard:    {color: "#d9480f", dash: "6 3"},
	queue.Batch:       {color: "#2b8a3e", dash: "1.5 2.5"},
}

// stroke is how a line is drawn: its colour and SVG dash pattern ("" for solid).
type stroke struct{ color, dash string }

// historyLegend is the key of the Overview's class lines, one sample of each line and its name.
func historyLegend() template.HTML {
	var b strings.Builder
	b.WriteString(`<div class="row small legend" id="chart-legend">`)
	for _, cl := range queue.Classes() {
		st := classStrokes[cl]
		fmt.Fprintf(&b, `<svg width="28" height="10" aria-hidden="true"><line x1="1" y1="5" x2="27" y2="5" stroke="%s" stroke-width="2"%s/></svg><span class="legend-class" data-series="%s">%s</span>`,
			st.color, dashAttr(st.dash), cl, cl)
	}
	b.WriteString(`</div>`)
	return template.HTML(b.String())
}

func dashAttr(dash string) string {
	if dash == "" {
		return ""
	}
	return ` stroke-dasharray="` + dash + `"`
}

// historyCharts draws the samples as of now: per class requests/s, TTFT p99, queue depth and
// shed rate, and the fleet's cache hit rate, each from the oldest sample (at least a minute,
// at most historyLen steps ago) to now.
func historyCharts(samples []OverviewSample, now time.Time) []historyChart {
	type metric struct {
		id, title string
		value     func(ClassSample) float64
		format    func(float64) string
	}
	number := func(v float64) string { return trimFloat(v) }
	metrics := []metric{
		{"rps", "Requests/s", func(c ClassSample) float64 { return c.RequestsPerSecond }, number},
		{"ttft", "TTFT p99 (60 s)", func(c ClassSample) float64 { return c.TTFTP99Seconds * 1000 }, milliseconds},
		{"queued", "Queued", func(c ClassSample) float64 { return float64(c.Queued) }, number},
		{"shed", "Shed rate (60 s)", func(c ClassSample) float64 { return c.ShedRate * 100 }, func(v float64) string { return trimFloat(v) + "%" }},
	}
	span := time.Minute
	if len(samples) > 0 {
		span = min(historyStep*historyLen, max(span, now.Sub(samples[0].At).Round(time.Minute)+time.Minute))
	}
	var out []historyChart
	for _, m := range metrics {
		var lines []chartLine
		for _, cl := range queue.Classes() {
			l := chartLine{name: cl.String(), stroke: classStrokes[cl]}
			for _, s := range samples {
				if int(cl) < len(s.Classes) {
					l.points = append(l.points, chartPoint{s.At, m.value(s.Classes[cl])})
				}
			}
			lines = append(lines, l)
		}
		out = append(out, historyChart{ID: m.id, Title: m.title, SVG: drawHistory(m.id, lines, now, span, m.format)})
	}
	cache := chartLine{name: "fleet", stroke: stroke{color: "#6a3d9a"}}
	for _, s := range samples {
		if s.CacheHitRate != nil {
			cache.points = append(cache.points, chartPoint{s.At, *s.CacheHitRate * 100})
		}
	}
	out = append(out, historyChart{ID: "cache", Title: "Cache hit rate",
		SVG: drawHistory("cache", []chartLine{cache}, now, span, func(v float64) string { return trimFloat(v) + "%" })})
	return out
}

type chartPoint struct {
	at time.Time
	v  float64
}

type chartLine struct {
	name   string
	stroke stroke
	points []chartPoint
}

// The charts' drawing area, in SVG units; the SVG scales to its box.
const (
	histW, histH     = 320, 130
	histLeft, histTo = 6, 314
	histTop, histBot = 14, 112
)

// drawHistory draws lines over the span before now, from 0 to a round maximum labelled with
// format.
func drawHistory(id string, lines []chartLine, now time.Time, span time.Duration, format func(float64) string) template.HTML {
	top := 0.0
	points := 0
	for _, l := range lines {
		for _, pt := range l.points {
			top = max(top, pt.v)
			points++
		}
	}
	top = roundUp(top)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" data-chart="%s" data-points="%d" viewBox="0 0 %d %d" role="img" aria-label="last %d minutes">`,
		id, points, histW, histH, int(span/time.Minute))
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#d8dce3"/><line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eef0f4"/>`,
		histLeft, histBot, histTo, histBot, histLeft, histTop, histTo, histTop)
	fmt.Fprintf(&b, `<text x="%d" y="10" font-size="9" fill="#6b7280">%s</text>`, histLeft, template.HTMLEscapeString(format(top)))
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="9" fill="#6b7280">−%d min</text><text x="%d" y="%d" font-size="9" fill="#6b7280" text-anchor="end">now</text>`,
		histLeft, histH-4, int(span/time.Minute), histTo, histH-4)
	if points == 0 {
		fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="10" fill="#9aa1ad" text-anchor="middle">collecting: a sample every %d s</text>`,
			histW/2, (histTop+histBot)/2, int(historyStep/time.Second))
	}
	px := func(at time.Time) float64 {
		return max(histLeft, histTo-(histTo-histLeft)*float64(now.Sub(at))/float64(span))
	}
	py := func(v float64) float64 { return histBot - (histBot-histTop)*v/top }
	for _, l := range lines {
		if len(l.points) == 0 {
			continue
		}
		var d strings.Builder
		for j, pt := range l.points {
			cmd := "L"
			if j == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%.1f %.1f", cmd, px(pt.at), py(pt.v))
		}
		fmt.Fprintf(&b, `<path class="line" data-series="%s" d="%s" fill="none" stroke="%s" stroke-width="1.8"%s/>`,
			template.HTMLEscapeString(l.name), d.String(), l.stroke.color, dashAttr(l.stroke.dash))
		if len(l.points) == 1 { // a path of one point draws nothing
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`, px(l.points[0].at), py(l.points[0].v), l.stroke.color)
		}
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// roundUp rounds v up to 1, 2 or 5 times a power of ten; 1 for nothing.
func roundUp(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// milliseconds labels a time in ms, from a second on in seconds.
func milliseconds(v float64) string {
	if v >= 1000 {
		return trimFloat(v/1000) + " s"
	}
	return trimFloat(v) + " ms"
}

func trimFloat(v float64) string {
	if v >= 10 || v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}
