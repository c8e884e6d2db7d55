package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// AdminAuthenticator checks the credential of an admin API call (the string after "Bearer "):
// the admin token gives an admin actor, a tenant's credential a tenant actor that may only read
// its tenant and manage its keys. Errors wrap tenants.ErrUnauthenticated. *tenants.Admin
// implements it.
type AdminAuthenticator interface {
	AuthenticateActor(ctx context.Context, credential string) (tenants.Actor, error)
}

// maxAdminBody bounds an admin API request body.
const maxAdminBody = 64 << 10

const actorKey = "usher.admin"

// registerAdmin mounts the admin JSON API under /admin/api/v1: the fleet (workers, pins, queue)
// for admin actors, and, when ta is set, tenants, keys, tiers and the audit log.
func (s *Server) registerAdmin(e *echo.Echo, auth AdminAuthenticator, ta *tenants.Admin) {
	g := e.Group("/admin/api/v1", s.adminAuth(auth))
	fleet := g.Group("", adminOnly)
	fleet.GET("/workers", s.listWorkers)
	fleet.POST("/workers", s.addWorker)
	fleet.GET("/workers/:id", s.getWorker)
	fleet.DELETE("/workers/:id", s.removeWorker)
	fleet.POST("/workers/:id/drain", s.drainWorker)
	fleet.POST("/workers/:id/undrain", s.undrainWorker)
	fleet.GET("/pins", s.listPins)
	fleet.POST("/pins", s.pin)
	fleet.DELETE("/pins", s.unpin)
	fleet.GET("/queue", s.queueSnapshot)
	if ta != nil {
		registerTenantAdmin(g, ta)
	}
}

// adminOnly refuses tenant actors: the fleet is the operator's.
func adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if !actorOf(c).Admin {
			return writeError(c, &apiError{Status: http.StatusForbidden, Type: "permission_error",
				Code: "admin_required", Message: "admin rights required"})
		}
		return next(c)
	}
}

func actorOf(c echo.Context) tenants.Actor {
	a, _ := c.Get(actorKey).(tenants.Actor)
	return a
}

func (s *Server) adminAuth(auth AdminAuthenticator) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			cred, ok := tenants.BearerCredential(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				return writeError(c, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error",
					Code: "invalid_admin_token", Message: "missing credential: send 'Authorization: Bearer <admin token>'"})
			}
			actor, err := auth.AuthenticateActor(c.Request().Context(), cred)
			if err != nil {
				return writeError(c, &apiError{Status: http.StatusUnauthorized, Type: "authentication_error",
					Code: "invalid_admin_token", Message: "invalid admin credential"})
			}
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
		return badRequest("", "Content-Type must be application/json")
	}
	data, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxAdminBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return tooLarge(maxAdminBody)
	}
	if err != nil {
		return badRequest("", "reading the body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return badRequest("", "the body is not a valid JSON object for this call: %v", err)
	}
	if dec.More() {
		return badRequest("", "the body has data after the JSON object")
	}
	return nil
}

// adminError answers an admin call's error in OpenAI's shape with the status its cause calls
// for.
func adminError(c echo.Context, err error) error {
	switch {
	case errors.Is(err, routing.ErrUnknownModel):
		return writeError(c, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Message: err.Error()})
	case errors.Is(err, routing.ErrUnknownWorker):
		return writeError(c, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "worker_not_found", Message: err.Error()})
	case errors.Is(err, routing.ErrWorkerExists):
		return writeError(c, &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "worker_exists", Message: err.Error()})
	case errors.Is(err, tenants.ErrForbidden):
		return writeError(c, &apiError{Status: http.StatusForbidden, Type: "permission_error", Code: "forbidden", Message: err.Error()})
	case errors.Is(err, tenants.ErrNotFound):
		return writeError(c, &apiError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: err.Error()})
	case errors.Is(err, tenants.ErrConflict):
		return writeError(c, &apiError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "conflict", Message: err.Error()})
	case errors.Is(err, tenants.ErrInvalid):
		return writeError(c, badRequest("", "%v", err))
	}
	var ae *apiError
	if errors.As(err, &ae) {
		return writeError(c, ae)
	}
	// Validation errors of the domain packages name the field and the problem.
	return writeError(c, badRequest("", "%v", err))
}

// audit logs a fleet change (worker and pin changes live in the pool and Redis, not in the SQL
// audit log of tenants and keys).
func (s *Server) audit(c echo.Context, action, object string) {
	s.log.Info("admin", "actor", actorOf(c).Name, "action", action, "object", object,
		"id", c.Response().Header().Get(echo.HeaderXRequestID))
}

