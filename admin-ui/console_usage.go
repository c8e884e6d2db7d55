package adminui

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
)

// The console's Usage page: the usage ledger drawn server-side as SVG (no script): tokens over
// time stacked by tenant and by class, the top tenants and the cached share of prompt tokens.

// usageView is the Usage page's data.
type usageView struct {
	Tenant, Class string
	Days          int
	DayChoices    []int
	ByTenant      usageChart
	ByClass       usageChart
	Top           []tenantUsage
	Total         tenants.UsageCounts
	// CachedShare is the share of prompt tokens the engines had cached.
	CachedShare float64
	// Truncated says the range held more rows than one read returns: the oldest are left out.
	Truncated bool
}

// tenantUsage is one line of the top tenants.
type tenantUsage struct {
	Tenant string
	tenants.UsageCounts
	Tokens      int64
	CachedShare float64
}

// usageChart is a stacked bar chart, laid out for the template: one bar per time bucket, one
// rectangle per series in it.
type usageChart struct {
	Width, Height int
	Rects         []usageRect
	Legend        []usageLegend
	Max           string // the top of the scale, in tokens
	First, Last   string // the first and last bucket's times
}

// usageRect is one series of one bar, in SVG units; X and W are fractional so that the bars
// fill the width whatever their number.
type usageRect struct {
	X, W  float64
	Y, H  int
	Fill  string
	Title string
}

type usageLegend struct{ Name, Fill string }

var usagePalette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#9c755f"}

// usageTopSeries is how many tenants the chart names; the others are stacked as "other".
const usageTopSeries = 5

func (con *console) usagePage(c echo.Context) error {
	v := usageView{Tenant: c.QueryParam("tenant"), Class: c.QueryParam("class"), Days: 7, DayChoices: []int{1, 7, 30}}
	if d := c.QueryParam("days"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || n > 400 {
			return con.fail(c, "/admin/usage", gateway.BadRequest("days", "days must be a whole number from 1 to 400"))
		}
		v.Days = n
	}
	now := con.p.now().UTC()
	step := usageStep(v.Days)
	from := now.Truncate(step).Add(-time.Duration(v.Days)*24*time.Hour + step)
	rows, err := con.ta.Usage(c.Request().Context(), actorOf(c), tenants.UsageQuery{Tenant: v.Tenant, Class: v.Class, From: from})
	if err != nil {
		return con.fail(c, "/admin/usage", err)
	}
	v.Truncated = len(rows) == tenants.MaxUsageRows
	buckets := int(now.Truncate(step).Sub(from)/step) + 1
	perTenant := map[string]*tenantUsage{}
	for _, r := range rows {
		v.Total.Add(r.UsageCounts)
		t := perTenant[r.Tenant]
		if t == nil {
			t = &tenantUsage{Tenant: r.Tenant}
			perTenant[r.Tenant] = t
		}
		t.Add(r.UsageCounts)
	}
	for _, t := range perTenant {
		t.Tokens = t.PromptTokens + t.CompletionTokens
		t.CachedShare = share(t.CachedTokens, t.PromptTokens)
		v.Top = append(v.Top, *t)
	}
	slices.SortFunc(v.Top, func(a, b tenantUsage) int {
		return cmp.Or(cmp.Compare(b.Tokens, a.Tokens), cmp.Compare(a.Tenant, b.Tenant))
	})
	v.CachedShare = share(v.Total.CachedTokens, v.Total.PromptTokens)

	named := map[string]bool{}
	var tenantSeries []string
	for i, t := range v.Top {
		if i == usageTopSeries {
			tenantSeries = append(tenantSeries, "other")
			break
		}
		named[t.Tenant] = true
		tenantSeries = append(tenantSeries, t.Tenant)
	}
	classSeries := []string{tenants.ClassInteractive, tenants.ClassStandard, tenants.ClassBatch}
	byTenant, byClass := newStacks(buckets), newStacks(buckets)
	for _, r := range rows {
		i := int(r.Start.Sub(from) / step)
		if r.Start.Before(from) || i >= buckets {
			continue
		}
		name := r.Tenant
		if !named[name] {
			name = "other"
		}
		// A day the ledger rolled up (older than its hourly retention) is spread evenly over
		// its hours in an hourly chart: the hours themselves are gone.
		span := 1
		if r.Period == tenants.PeriodDay && step < 24*time.Hour {
			span = int(24 * time.Hour / step)
		}
		tokens := r.PromptTokens + r.CompletionTokens
		each := tokens / int64(span)
		for j := i; j < min(i+span, buckets); j++ {
			n := each
			if j == i {
				n += tokens - each*int64(span) // the remainder, so the day's sum is kept
			}
			byTenant[j][name] += n
			byClass[j][r.Class] += n
		}
	}
	v.ByTenant = drawStacks(byTenant, tenantSeries, from, step)
	v.ByClass = drawStacks(byClass, classSeries, from, step)
	if len(v.Top) > 20 {
		v.Top = v.Top[:20]
	}
	return con.page(c, "usage", v)
}

// usageStep is the Usage chart's bucket for a range of days: an hour up to a week, so that
// a few hours of traffic spread across the axis instead of stacking into the last day's bar
// at its right edge; a day beyond (a bar of at most a few pixels otherwise).
func usageStep(days int) time.Duration {
	if days <= 7 {
		return time.Hour
	}
	return 24 * time.Hour
}

func share(part, whole int64) float64 {
	if whole <= 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

func newStacks(n int) []map[string]int64 {
	s := make([]map[string]int64, n)
	for i := range s {
		s[i] = map[string]int64{}
	}
	return s
}

// drawStacks lays out one stacked bar per bucket, series in order from the bottom up.
func drawStacks(stacks []map[string]int64, series []string, from time.Time, step time.Duration) usageChart {
	const width, height = 720, 140
	ch := usageChart{Width: width, Height: height}
	var top int64
	for _, s := range stacks {
		var sum int64
		for _, n := range s {
			sum += n
		}
		top = max(top, sum)
	}
	for i, name := range series {
		ch.Legend = append(ch.Legend, usageLegend{Name: name, Fill: usagePalette[i%len(usagePalette)]})
	}
	layout := "2006-01-02"
	if step < 24*time.Hour {
		layout = "01-02 15:04"
	}
	ch.Max = thousands(top)
	ch.First, ch.Last = from.Format(layout), from.Add(time.Duration(len(stacks)-1)*step).Format(layout)
	if top == 0 || len(stacks) == 0 {
		return ch
	}
	barW := float64(width) / float64(len(stacks))
	gap := min(1, barW/4)
	for i, s := range stacks {
		y := height
		at := from.Add(time.Duration(i) * step).Format(layout)
		for j, name := range series {
			n := s[name]
			if n == 0 {
				continue
			}
			h := max(int(float64(n)/float64(top)*float64(height)), 1)
			y -= h
			ch.Rects = append(ch.Rects, usageRect{X: round2(float64(i) * barW), Y: y, W: round2(barW - gap), H: h,
				Fill: usagePalette[j%len(usagePalette)], Title: at + " " + name + ": " + thousands(n) + " tokens"})
		}
	}
	return ch
}

// round2 rounds to hundredths, enough for SVG units and short in the page.
func round2(v float64) float64 { return math.Round(v*100) / 100 }
