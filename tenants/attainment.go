package tenants

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// AttainmentQuery selects the calls an attainment report covers. Empty strings select every
// tenant, tier and model.
type AttainmentQuery struct {
	Tenant, Tier, Model string
	// From and To bound the ledger rows' start: From <= start < To; both must be set. Rows are
	// hours, or days once hours are rolled up (UsageConfig.HourlyRetention).
	From, To time.Time
}

// Attainment is one tenant's report on one class: its calls' verdicts against the objectives
// over the query's window.
type Attainment struct {
	// Tier is the tenant's tier now (the ledger keeps no tier; a tenant moved between tiers is
	// reported under its present one); "" for a tenant that no longer exists.
	Tier   string `json:"tier"`
	Tenant string `json:"tenant"`
	Class  string `json:"class"`
	// Requests counts every call that reached a queue, refused or served.
	Requests         int64 `json:"requests"`
	TTFTMet          int64 `json:"ttft_met"`
	TTFTMissed       int64 `json:"ttft_missed"`
	TPOTMet          int64 `json:"tpot_met"`
	TPOTMissed       int64 `json:"tpot_missed"`
	ObjectivesMet    int64 `json:"objectives_met"`
	ObjectivesMissed int64 `json:"objectives_missed"`
	// Share is ObjectivesMet over the calls judged (met and missed); nil when none was.
	Share *float64 `json:"share"`
	// Percentile is the share (in percent) the tier's objective for the class promises; Kept
	// says Share reached it (false when nothing was judged).
	Percentile float64 `json:"percentile"`
	Kept       bool    `json:"kept"`
}

// attainmentColumns are the ledger's columns an attainment report sums.
var attainmentColumns = []string{"requests", "ttft_met", "ttft_missed", "tpot_met", "tpot_missed", "objectives_met", "objectives_missed"}

// maxAttainmentRows bounds one report: tenants times classes.
const maxAttainmentRows = MaxUsageRows

// attainment sums the ledger per tenant and class over q's window (q.Tier is not the store's).
func (s *Store) attainment(ctx context.Context, q AttainmentQuery) ([]Attainment, error) {
	where, args := []string{"start >= ?", "start < ?"}, []any{q.From.UnixMilli(), q.To.UnixMilli()}
	for _, f := range []struct{ col, v string }{{"tenant_id", q.Tenant}, {"model", q.Model}} {
		if f.v != "" {
			where, args = append(where, f.col+" = ?"), append(args, f.v)
		}
	}
	var sums []string
	for _, c := range attainmentColumns {
		sums = append(sums, "SUM("+c+")")
	}
	query := fmt.Sprintf("SELECT tenant_id, class, %s FROM usage_ledger WHERE %s GROUP BY tenant_id, class ORDER BY tenant_id, class LIMIT %d",
		strings.Join(sums, ", "), strings.Join(where, " AND "), maxAttainmentRows)
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, storageFault(fmt.Errorf("attainment: %w", err))
	}
	defer rows.Close()
	var out []Attainment
	for rows.Next() {
		var a Attainment
		if err := rows.Scan(&a.Tenant, &a.Class, &a.Requests, &a.TTFTMet, &a.TTFTMissed, &a.TPOTMet, &a.TPOTMissed,
			&a.ObjectivesMet, &a.ObjectivesMissed); err != nil {
			return nil, storageFault(fmt.Errorf("attainment: %w", err))
		}
		out = append(out, a)
	}
	if err := rows.Err(); err != nil {
		return nil, storageFault(fmt.Errorf("attainment: %w", err))
	}
	return out, nil
}

// Attainment reports, per tenant and class, how the calls in q's window fared against their
// objectives, the worst first (lowest share; the unjudged last), each with its tier's promised
// percentile. A tenant actor reads only its own tenant's. Cost: one grouped query over the
// window's ledger rows.
func (a *Admin) Attainment(ctx context.Context, actor Actor, q AttainmentQuery) ([]Attainment, error) {
	if !readsAll(actor) {
		if q.Tenant != "" && q.Tenant != actor.TenantID {
			return nil, fmt.Errorf("tenant %q: %w", q.Tenant, ErrNotFound)
		}
		q.Tenant = actor.TenantID
	}
	for _, f := range []struct{ name, v string }{{"tenant", q.Tenant}, {"tier", q.Tier}, {"model", q.Model}} {
		if len(f.v) > 200 {
			return nil, invalid(f.name, "at most 200 bytes")
		}
	}
	if q.From.IsZero() || q.To.IsZero() || !q.From.Before(q.To) {
		return nil, invalid("from", "from and to must be set, from before to")
	}
	rows, err := a.store.attainment(ctx, q)
	if err != nil {
		return nil, err
	}
	out := rows[:0]
	for _, r := range rows {
		if t, ok := a.dir.Tenant(r.Tenant); ok {
			r.Tier = t.Tier
		}
		if q.Tier != "" && r.Tier != q.Tier {
			continue
		}
		if tier, ok := a.dir.Tier(r.Tier); ok {
			r.Percentile = tier.Objective(r.Class).Percentile
		}
		if judged := r.ObjectivesMet + r.ObjectivesMissed; judged > 0 {
			share := float64(r.ObjectivesMet) / float64(judged)
			r.Share = &share
			r.Kept = r.Percentile > 0 && share*100 >= r.Percentile
		}
		out = append(out, r)
	}
	slices.SortStableFunc(out, func(x, y Attainment) int {
		switch {
		case x.Share == nil || y.Share == nil:
			return boolRank(x.Share == nil) - boolRank(y.Share == nil)
		case *x.Share != *y.Share:
			return cmp.Compare(*x.Share, *y.Share)
		}
		return cmp.Compare(y.ObjectivesMissed, x.ObjectivesMissed)
	})
	return out, nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}
