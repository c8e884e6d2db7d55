package gateway

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The fleet's admin actions. The JSON API and the console both call them, so the console can do
// nothing the API cannot; each one audits itself and keeps the queues' capacity in step.

func (s *Server) addWorkerAction(c echo.Context, spec routing.WorkerSpec) error {
	if err := s.pool.Add(spec); err != nil {
		return err
	}
	s.audit(c, "worker.add", spec.ID)
	s.dispatcher.refresh()
	return nil
}

func (s *Server) removeWorkerAction(c echo.Context, id string) error {
	if err := s.pool.Remove(id); err != nil {
		return err
	}
	s.audit(c, "worker.remove", id)
	s.dispatcher.refresh()
	return nil
}

// drainWorkerAction stops new requests to the worker and takes its pins off it, so each pinned
// session or key is pinned anew, elsewhere, at its next request; in-flight requests finish.
func (s *Server) drainWorkerAction(c echo.Context, id string) error {
	ctx := c.Request().Context()
	if err := s.pool.Drain(ctx, id); err != nil {
		return err
	}
	s.audit(c, "worker.drain", id)
	s.dispatcher.refresh()
	pins, err := s.pool.Pins(ctx, routing.PinFilter{Worker: id})
	if err != nil {
		return fmt.Errorf("worker %s drains, but its pins could not be listed: %w", id, err)
	}
	for _, p := range pins {
		if err := s.pool.Unpin(ctx, p.Model, p.Tenant, p.Key); err != nil {
			return fmt.Errorf("worker %s drains, but its pins could not all be moved: %w", id, err)
		}
	}
	return nil
}

func (s *Server) undrainWorkerAction(c echo.Context, id string) error {
	if err := s.pool.Undrain(c.Request().Context(), id); err != nil {
		return err
	}
	s.audit(c, "worker.undrain", id)
	s.dispatcher.refresh()
	return nil
}

// findPins lists the pins f selects, narrowed to the session or routing key key when it is set,
// ordered by model, tenant and key. Never nil.
func (s *Server) findPins(ctx context.Context, f routing.PinFilter, key string) ([]routing.Pin, error) {
	pins, err := s.pool.Pins(ctx, f)
	if err != nil {
		return nil, err
	}
	out := make([]routing.Pin, 0, len(pins))
	for _, p := range pins {
		if key == "" || p.Key == key {
			out = append(out, p)
		}
	}
	return out, nil
}

func (s *Server) pinAction(c echo.Context, r pinRequest) error {
	if r.Model == "" || r.Tenant == "" || r.Key == "" || r.Worker == "" {
		return BadRequest("", "model, tenant, key and worker are required")
	}
	if r.TTLSeconds < 0 {
		return BadRequest("ttl_seconds", "ttl_seconds must not be negative")
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if err := s.pool.Pin(c.Request().Context(), r.Model, r.Tenant, r.Key, r.Worker, ttl); err != nil {
		return err
	}
	s.audit(c, "pin.set", r.Model+"/"+r.Tenant+"/"+r.Key+"->"+r.Worker)
	return nil
}

func (s *Server) unpinAction(c echo.Context, model, tenant, key string) error {
	if model == "" || tenant == "" || key == "" {
		return BadRequest("", "model, tenant and key are required")
	}
	if err := s.pool.Unpin(c.Request().Context(), model, tenant, key); err != nil {
		return err
	}
	s.audit(c, "pin.delete", model+"/"+tenant+"/"+key)
	return nil
}

// movePinsAction pins every session and key pinned to r.From to r.To instead and returns how
// many moved. Pins of models r.To does not serve are refused by the pool: the move stops there.
func (s *Server) movePinsAction(c echo.Context, r movePinsRequest) (int, error) {
	if r.From == "" || r.To == "" {
		return 0, BadRequest("", "from and to are required")
	}
	if r.TTLSeconds < 0 {
		return 0, BadRequest("ttl_seconds", "ttl_seconds must not be negative")
	}
	ctx := c.Request().Context()
	if _, err := s.pool.Worker(r.From); err != nil {
		return 0, err
	}
	pins, err := s.pool.Pins(ctx, routing.PinFilter{Worker: r.From})
	if err != nil {
		return 0, err
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	for i, p := range pins {
		if err := s.pool.Pin(ctx, p.Model, p.Tenant, p.Key, r.To, ttl); err != nil {
			return i, fmt.Errorf("moved %d of %d pins: %w", i, len(pins), err)
		}
	}
	s.audit(c, "pin.move", fmt.Sprintf("%s->%s (%d)", r.From, r.To, len(pins)))
	return len(pins), nil
}

// queueViews snapshots every model's queue.
func (s *Server) queueViews() ([]queueView, error) {
	out := []queueView{}
	for _, model := range s.pool.Models() {
		q, err := s.dispatcher.queueFor(model)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", model, err)
		}
		out = append(out, queueView{Model: model, Snapshot: q.Snapshot()})
	}
	return out, nil
}

// sortWorkers orders workers by ID.
func sortWorkers(ws []routing.WorkerStatus) {
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID < ws[j].ID })
}

// searchTenants keeps the tenants whose id or name contains q, ignoring case; q empty keeps all.
func searchTenants(list []tenants.Tenant, q string) []tenants.Tenant {
	q = strings.ToLower(strings.TrimSpace(q))
	if q == "" {
		return list
	}
	var out []tenants.Tenant
	for _, t := range list {
		if strings.Contains(strings.ToLower(t.ID), q) || strings.Contains(strings.ToLower(t.Name), q) {
			out = append(out, t)
		}
	}
	return out
}
