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

// SetBudget sets a budget overriding the tier's (admin only): with o.KeyID empty the tenant's
// own, else the key's. It takes effect on every replica within BudgetsOptions.Refresh.
func (a *Admin) SetBudget(ctx context.Context, actor Actor, o BudgetOverride) error {
	if err := requireAdmin(actor); err != nil {
		return err
	}
	if err := a.budgetOwner(ctx, o.TenantID, o.KeyID); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"tokens_per_day", o.TokensPerDay}, {"tokens_per_month", o.TokensPerMonth},
		{"requests_per_day", o.RequestsPerDay}, {"requests_per_month", o.RequestsPerMonth}} {
		if f.v < 0 || f.v > maxLimit {
			return invalid(f.name, "must be from 0 (no cap) to 2^53")
		}
	}
	return a.store.SetBudget(ctx, actor.Name, o)
}

// DeleteBudget removes a budget set through SetBudget (admin only): the tier's applies again.
func (a *Admin) DeleteBudget(ctx context.Context, actor Actor, tenantID, keyID string) error {
	if err := requireAdmin(actor); err != nil {
		return err
	}
	return a.store.DeleteBudget(ctx, actor.Name, tenantID, keyID)
}

// Budget returns the budget set for a tenant (keyID empty) or key, ErrNotFound when none is
// (the tier's applies). The tenant itself may read its own.
func (a *Admin) Budget(ctx context.Context, actor Actor, tenantID, keyID string) (BudgetOverride, error) {
	if err := requireTenantRead(actor, tenantID); err != nil {
		return BudgetOverride{}, err
	}
	list, err := a.store.BudgetOverrides(ctx)
	if err != nil {
		return BudgetOverride{}, err
	}
	for _, o := range list {
		if o.TenantID == tenantID && o.KeyID == keyID {
			return o, nil
		}
	}
	return BudgetOverride{}, fmt.Errorf("budget of tenant %q key %q: %w", tenantID, keyID, ErrNotFound)
}

// budgetOwner checks that the tenant exists and, when keyID is set, that the key is its.
func (a *Admin) budgetOwner(ctx context.Context, tenantID, keyID string) error {
	if a.dir.IsConfigTenant(tenantID) {
		return nil // its keys are the file's, named by their name
	}
	if _, err := a.store.Tenant(ctx, tenantID); err != nil {
		return err
	}
	if keyID == "" {
		return nil
	}
	k, err := a.store.Key(ctx, keyID)
	if err != nil {
		return err
	}
	if k.TenantID != tenantID {
		return fmt.Errorf("key %q: %w", keyID, ErrNotFound)
	}
	return nil
}
