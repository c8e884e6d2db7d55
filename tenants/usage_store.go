package tenants

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// Ledger periods.
const (
	PeriodHour = "hour"
	PeriodDay  = "day"
)

// UsageRow is one row of the ledger.
type UsageRow struct {
	UsageKey
	Period string `json:"period"` // PeriodHour or PeriodDay
	UsageCounts
}

// UsageQuery selects ledger rows. Empty strings and zero times select everything.
type UsageQuery struct {
	Tenant, Key, Model, Class string
	// From and To bound the rows' start: From <= start < To.
	From, To time.Time
	// Limit caps the rows returned (newest first); 0 or more than MaxUsageRows: MaxUsageRows.
	Limit int
}

// MaxUsageRows is the most rows one Usage call returns.
const MaxUsageRows = 10_000

var upsertUsage = func() string {
	cols := strings.Join(usageColumns[:], ", ")
	var sets []string
	for _, c := range usageColumns {
		sets = append(sets, c+" = usage_ledger."+c+" + excluded."+c)
	}
	return "INSERT INTO usage_ledger (period, start, tenant_id, key_id, model, class, " + cols + ") VALUES (" +
		strings.Repeat("?, ", 6+len(usageColumns)-1) + "?) ON CONFLICT (period, start, tenant_id, key_id, model, class) DO UPDATE SET " +
		strings.Join(sets, ", ")
}()

// AddUsage adds hours of usage to the ledger in one transaction. When batch is not empty it
// names the batch: a batch already added is not added again (see usage_folds), so a batch
// retried after a failure that hid its success counts once.
func (s *Store) AddUsage(ctx context.Context, batch string, rows map[UsageKey]UsageCounts) error {
	if len(rows) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	defer tx.Rollback()
	if batch != "" {
		res, err := tx.ExecContext(ctx, s.q("INSERT INTO usage_folds (id, at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"),
			batch, s.now().UnixMilli())
		if err != nil {
			return fmt.Errorf("usage: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil || n == 0 {
			return err // added before
		}
	}
	if err := s.upsertUsage(ctx, tx, PeriodHour, rows); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	return nil
}

func (s *Store) upsertUsage(ctx context.Context, tx *sql.Tx, period string, rows map[UsageKey]UsageCounts) error {
	stmt, err := tx.PrepareContext(ctx, s.q(upsertUsage))
	if err != nil {
		return fmt.Errorf("usage: %w", err)
	}
	defer stmt.Close()
	args := make([]any, 0, 6+len(usageColumns))
	for k, c := range rows {
		args = append(args[:0], period, k.Start.UnixMilli(), k.Tenant, k.Key, k.Model, k.Class)
		for _, f := range c.fields() {
			args = append(args, *f)
		}
		if _, err := stmt.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("usage: %w", err)
		}
	}
	return nil
}

// Usage returns the ledger rows q selects, newest first.
func (s *Store) Usage(ctx context.Context, q UsageQuery) ([]UsageRow, error) {
	var where []string
	var args []any
	for _, f := range []struct{ col, v string }{{"tenant_id", q.Tenant}, {"key_id", q.Key}, {"model", q.Model}, {"class", q.Class}} {
		if f.v != "" {
			where, args = append(where, f.col+" = ?"), append(args, f.v)
		}
	}
	if !q.From.IsZero() {
		where, args = append(where, "start >= ?"), append(args, q.From.UnixMilli())
	}
	if !q.To.IsZero() {
		where, args = append(where, "start < ?"), append(args, q.To.UnixMilli())
	}
	query := "SELECT period, start, tenant_id, key_id, model, class, " + strings.Join(usageColumns[:], ", ") + " FROM usage_ledger"
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	limit := q.Limit
	if limit <= 0 || limit > MaxUsageRows {
		limit = MaxUsageRows
	}
	query += fmt.Sprintf(" ORDER BY start DESC, tenant_id, key_id, model, class LIMIT %d", limit)
	rows, err := s.db.QueryContext(ctx, s.q(query), args...)
	if err != nil {
		return nil, storageFault(fmt.Errorf("usage: %w", err))
	}
	defer rows.Close()
	var out []UsageRow
	for rows.Next() {
		var r UsageRow
		var start int64
		dst := []any{&r.Period, &start, &r.Tenant, &r.Key, &r.Model, &r.Class}
		for _, f := range r.fields() {
			dst = append(dst, f)
		}
		if err := rows.Scan(dst...); err != nil {
			return nil, storageFault(fmt.Errorf("usage: %w", err))
		}
		r.Start = time.UnixMilli(start).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, storageFault(fmt.Errorf("usage: %w", err))
	}
	return out, nil
}

// RollUp folds the hours that started before hoursBefore into their days, deletes the days that
// started before daysBefore, and forgets the names of batches added more than foldMemory ago. The hours are taken with DELETE ... RETURNING in the rollup's own transaction, so two
// replicas rolling up at once never count an hour twice.
func (s *Store) RollUp(ctx context.Context, hoursBefore, daysBefore time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, s.q("DELETE FROM usage_ledger WHERE period = ? AND start < ? RETURNING start, tenant_id, key_id, model, class, "+
		strings.Join(usageColumns[:], ", ")), PeriodHour, hoursBefore.UnixMilli())
	if err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	days := map[UsageKey]UsageCounts{}
	for rows.Next() {
		var k UsageKey
		var c UsageCounts
		var start int64
		dst := []any{&start, &k.Tenant, &k.Key, &k.Model, &k.Class}
		for _, f := range c.fields() {
			dst = append(dst, f)
		}
		if err := rows.Scan(dst...); err != nil {
			rows.Close()
			return fmt.Errorf("usage rollup: %w", err)
		}
		k.Start = dayOf(time.UnixMilli(start))
		sum := days[k]
		sum.Add(c)
		days[k] = sum
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	if err := s.upsertUsage(ctx, tx, PeriodDay, days); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM usage_ledger WHERE period = ? AND start < ?"), PeriodDay, daysBefore.UnixMilli()); err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	if _, err := tx.ExecContext(ctx, s.q("DELETE FROM usage_folds WHERE at < ?"), s.now().Add(-foldMemory).UnixMilli()); err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("usage rollup: %w", err)
	}
	return nil
}

// foldMemory is how long the names of added batches are kept: far longer than a batch waits in
// Redis to be folded again (the next fold, a FlushInterval later, unless the store is down).
const foldMemory = 24 * time.Hour
