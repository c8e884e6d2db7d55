package adminui

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// maxAdminBody bounds an admin API request body.
const maxAdminBody = 64 << 10

const actorKey = "usher.admin"

// apiPrefix is the path of the admin JSON API.
const apiPrefix = "/admin/api/v1"

// registerAPI mounts the admin JSON API under /admin/api/v1: the fleet (workers, pins, queue,
// overview) for the admin and the viewer, and, with the tenant admin service, tenants, keys,
// tiers and the audit log. The viewer may only read (GET); its changes are refused with 403.
// openapi.yaml documents every route, served at openAPIPath.
func (p *Plane) registerAPI(e *echo.Echo, auth Authenticator) {
	e.GET(openAPIPath, serveOpenAPI)
	g := e.Group(apiPrefix, p.adminAuth(auth), readOnlyGuard)
	fleet := g.Group("", adminOnly)
	fleet.GET("/workers", p.listWorkers)
	fleet.POST("/workers", p.addWorker)
	fleet.GET("/workers/:id", p.getWorker)
	fleet.PUT("/workers/:id", p.updateWorker)
	fleet.DELETE("/workers/:id", p.removeWorker)
	fleet.POST("/workers/:id/drain", p.drainWorker)
	fleet.POST("/workers/:id/undrain", p.undrainWorker)
	fleet.GET("/pins", p.listPins)
	fleet.POST("/pins", p.pin)
	fleet.DELETE("/pins", p.unpin)
	fleet.POST("/pins/move", p.movePins)
	fleet.GET("/queue", p.queueSnapshot)
	fleet.GET("/overview", p.overviewAPI)
	fleet.GET("/fleet", p.fleetAPI)
	fleet.GET("/console-sessions", p.listSessionsAPI)
	fleet.DELETE("/console-sessions/:id", p.endSessionAPI)
	if p.ta != nil {
		registerTenantAdmin(g, p.ta)
	}
}

// adminOnly refuses tenant actors: the fleet is the operator's (the viewer reads it).
func adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if a := actorOf(c); !a.Admin && !a.Viewer {
			return gateway.WriteError(c, gateway.ErrAdminRequired)
		}
		return next(c)
	}
}

// readOnlyGuard refuses every change by a read-only actor, whatever the route.
func readOnlyGuard(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if m := c.Request().Method; actorOf(c).ReadOnly() && m != http.MethodGet && m != http.MethodHead {
			return gateway.WriteError(c, gateway.ErrReadOnlyActor)
		}
		return next(c)
	}
}

func actorOf(c echo.Context) tenants.Actor {
	a, _ := c.Get(actorKey).(tenants.Actor)
	return a
}

// errNoAdminCredential is the answer to an admin API call without a bearer credential.
var errNoAdminCredential = fmt.Errorf("%w: send 'Authorization: Bearer <admin token>'", gateway.ErrAdminCredential)

// adminAuth admits admin API calls whose bearer credential auth accepts, and sets their actor.
// A refused credential counts against the client's sign-in attempts and is never repeated in
// the answer.
func (p *Plane) adminAuth(auth Authenticator) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			cred, ok := tenants.BearerCredential(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				return gateway.WriteError(c, errNoAdminCredential)
			}
			if err := p.checkAttempts(c); err != nil {
				return gateway.WriteError(c, err)
			}
			actor, err := auth.AuthenticateActor(c.Request().Context(), cred)
			if err != nil {
				p.failedAttempt(c, "api.auth.refused")
				return gateway.WriteError(c, gateway.ErrAdminCredential)
			}
			p.acceptedAttempt(c)
			c.Set(actorKey, actor)
			return next(c)
		}
	}
}

// decodeAdminBody reads a JSON object of at most maxAdminBody bytes into v, refusing unknown
// fields, so a typo is an error rather than a silently ignored setting.
func decodeAdminBody(c echo.Context, v any) error {
	r := c.Request()
	if ct := r.Header.Get(echo.HeaderContentType); ct != "" && !strings.HasPrefix(ct, echo.MIMEApplicationJSON) {
		return gateway.BadRequest("", "Content-Type must be application/json")
	}
	data, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxAdminBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return gateway.TooLarge(maxAdminBody)
	}
	if err != nil {
		return gateway.BadRequest("", "reading the body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return gateway.BadRequest("", "the body is not a valid JSON object for this call: %v", err)
	}
	if dec.More() {
		return gateway.BadRequest("", "the body has data after the JSON object")
	}
	return nil
}

// adminError answers an admin call's error in OpenAI's shape with the status its cause calls
// for (Invalid: the domain packages' validation errors are the caller's).
func adminError(c echo.Context, err error) error { return gateway.WriteError(c, gateway.Invalid(err)) }

