package tenants

import (
	"context"
	"fmt"
)

// Usage returns the usage ledger rows q selects. A tenant actor reads only its own tenant's
// rows: asking for another tenant is ErrNotFound, as for every other object of the tenant.
func (a *Admin) Usage(ctx context.Context, actor Actor, q UsageQuery) ([]UsageRow, error) {
	if !readsAll(actor) {
		if q.Tenant != "" && q.Tenant != actor.TenantID {
			return nil, fmt.Errorf("tenant %q: %w", q.Tenant, ErrNotFound)
		}
		q.Tenant = actor.TenantID
	}
	for _, f := range []struct{ name, v string }{{"tenant", q.Tenant}, {"key", q.Key}, {"model", q.Model}, {"class", q.Class}} {
		if len(f.v) > 200 {
			return nil, invalid(f.name, "at most 200 bytes")
		}
	}
	if !q.From.IsZero() && !q.To.IsZero() && !q.From.Before(q.To) {
		return nil, invalid("from", "must be before to")
	}
	return a.store.Usage(ctx, q)
}
