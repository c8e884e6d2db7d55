package tenants

import (
	"context"
	"fmt"
	"time"
)

// StoredWorker is a worker added through the admin API at run time, kept in the store so every
// replica runs it and a restart finds it again. The store does not read Spec: it is the worker's
// declaration as JSON, owned by the routing side (routing.WorkerSpec).
type StoredWorker struct {
	ID      string
	Spec    []byte
	Created time.Time
	Updated time.Time
}

// Workers returns every stored worker, ordered by id. One query over a table of a few rows.
func (s *Store) Workers(ctx context.Context) ([]StoredWorker, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, spec, created_at_ms, updated_at_ms FROM workers ORDER BY id`)
	if err != nil {
		return nil, storageFault(fmt.Errorf("read workers: %w", err))
	}
	defer rows.Close()
	var out []StoredWorker
	for rows.Next() {
		var w StoredWorker
		var spec string
		var created, updated int64
		if err := rows.Scan(&w.ID, &spec, &created, &updated); err != nil {
			return nil, storageFault(fmt.Errorf("read workers: %w", err))
		}
		w.Spec, w.Created, w.Updated = []byte(spec), time.UnixMilli(created), time.UnixMilli(updated)
		out = append(out, w)
	}
	return out, storageFault(rows.Err())
}

// CreateWorker stores a new worker; ErrConflict when the id is taken.
func (s *Store) CreateWorker(ctx context.Context, id string, spec []byte) error {
	now := s.now().UnixMilli()
	_, err := s.db.ExecContext(ctx, s.q(`INSERT INTO workers (id, spec, created_at_ms, updated_at_ms) VALUES (?, ?, ?, ?)`), id, string(spec), now, now)
	if err != nil {
		// The primary key refused it (a concurrent creation), or the database failed.
		var n int
		if qerr := s.db.QueryRowContext(ctx, s.q(`SELECT COUNT(*) FROM workers WHERE id = ?`), id).Scan(&n); qerr == nil && n > 0 {
			return fmt.Errorf("worker %q: %w", id, ErrConflict)
		}
		return storageFault(fmt.Errorf("create worker %q: %w", id, err))
	}
	return nil
}

// UpdateWorker replaces the declaration of a stored worker; ErrNotFound when there is none.
func (s *Store) UpdateWorker(ctx context.Context, id string, spec []byte) error {
	err := exactlyOne(s.db.ExecContext(ctx, s.q(`UPDATE workers SET spec = ?, updated_at_ms = ? WHERE id = ?`), string(spec), s.now().UnixMilli(), id))
	if err != nil {
		return storageFault(fmt.Errorf("update worker %q: %w", id, err))
	}
	return nil
}

// DeleteWorker removes a stored worker; ErrNotFound when there is none.
func (s *Store) DeleteWorker(ctx context.Context, id string) error {
	if err := exactlyOne(s.db.ExecContext(ctx, s.q(`DELETE FROM workers WHERE id = ?`), id)); err != nil {
		return storageFault(fmt.Errorf("delete worker %q: %w", id, err))
	}
	return nil
}
