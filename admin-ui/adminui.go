// Package adminui is usher's admin plane: the admin JSON API under /admin/api/v1 and the
// operators' console under /admin/, one http.Handler that the gateway mounts at /admin on its
// listener (gateway.Deps.Admin).
//
// It works over narrow interfaces: the fleet (Fleet, which *routing.Pool implements), the tenant
// admin service (*tenants.Admin: tenants, keys, tiers, the audit log), admin authentication
// (Authenticator) and the data plane's live state (Live, which *gateway.Server implements: the
// admission queues and the last minute's traffic). Every error it answers, JSON or HTML, takes its
// status from gateway's error table (gateway.ErrorFor). The console's actions are the API's
// (actions.go), so the console can do nothing the API cannot.
//
// The console's html/template pages and the CSS and JavaScript they load are embedded (files).
// Every page template defines "title" and "content" and is parsed together with layout.html,
// whose "layout" template frames them. Pages that refresh live define a fragment
// ("overview-live", "workers-live") also served alone for polling.
package adminui

import (
	"context"
	"embed"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// files holds templates/*.html and static/*.
//
//go:embed templates/*.html static/*
var files embed.FS

// Fleet is what the admin plane reads and changes of the worker pool. *routing.Pool implements
// it; its methods' contracts are routing's.
type Fleet interface {
	Models() []string
	Workers() []routing.WorkerStatus
	Worker(id string) (routing.WorkerStatus, error)
	AddWorker(ctx context.Context, spec routing.WorkerSpec) error
	UpdateWorker(ctx context.Context, spec routing.WorkerSpec) error
	RemoveWorker(ctx context.Context, id string) error
	Drain(ctx context.Context, id string) error
	Undrain(ctx context.Context, id string) error
	Pins(ctx context.Context, f routing.PinFilter) ([]routing.Pin, error)
	Pin(ctx context.Context, model, tenant, key, workerID string, ttl time.Duration) error
	Unpin(ctx context.Context, model, tenant, key string) error
}

// Live is what the admin plane reads of the data plane, and tells it. *gateway.Server implements
// it; see its methods for their contracts.
type Live interface {
	// QueueSnapshot is the admission queue of model now.
	QueueSnapshot(model string) (queue.Snapshot, error)
	// Traffic is the last minute's requests of class.
	Traffic(class queue.Class) gateway.ClassTraffic
	// FleetChanged tells the data plane that workers were added, removed, drained or undrained.
	FleetChanged()
}

// Authenticator checks the credential of an admin API call or a console sign-in (the string
// after "Bearer ", or the token typed in): the admin token gives an admin actor, the viewer token
// a read-only viewer, a tenant's credential a tenant actor that may only read its tenant and
// manage its keys. Errors wrap tenants.ErrUnauthenticated. *tenants.Admin implements it.
type Authenticator interface {
	AuthenticateActor(ctx context.Context, credential string) (tenants.Actor, error)
}

var (
	_ Fleet         = (*routing.Pool)(nil)
	_ Live          = (*gateway.Server)(nil)
	_ Authenticator = (*tenants.Admin)(nil)
)

// Deps are the parts the admin plane works over. Fleet, Live and Admins are required.
type Deps struct {
	Fleet  Fleet
	Live   Live
	Admins Authenticator
	// Tenants is the admin service of tenants, keys, tiers and the audit log; it also records the
	// fleet's changes in the audit log. nil leaves out those routes and pages, and fleet changes
	// are only logged.
	Tenants *tenants.Admin
	// Sessions keeps console sessions server-side (console_store.go), so sign-out and an
	// admin's "end session" hold on every replica; nil: signed cookies alone.
	Sessions SessionStore
	// Board shares each replica's overview and queues so the console shows the whole fleet
	// (RedisBoard); nil: the console shows this replica only. Plane.Run publishes to it.
	Board ReplicaBoard
	// Replica names this replica on the Board; default: the host name.
	Replica string
	// Logger receives one line per change and sign-in. Default: discard.
	Logger *slog.Logger
	// Now is the clock of console sessions and sign-in limits. Default time.Now.
	Now func() time.Time
	// ClientAddr is the address of the client that sent a request, for sign-in limits and logs
	// (gateway.Server.ClientAddr reads it through the trusted proxies). Default: the
	// connection's address; forwarding headers are ignored, since any client can send them.
	ClientAddr func(*http.Request) string
}

// Plane is the admin plane: the admin API and the console as one http.Handler serving paths
// under /admin. Safe for concurrent use; build it with New.
type Plane struct {
	fleet    Fleet
	live     Live
	ta       *tenants.Admin // nil: no tenants, keys, tiers or audit
	log      *slog.Logger
	now      func() time.Time
	attempts *attempts // failed credential checks, console and API together
	codec    sessionCodec
	sessions SessionStore // nil: console sessions are signed cookies alone
	board    ReplicaBoard // nil: the console shows this replica only
	replica  string
	// clientAddr is the address sign-in limits count and logs show (Deps.ClientAddr).
	clientAddr func(*http.Request) string
	hist       history // the Overview's last minutes, sampled by Run
	echo       *echo.Echo
}

// New builds the admin plane; cfg must have passed Validate. A gateway mounts it through
// gateway.Deps.Admin:
//
//	Admin: func(gw *gateway.Server) (http.Handler, error) {
//		return adminui.New(cfg, adminui.Deps{Fleet: pool, Live: gw, Admins: admin, Tenants: admin})
//	}
func New(cfg Config, d Deps) (*Plane, error) {
	if d.Fleet == nil || d.Live == nil || d.Admins == nil {
		return nil, errors.New("adminui: Fleet, Live and Admins are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.ClientAddr == nil {
		d.ClientAddr = connectionAddress
	}
	p := &Plane{fleet: d.Fleet, live: d.Live, ta: d.Tenants, log: d.Logger, now: d.Now, attempts: newAttempts(cfg.SignIn, d.Now),
		codec: newSessionCodec(d.Admins, d.Now), sessions: d.Sessions, board: d.Board, replica: d.Replica, clientAddr: d.ClientAddr}
	if p.replica == "" {
		p.replica, _ = os.Hostname()
	}
	if p.replica == "" || len(p.replica) > 200 || strings.ContainsAny(p.replica, " \t\r\n") {
		return nil, errNoReplica
	}
	p.pruneSessions()
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = func(err error, c echo.Context) { _ = gateway.WriteError(c, err) }
	// The logged address is the connection's, or the one a trusted proxy names; never a header's
	// from anyone else.
	e.IPExtractor = p.clientAddr
	p.registerAPI(e, d.Admins)
	if err := p.registerConsole(e, d.Admins); err != nil {
		return nil, err
	}
	p.echo = e
	return p, nil
}

// checkAttempts refuses, with ErrTooManyAttempts and a Retry-After, a client that may not try a
// credential now (SignInLimits).
func (p *Plane) checkAttempts(c echo.Context) error {
	if w := p.attempts.wait(p.clientAddr(c.Request())); w > 0 {
		c.Response().Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(w.Seconds()))))
		return gateway.ErrTooManyAttempts
	}
	return nil
}

// acceptedAttempt records a credential the Authenticator accepted: its client is not held back
// by others' failures (SignInLimits).
func (p *Plane) acceptedAttempt(c echo.Context) { p.attempts.succeeded(p.clientAddr(c.Request())) }

// failedAttempt counts a credential the Authenticator refused.
func (p *Plane) failedAttempt(c echo.Context, action string) {
	addr := p.clientAddr(c.Request())
	p.attempts.failed(addr)
	p.log.Info("admin", "action", action, "remote", addr)
}

// ServeHTTP serves the admin API and the console; other paths get 404.
func (p *Plane) ServeHTTP(w http.ResponseWriter, r *http.Request) { p.echo.ServeHTTP(w, r) }
