package tenants

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// BudgetOverride is a budget set through the admin API. With KeyID empty it replaces the tier's
// budget for the tenant; with KeyID set it caps that key's own spending, beside its tenant's
// budget. 0 means no cap; the tier's soft threshold applies.
type BudgetOverride struct {
	TenantID         string `json:"tenant_id"`
	KeyID            string `json:"key_id,omitempty"`
	TokensPerDay     int64  `json:"tokens_per_day"`
	TokensPerMonth   int64  `json:"tokens_per_month"`
	RequestsPerDay   int64  `json:"requests_per_day"`
	RequestsPerMonth int64  `json:"requests_per_month"`
}

func (o BudgetOverride) capped() bool {
	return o.TokensPerDay > 0 || o.TokensPerMonth > 0 || o.RequestsPerDay > 0 || o.RequestsPerMonth > 0
}

func (o BudgetOverride) object() string {
	if o.KeyID != "" {
		return "key:" + o.KeyID
	}
	return "tenant:" + o.TenantID
}

// SetBudget stores o, replacing the override of the same tenant and key.
func (s *Store) SetBudget(ctx context.Context, actor string, o BudgetOverride) error {
	return s.change(ctx, actor, "budget.set", o.TenantID, o.object(), o, func(tx *sql.Tx, _ time.Time) error {
		_, err := tx.ExecContext(ctx, s.q(`INSERT INTO budgets (tenant_id, key_id, tokens_per_day, tokens_per_month, requests_per_day, requests_per_month)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (tenant_id, key_id) DO UPDATE SET tokens_per_day = excluded.tokens_per_day,
			tokens_per_month = excluded.tokens_per_month, requests_per_day = excluded.requests_per_day, requests_per_month = excluded.requests_per_month`),
			o.TenantID, o.KeyID, o.TokensPerDay, o.TokensPerMonth, o.RequestsPerDay, o.RequestsPerMonth)
		return err
	})
}

// DeleteBudget removes the override of a tenant (keyID empty) or key; ErrNotFound when none.
func (s *Store) DeleteBudget(ctx context.Context, actor, tenantID, keyID string) error {
	o := BudgetOverride{TenantID: tenantID, KeyID: keyID}
	return s.change(ctx, actor, "budget.delete", tenantID, o.object(), nil, func(tx *sql.Tx, _ time.Time) error {
		res, err := tx.ExecContext(ctx, s.q(`DELETE FROM budgets WHERE tenant_id = ? AND key_id = ?`), tenantID, keyID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err == nil && n == 0 {
			err = fmt.Errorf("budget of %s: %w", o.object(), ErrNotFound)
		}
		return err
	})
}

// BudgetOverrides returns every override.
func (s *Store) BudgetOverrides(ctx context.Context) ([]BudgetOverride, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tenant_id, key_id, tokens_per_day, tokens_per_month, requests_per_day, requests_per_month FROM budgets`)
	if err != nil {
		return nil, storageFault(fmt.Errorf("budgets: %w", err))
	}
	defer rows.Close()
	var out []BudgetOverride
	for rows.Next() {
		var o BudgetOverride
		if err := rows.Scan(&o.TenantID, &o.KeyID, &o.TokensPerDay, &o.TokensPerMonth, &o.RequestsPerDay, &o.RequestsPerMonth); err != nil {
			return nil, storageFault(fmt.Errorf("budgets: %w", err))
		}
		out = append(out, o)
	}
	return out, storageFault(rows.Err())
}
