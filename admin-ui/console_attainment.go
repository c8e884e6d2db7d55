package adminui

import (
	"cmp"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
)

// The console's Attainment page: how each tier and each tenant fared against the latency
// objectives over the last days, from the usage ledger, the worst tenants first.

// attainmentView is the Attainment page's data.
type attainmentView struct {
	Tier       string
	Days       int
	DayChoices []int
	// Tiers sums the tenants of each tier per class, in the tenants' order (the worst first).
	Tiers []tenants.Attainment
	// Tenants are the per tenant and class rows, the worst first.
	Tenants []tenants.Attainment
}

// attainmentRows bounds the tenants' table: the worst are what the page is for.
const attainmentRows = 100

func (con *console) attainmentPage(c echo.Context) error {
	v := attainmentView{Tier: c.QueryParam("tier"), Days: 1, DayChoices: []int{1, 7, 30}}
	if d := c.QueryParam("days"); d != "" {
		n, err := strconv.Atoi(d)
		if err != nil || n < 1 || n > 400 {
			return con.fail(c, "/admin/attainment", gateway.BadRequest("days", "days must be a whole number from 1 to 400"))
		}
		v.Days = n
	}
	now := con.p.now().UTC()
	rows, err := con.ta.Attainment(c.Request().Context(), actorOf(c), tenants.AttainmentQuery{Tier: v.Tier,
		From: now.Truncate(time.Hour).Add(-time.Duration(v.Days) * 24 * time.Hour), To: now.Add(time.Hour)})
	if err != nil {
		return con.fail(c, "/admin/attainment", err)
	}
	v.Tiers = tierAttainment(rows)
	v.Tenants = rows[:min(len(rows), attainmentRows)]
	return con.page(c, "attainment", v)
}

// tierAttainment sums rows per tier and class, the worst first.
func tierAttainment(rows []tenants.Attainment) []tenants.Attainment {
	type key struct{ tier, class string }
	sums := map[key]*tenants.Attainment{}
	var order []key
	for _, r := range rows {
		k := key{r.Tier, r.Class}
		s := sums[k]
		if s == nil {
			s = &tenants.Attainment{Tier: r.Tier, Class: r.Class, Percentile: r.Percentile}
			sums[k] = s
			order = append(order, k)
		}
		s.Requests += r.Requests
		s.ObjectivesMet += r.ObjectivesMet
		s.ObjectivesMissed += r.ObjectivesMissed
		s.TTFTMet, s.TTFTMissed = s.TTFTMet+r.TTFTMet, s.TTFTMissed+r.TTFTMissed
		s.TPOTMet, s.TPOTMissed = s.TPOTMet+r.TPOTMet, s.TPOTMissed+r.TPOTMissed
	}
	out := make([]tenants.Attainment, 0, len(order))
	for _, k := range order {
		s := sums[k]
		if judged := s.ObjectivesMet + s.ObjectivesMissed; judged > 0 {
			share := float64(s.ObjectivesMet) / float64(judged)
			s.Share = &share
			s.Kept = s.Percentile > 0 && share*100 >= s.Percentile
		}
		out = append(out, *s)
	}
	slices.SortStableFunc(out, func(x, y tenants.Attainment) int {
		if x.Share == nil || y.Share == nil {
			return cmp.Compare(boolInt(x.Share == nil), boolInt(y.Share == nil))
		}
		return cmp.Compare(*x.Share, *y.Share)
	})
	return out
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