// audit records a fleet change (a worker or pin change, which lives in the pool and Redis) in the
// process log and, when the tenant admin service is wired, in the SQL audit log beside the
// tenant and key changes.
func (p *Plane) audit(c echo.Context, action, object string) {
	p.log.Info("admin", "actor", actorOf(c).Name, "action", action, "object", object,
		"id", c.Response().Header().Get(echo.HeaderXRequestID))
	if p.ta == nil {
		return
	}
	// The change is made; an audit write that fails is logged, never undoes it.
	if err := p.ta.Record(c.Request().Context(), actorOf(c), action, object, nil); err != nil {
		p.log.Error("audit log write failed", "action", action, "object", object, "err", err)
	}
}

func (p *Plane) listWorkers(c echo.Context) error {
	workers := p.fleet.Workers()
	sortWorkers(workers)
	return c.JSON(http.StatusOK, map[string]any{"workers": workers})
}

func (p *Plane) getWorker(c echo.Context) error {
	w, err := p.fleet.Worker(c.Param("id"))
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, w)
}

func (p *Plane) addWorker(c echo.Context) error {
	var spec routing.WorkerSpec
	if err := decodeAdminBody(c, &spec); err != nil {
		return adminError(c, err)
	}
	if err := p.addWorkerAction(c, spec); err != nil {
		return adminError(c, err)
	}
	return p.getWorkerStatus(c, spec.ID, http.StatusCreated)
}

// updateWorker changes a worker added through the admin API; the body is the whole new
// declaration, its id (when given) the path's.
func (p *Plane) updateWorker(c echo.Context) error {
	var spec routing.WorkerSpec
	if err := decodeAdminBody(c, &spec); err != nil {
		return adminError(c, err)
	}
	if spec.ID == "" {
		spec.ID = c.Param("id")
	}
	if spec.ID != c.Param("id") {
		return adminError(c, gateway.BadRequest("id", "the body's id must be the path's"))
	}
	if err := p.updateWorkerAction(c, spec); err != nil {
		return adminError(c, err)
	}
	return p.getWorkerStatus(c, spec.ID, http.StatusOK)
}

func (p *Plane) removeWorker(c echo.Context) error {
	if err := p.removeWorkerAction(c, c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// drainWorker stops new requests to the worker and takes its pins off it, so each pinned
// session or key is pinned anew, elsewhere, at its next request; in-flight requests finish.
func (p *Plane) drainWorker(c echo.Context) error {
	id := c.Param("id")
	if err := p.drainWorkerAction(c, id); err != nil {
		return adminError(c, err)
	}
	return p.getWorkerStatus(c, id, http.StatusOK)
}

func (p *Plane) undrainWorker(c echo.Context) error {
	id := c.Param("id")
	if err := p.undrainWorkerAction(c, id); err != nil {
		return adminError(c, err)
	}
	return p.getWorkerStatus(c, id, http.StatusOK)
}

func (p *Plane) getWorkerStatus(c echo.Context, id string, status int) error {
	w, err := p.fleet.Worker(id)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(status, w)
}

// pinRequest pins a session or routing key of a tenant to a worker.
type pinRequest struct {
	Model  string `json:"model"`
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	Worker string `json:"worker"`
	// TTLSeconds is how long the pin lasts without use; 0 takes the model's default.
	TTLSeconds int64 `json:"ttl_seconds"`
}

func (p *Plane) listPins(c echo.Context) error {
	f := routing.PinFilter{Model: c.QueryParam("model"), Tenant: c.QueryParam("tenant"), Worker: c.QueryParam("worker")}
	limit, err := pinPageSize(c.QueryParam("limit"))
	if err != nil {
		return adminError(c, err)
	}
	pins, next, err := p.findPins(c.Request().Context(), f, c.QueryParam("key"), c.QueryParam("after"), limit)
	if err != nil {
		return adminError(c, err)
	}
	out := map[string]any{"pins": pinsJSON(pins)}
	if next != "" {
		out["next"] = next
	}
	return c.JSON(http.StatusOK, out)
}

func (p *Plane) pin(c echo.Context) error {
	var r pinRequest
	if err := decodeAdminBody(c, &r); err != nil {
		return adminError(c, err)
	}
	if err := p.pinAction(c, r); err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, r)
}

func (p *Plane) unpin(c echo.Context) error {
	if err := p.unpinAction(c, c.QueryParam("model"), c.QueryParam("tenant"), c.QueryParam("key")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// movePinsRequest moves every pin of worker From to worker To.
type movePinsRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
	// TTLSeconds is the moved pins' TTL; 0 takes each model's default.
	TTLSeconds int64 `json:"ttl_seconds"`
}

func (p *Plane) movePins(c echo.Context) error {
	var r movePinsRequest
	if err := decodeAdminBody(c, &r); err != nil {
		return adminError(c, err)
	}
	n, err := p.movePinsAction(c, r)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, map[string]any{"moved": n})
}

// queueView is one model's queue.
type queueView struct {
	Model string
	queue.Snapshot
}

func (p *Plane) queueSnapshot(c echo.Context) error {
	views, err := p.queueViews()
	if err != nil {
		return adminError(c, err)
	}
	out := make([]queueJSON, len(views))
	for i, v := range views {
		out[i] = toQueueJSON(v)
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": out})
}