func (s *Server) listWorkers(c echo.Context) error {
	workers := s.pool.Workers()
	sort.Slice(workers, func(i, j int) bool { return workers[i].ID < workers[j].ID })
	return c.JSON(http.StatusOK, map[string]any{"workers": workers})
}

func (s *Server) getWorker(c echo.Context) error {
	w, err := s.pool.Worker(c.Param("id"))
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, w)
}

func (s *Server) addWorker(c echo.Context) error {
	var spec routing.WorkerSpec
	if err := decodeAdminBody(c, &spec); err != nil {
		return adminError(c, err)
	}
	if err := s.pool.Add(spec); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "worker.add", spec.ID)
	s.admission.refresh()
	return s.getWorkerStatus(c, spec.ID, http.StatusCreated)
}

func (s *Server) removeWorker(c echo.Context) error {
	id := c.Param("id")
	if err := s.pool.Remove(id); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "worker.remove", id)
	s.admission.refresh()
	return c.NoContent(http.StatusNoContent)
}

// drainWorker stops new requests to the worker and takes its pins off it, so each pinned
// session or key is pinned anew, elsewhere, at its next request; in-flight requests finish.
func (s *Server) drainWorker(c echo.Context) error {
	id := c.Param("id")
	ctx := c.Request().Context()
	if err := s.pool.Drain(ctx, id); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "worker.drain", id)
	s.admission.refresh()
	pins, err := s.pool.Pins(ctx, routing.PinFilter{Worker: id})
	if err != nil {
		return adminError(c, fmt.Errorf("worker %s drains, but its pins could not be listed: %w", id, err))
	}
	for _, p := range pins {
		if err := s.pool.Unpin(ctx, p.Model, p.Tenant, p.Key); err != nil {
			return adminError(c, fmt.Errorf("worker %s drains, but its pins could not all be moved: %w", id, err))
		}
	}
	return s.getWorkerStatus(c, id, http.StatusOK)
}

func (s *Server) undrainWorker(c echo.Context) error {
	id := c.Param("id")
	if err := s.pool.Undrain(c.Request().Context(), id); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "worker.undrain", id)
	s.admission.refresh()
	return s.getWorkerStatus(c, id, http.StatusOK)
}

func (s *Server) getWorkerStatus(c echo.Context, id string, status int) error {
	w, err := s.pool.Worker(id)
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

func (s *Server) listPins(c echo.Context) error {
	f := routing.PinFilter{Model: c.QueryParam("model"), Tenant: c.QueryParam("tenant"), Worker: c.QueryParam("worker")}
	pins, err := s.pool.Pins(c.Request().Context(), f)
	if err != nil {
		return adminError(c, err)
	}
	if pins == nil {
		pins = []routing.Pin{}
	}
	return c.JSON(http.StatusOK, map[string]any{"pins": pins})
}

func (s *Server) pin(c echo.Context) error {
	var r pinRequest
	if err := decodeAdminBody(c, &r); err != nil {
		return adminError(c, err)
	}
	if r.Model == "" || r.Tenant == "" || r.Key == "" || r.Worker == "" {
		return adminError(c, badRequest("", "model, tenant, key and worker are required"))
	}
	if r.TTLSeconds < 0 {
		return adminError(c, badRequest("ttl_seconds", "ttl_seconds must not be negative"))
	}
	ttl := time.Duration(r.TTLSeconds) * time.Second
	if err := s.pool.Pin(c.Request().Context(), r.Model, r.Tenant, r.Key, r.Worker, ttl); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "pin.set", r.Model+"/"+r.Tenant+"/"+r.Key+"->"+r.Worker)
	return c.JSON(http.StatusOK, r)
}

func (s *Server) unpin(c echo.Context) error {
	model, tenant, key := c.QueryParam("model"), c.QueryParam("tenant"), c.QueryParam("key")
	if model == "" || tenant == "" || key == "" {
		return adminError(c, badRequest("", "query parameters model, tenant and key are required"))
	}
	if err := s.pool.Unpin(c.Request().Context(), model, tenant, key); err != nil {
		return adminError(c, err)
	}
	s.audit(c, "pin.delete", model+"/"+tenant+"/"+key)
	return c.NoContent(http.StatusNoContent)
}

// queueView is one model's queue in the admin API.
type queueView struct {
	Model string `json:"model"`
	queue.Snapshot
}

func (s *Server) queueSnapshot(c echo.Context) error {
	var out []queueView
	for _, model := range s.pool.Models() {
		q, err := s.admission.queueFor(model)
		if err != nil {
			return adminError(c, fmt.Errorf("model %q: %w", model, err))
		}
		out = append(out, queueView{Model: model, Snapshot: q.Snapshot()})
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": out})
}
