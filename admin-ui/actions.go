package adminui

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The fleet's admin actions. The JSON API and the console both call them, so the console can do
// nothing the API cannot; each one audits itself and keeps the queues' capacity in step.

func (p *Plane) addWorkerAction(c echo.Context, spec routing.WorkerSpec) error {
	if err := p.fleet.AddWorker(c.Request().Context(), spec); err != nil {
		return err
	}
	p.audit(c, "worker.add", spec.ID)
	p.live.FleetChanged()
	return nil
}

func (p *Plane) updateWorkerAction(c echo.Context, spec routing.WorkerSpec) error {
	if err := p.fleet.UpdateWorker(c.Request().Context(), spec); err != nil {
		return err
	}
	p.audit(c, "worker.update", spec.ID)
	p.live.FleetChanged()
	return nil
}

func (p *Plane) removeWorkerAction(c echo.Context, id string) error {
	if err := p.fleet.RemoveWorker(c.Request().Context(), id); err != nil {
		return err
	}
	p.audit(c, "worker.remove", id)
	p.live.FleetChanged()
	return nil
}

// drainWorkerAction stops new requests to the worker and unpins its sessions and keys (Drain),
// so each is pinned anew, elsewhere, at its next request; in-flight requests finish.
func (p *Plane) drainWorkerAction(c echo.Context, id string) error {
	if err := p.fleet.Drain(c.Request().Context(), id); err != nil {
		return err
	}
	p.audit(c, "worker.drain", id)
	p.live.FleetChanged()
	return nil
}

func (p *Plane) undrainWorkerAction(c echo.Context, id string) error {
	if err := p.fleet.Undrain(c.Request().Context(), id); err != nil {
		return err
	}
	p.audit(c, "worker.undrain", id)
	p.live.FleetChanged()
	return nil
}

// Pin listings come a page at a time: a store may hold millions of pins (one per session).
const (
	defaultPinPage = 100
	maxPinPage     = 1000
)

// findPins lists a page of the pins f selects, narrowed to the session or routing key key when
// it is set, ordered by model, tenant and key, and says where the next page starts: "" when
// this one is the last. after is the cursor of the page before ("" for the first). Never nil.
func (p *Plane) findPins(ctx context.Context, f routing.PinFilter, key, after string, limit int) ([]routing.Pin, string, error) {
	f.Key, f.Limit = key, limit+1 // one more than the page tells whether another follows
	if after != "" {
		k, err := decodePinCursor(after)
		if err != nil {
			return nil, "", err
		}
		f.After = &k
	}
	pins, err := p.fleet.Pins(ctx, f)
	if err != nil {
		return nil, "", err
	}
	next := ""
	if len(pins) > limit {
		pins = pins[:limit]
		next = encodePinCursor(pins[len(pins)-1].PinKey)
	}
	if pins == nil {
		pins = []routing.Pin{}
	}
	return pins, next, nil
}

// encodePinCursor makes the opaque cursor of the page after k.
func encodePinCursor(k routing.PinKey) string {
	b, _ := json.Marshal([3]string{k.Model, k.Tenant, k.Key})
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePinCursor(s string) (routing.PinKey, error) {
	var parts [3]string
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		err = json.Unmarshal(b, &parts)
	}
	if err != nil || len(s) > 4096 {
		return routing.PinKey{}, gateway.BadRequest("after", "after must be the next value of a previous page")
	}
	return routing.PinKey{Model: parts[0], Tenant: parts[1], Key: parts[2]}, nil
}

// pinPageSize reads the limit parameter of a pin listing: default defaultPinPage, at most
// maxPinPage.
func pinPageSize(v string) (int, error) {
	if v == "" {
		return defaultPinPage, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPinPage {
		return 0, gateway.BadRequest("limit", "limit must be an integer from 1 to %d", maxPinPage)
	}
	return n, nil
}

func (p *Plane) pinAction(c echo.Context, r pinRequest) error {
	if r.Model == "" || r.Tenant == "" || r.Key == "" || r.Worker == "" {
		return gateway.BadRequest("", "model, tenant, key and worker are required")
	}
	if r.TTLSeconds < 0 {
		return gateway.BadRequest("ttl_seconds", "ttl_seconds must not be negative")
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if err := p.fleet.Pin(c.Request().Context(), r.Model, r.Tenant, r.Key, r.Worker, ttl); err != nil {
		return err
	}
	p.audit(c, "pin.set", r.Model+"/"+r.Tenant+"/"+r.Key+"->"+r.Worker)
	return nil
}

func (p *Plane) unpinAction(c echo.Context, model, tenant, key string) error {
	if model == "" || tenant == "" || key == "" {
		return gateway.BadRequest("", "model, tenant and key are required")
	}
	if err := p.fleet.Unpin(c.Request().Context(), model, tenant, key); err != nil {
		return err
	}
	p.audit(c, "pin.delete", model+"/"+tenant+"/"+key)
	return nil
}

// movePinsAction pins every session and key pinned to r.From to r.To instead and returns how
// many moved. Pins of models r.To does not serve are refused by the pool: the move stops there.
func (p *Plane) movePinsAction(c echo.Context, r movePinsRequest) (int, error) {
	if r.From == "" || r.To == "" {
		return 0, gateway.BadRequest("", "from and to are required")
	}
	if r.TTLSeconds < 0 {
		return 0, gateway.BadRequest("ttl_seconds", "ttl_seconds must not be negative")
	}
	ctx := c.Request().Context()
	if _, err := p.fleet.Worker(r.From); err != nil {
		return 0, err
	}
	pins, err := p.fleet.Pins(ctx, routing.PinFilter{Worker: r.From})
	if err != nil {
		return 0, err
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	for i, pin := range pins {
		if err := p.fleet.Pin(ctx, pin.Model, pin.Tenant, pin.Key, r.To, ttl); err != nil {
			return i, fmt.Errorf("moved %d of %d pins: %w", i, len(pins), err)
		}
	}
	p.audit(c, "pin.move", fmt.Sprintf("%s->%s (%d)", r.From, r.To, len(pins)))
	return len(pins), nil
}

// queueViews snapshots every model's queue.
func (p *Plane) queueViews() ([]queueView, error) {
	out := []queueView{}
	for _, model := range p.fleet.Models() {
		snap, err := p.live.QueueSnapshot(model)
		if err != nil {
			return nil, fmt.Errorf("model %q: %w", model, err)
		}
		out = append(out, queueView{Model: model, Snapshot: snap})
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
