package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

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

// registerAdmin mounts the admin JSON API under /admin/api/v1: the fleet (workers, pins, queue,
// overview) for the admin and the viewer, and, when ta is set, tenants, keys, tiers and the audit
// log. The viewer may only read (GET); its changes are refused with 403.
func (s *Server) registerAdmin(e *echo.Echo, auth AdminAuthenticator, ta *tenants.Admin) {
	g := e.Group("/admin/api/v1", s.adminAuth(auth), readOnlyGuard)
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
	fleet.POST("/pins/move", s.movePins)
	fleet.GET("/queue", s.queueSnapshot)
	fleet.GET("/overview", s.overviewAPI)
	if ta != nil {
		registerTenantAdmin(g, ta)
	}
}

// adminOnly refuses tenant actors: the fleet is the operator's (the viewer reads it).
func adminOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if a := actorOf(c); !a.Admin && !a.Viewer {
			return WriteError(c, &APIError{Status: http.StatusForbidden, Type: "permission_error",
				Code: "admin_required", Message: "admin rights required"})
		}
		return next(c)
	}
}

// readOnlyGuard refuses every change by a read-only actor, whatever the route.
func readOnlyGuard(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if m := c.Request().Method; actorOf(c).ReadOnly() && m != http.MethodGet && m != http.MethodHead {
			return WriteError(c, errReadOnlyActor)
		}
		return next(c)
	}
}

// errReadOnlyActor is the answer to a change asked by the viewer.
var errReadOnlyActor = &APIError{Status: http.StatusForbidden, Type: "permission_error",
	Code: "read_only", Message: "the viewer may read but not change anything"}

func actorOf(c echo.Context) tenants.Actor {
	a, _ := c.Get(actorKey).(tenants.Actor)
	return a
}

func (s *Server) adminAuth(auth AdminAuthenticator) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			cred, ok := tenants.BearerCredential(c.Request().Header.Get(echo.HeaderAuthorization))
			if !ok {
				return WriteError(c, &APIError{Status: http.StatusUnauthorized, Type: "authentication_error",
					Code: "invalid_admin_token", Message: "missing credential: send 'Authorization: Bearer <admin token>'"})
			}
			actor, err := auth.AuthenticateActor(c.Request().Context(), cred)
			if err != nil {
				return WriteError(c, &APIError{Status: http.StatusUnauthorized, Type: "authentication_error",
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
		return BadRequest("", "Content-Type must be application/json")
	}
	data, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, maxAdminBody))
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return TooLarge(maxAdminBody)
	}
	if err != nil {
		return BadRequest("", "reading the body: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("", "the body is not a valid JSON object for this call: %v", err)
	}
	if dec.More() {
		return BadRequest("", "the body has data after the JSON object")
	}
	return nil
}

// adminError answers an admin call's error in OpenAI's shape with the status its cause calls
// for (Invalid: the domain packages' validation errors are the caller's).
func adminError(c echo.Context, err error) error { return WriteError(c, Invalid(err)) }

// audit records a fleet change (a worker or pin change, which lives in the pool and Redis) in the
// process log and, when the tenant admin service is wired, in the SQL audit log beside the
// tenant and key changes.
func (s *Server) audit(c echo.Context, action, object string) {
	s.log.Info("admin", "actor", actorOf(c).Name, "action", action, "object", object,
		"id", c.Response().Header().Get(echo.HeaderXRequestID))
	if s.tenantAdmin == nil {
		return
	}
	// The change is made; an audit write that fails is logged, never undoes it.
	if err := s.tenantAdmin.Record(c.Request().Context(), actorOf(c), action, object, nil); err != nil {
		s.log.Error("audit log write failed", "action", action, "object", object, "err", err)
	}
}

func (s *Server) listWorkers(c echo.Context) error {
	workers := s.pool.Workers()
	sortWorkers(workers)
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
	if err := s.addWorkerAction(c, spec); err != nil {
		return adminError(c, err)
	}
	return s.getWorkerStatus(c, spec.ID, http.StatusCreated)
}

func (s *Server) removeWorker(c echo.Context) error {
	if err := s.removeWorkerAction(c, c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// drainWorker stops new requests to the worker and takes its pins off it, so each pinned
// session or key is pinned anew, elsewhere, at its next request; in-flight requests finish.
func (s *Server) drainWorker(c echo.Context) error {
	id := c.Param("id")
	if err := s.drainWorkerAction(c, id); err != nil {
		return adminError(c, err)
	}
	return s.getWorkerStatus(c, id, http.StatusOK)
}

func (s *Server) undrainWorker(c echo.Context) error {
	id := c.Param("id")
	if err := s.undrainWorkerAction(c, id); err != nil {
		return adminError(c, err)
	}
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
	pins, err := s.findPins(c.Request().Context(), f, c.QueryParam("key"))
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, map[string]any{"pins": pins})
}

func (s *Server) pin(c echo.Context) error {
	var r pinRequest
	if err := decodeAdminBody(c, &r); err != nil {
		return adminError(c, err)
	}
	if err := s.pinAction(c, r); err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, r)
}

func (s *Server) unpin(c echo.Context) error {
	if err := s.unpinAction(c, c.QueryParam("model"), c.QueryParam("tenant"), c.QueryParam("key")); err != nil {
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

func (s *Server) movePins(c echo.Context) error {
	var r movePinsRequest
	if err := decodeAdminBody(c, &r); err != nil {
		return adminError(c, err)
	}
	n, err := s.movePinsAction(c, r)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, map[string]any{"moved": n})
}

// queueView is one model's queue in the admin API.
type queueView struct {
	Model string `json:"model"`
	queue.Snapshot
}

func (s *Server) queueSnapshot(c echo.Context) error {
	out, err := s.queueViews()
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, map[string]any{"queues": out})
}
