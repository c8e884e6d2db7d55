package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Deps are the parts a Server joins. Pool and Auth are required; the rest default.
type Deps struct {
	Pool *routing.Pool
	Auth tenants.Authenticator
	// Logger receives one line per request and the server's own events. Default: discard.
	Logger *slog.Logger
	// Registerer takes the gateway's metrics; Gatherer is what /metrics serves. Default: a
	// private registry used for both.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	// Transport carries requests to workers. Default: a keep-alive transport sized for many
	// concurrent streams, with Config's timeouts.
	Transport http.RoundTripper
	// Admin, when set, builds the admin plane (package adminui) over the Server being built,
	// whose QueueSnapshot, Traffic and FleetChanged it may call from then on; the handler it
	// returns serves /admin and everything under it, on the same listener and with the same
	// shutdown behaviour as the data plane. nil leaves /admin unmounted (404).
	Admin func(*Server) (http.Handler, error)
	// Limits enforces the tiers' rate, token and concurrency limits; nil enforces none.
	Limits Limits
	// Ledger records every call's usage; nil records none.
	Ledger Ledger
	// Budgets enforces the tiers' day and month budgets; nil enforces none.
	Budgets Budgets
	// Queue configures the per-model admission queues; the zero value takes the queue's
	// defaults.
	Queue queue.Config
	// FairShare, when set, shares the queues' fair-share counters with the other replicas (see
	// queue.Queue.SyncFairShare), so the fleet serves its tenants in one order; nil: each
	// replica orders by its own counters.
	FairShare FairShare
	// Now is the clock for latencies and deadlines. Default time.Now.
	Now func() time.Time
}

// Server is usher's HTTP surface. It is safe for concurrent use; its zero value is not usable,
// build it with New.
type Server struct {
	cfg       Config
	pool      *routing.Pool
	auth      tenants.Authenticator
	transport http.RoundTripper
	log       *slog.Logger
	now       func() time.Time
	metrics   *metrics
	limits    Limits
	ledger    Ledger
	budgets   Budgets
	// traffic counts the last minute's requests by class for the admin plane (live.go).
	traffic    *traffic
	dispatcher *dispatcher
	preemption preemption
	echo       *echo.Echo
	// trusted are the proxies whose forwarding headers name the client (clientaddr.go).
	trusted trustedProxies
	// bodies bounds the request-body bytes held in memory (bodies.go).
	bodies *bodyBytes
	// stopping is set once shutdown begins: /readyz answers 503 from then on.
	stopping atomic.Bool
}

// New builds a Server. cfg must have passed Validate.
func New(cfg Config, d Deps) (*Server, error) {
	if d.Pool == nil || d.Auth == nil {
		return nil, errors.New("gateway: Pool and Auth are required")
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Registerer == nil {
		reg := prometheus.NewRegistry()
		d.Registerer, d.Gatherer = reg, reg
	}
	if d.Gatherer == nil {
		d.Gatherer = prometheus.NewRegistry()
	}
	if d.Transport == nil {
		d.Transport = newUpstreamTransport(cfg)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	m, err := newMetrics(d.Registerer)
	if err != nil {
		return nil, err
	}
	trusted, err := parseTrustedProxies(cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	qopts := queue.Options{Registerer: d.Registerer, Logger: d.Logger}
	if d.FairShare != nil {
		qopts.FairShare = fleetFairShare{d.FairShare}
	}
	disp, err := newDispatcher(d.Queue, qopts, d.Pool)
	if err != nil {
		return nil, err
	}
	s := &Server{
		dispatcher: disp,
		limits:     d.Limits,
		ledger:     d.Ledger,
		budgets:    d.Budgets,
		cfg:        cfg,
		pool:       d.Pool,
		auth:       d.Auth,
		transport:  d.Transport,
		log:        d.Logger,
		now:        d.Now,
		metrics:    m,
		traffic:    &traffic{now: d.Now},
		bodies:     newBodyBytes(cfg.MaxBodyBytesHeld, cfg.MaxBodyBytesPerTenant),
		trusted:    trusted,
	}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = httpErrorHandler
	// A client's address is its connection's unless a trusted proxy names it: X-Forwarded-For
	// and X-Real-IP are whatever the client wants them to be.
	e.IPExtractor = s.ClientAddr
	// No middleware is registered with Echo: it wraps a route's handler in its middleware anew at
	// every request (a closure each). The request id is set in ServeHTTP, and the /v1 routes are
	// wrapped in authenticate once, here.

	e.GET("/healthz", func(c echo.Context) error { return c.String(http.StatusOK, "ok\n") })
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(d.Gatherer, promhttp.HandlerOpts{})))

	// Every path under /v1 answers 401 without a valid credential, an unknown one 404 with it.
	e.Group("/v1", s.authenticateFirst)
	e.POST("/v1/chat/completions", s.authenticate(s.inference(chatEndpoint)))
	e.POST("/v1/completions", s.authenticate(s.inference(completionEndpoint)))
	e.POST("/v1/embeddings", s.authenticate(s.inference(embeddingsEndpoint)))
	e.GET("/v1/models", s.authenticate(s.listModels))
	e.GET("/v1/models/*", s.authenticate(s.retrieveModel))
	if d.Admin != nil {
		h, err := d.Admin(s)
		if err != nil {
			return nil, fmt.Errorf("gateway: admin plane: %w", err)
		}
		admin := echo.WrapHandler(h)
		e.Any("/admin", admin)
		e.Any("/admin/*", admin)
	}
	s.echo = e
	return s, nil
}

// ServeHTTP serves every route of usher.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.stopping.Load() {
		// net/http closes the connection after this response.
		w.Header().Set("Connection", "close")
	}
	setRequestID(r.Header, w.Header())
	s.echo.ServeHTTP(w, r)
}

// Run keeps the queues' capacity in step with the pool (its health, drain state, learned limits
// and workers) until ctx ends, following the pool's Changes, and in a fleet answers the other
// replicas' calls for room (lendForFleet). Requests are served without it, but capacity then
// stays as it was at New.
func (s *Server) Run(ctx context.Context) {
	var calls sync.WaitGroup
	defer calls.Wait()
	if !s.cfg.DisablePreemption {
		calls.Go(func() { s.pool.WatchRoomCalls(ctx, s.lendForFleet) })
	}
	s.dispatcher.run(ctx)
}

// BeginShutdown starts the first phase of a graceful stop, the settle time: /readyz answers
// 503 so load balancers stop sending new requests, while requests that still arrive are
// admitted, queued and served as usual; every response carries `Connection: close` so clients
// reconnect, through the load balancer, to a replica that is not stopping. Call StopAdmitting
// when the settle time is over. Safe for concurrent use; later calls do nothing more.
func (s *Server) BeginShutdown() { s.stopping.Store(true) }

// StopAdmitting starts the second phase of a graceful stop: requests still waiting in the
// admission queues leave with 503 `shutting_down` and a Retry-After, and requests arriving from
// then on get the same answer at once; requests already sent to a worker carry on to their end.
// It implies BeginShutdown. Safe for concurrent use; later calls do nothing more.
func (s *Server) StopAdmitting() {
	s.stopping.Store(true)
	s.dispatcher.close()
}

func (s *Server) readyz(c echo.Context) error {
	switch {
	case s.stopping.Load():
		return c.String(http.StatusServiceUnavailable, "shutting down\n")
	case !s.dispatcher.ready():
		return c.String(http.StatusServiceUnavailable, "no worker can take requests\n")
	}
	return c.String(http.StatusOK, "ok\n")
}

// authenticated serves a request whose caller authenticate resolved to p.
type authenticated func(c echo.Context, p tenants.Principal) error

// authenticate resolves the bearer credential to a tenant and serves the request with next, or
// answers 401. The principal goes to next as an argument, not through Echo's context store (a
// map and a boxed value every request).
func (s *Server) authenticate(next authenticated) echo.HandlerFunc {
	return func(c echo.Context) error {
		cred, ok := tenants.BearerCredential(headerValue(c.Request().Header, echo.HeaderAuthorization))
		if !ok {
			s.metrics.requests.WithLabelValues("", "401").Inc()
			return WriteError(c, &APIError{Status: http.StatusUnauthorized, Type: "authentication_error",
				Code: "invalid_api_key", Message: "missing credential: send 'Authorization: Bearer <API key>'"})
		}
		p, err := s.auth.Authenticate(c.Request().Context(), cred)
		if err != nil {
			s.metrics.requests.WithLabelValues("", "401").Inc()
			return WriteError(c, err)
		}
		return next(c, p)
	}
}

// authenticateFirst is authenticate as Echo middleware: a request without a valid credential is
// answered 401 before anything else is decided.
func (s *Server) authenticateFirst(next echo.HandlerFunc) echo.HandlerFunc {
	return s.authenticate(func(c echo.Context, _ tenants.Principal) error { return next(c) })
}

const maxRequestIDLen = 128

// headerRequestID is echo.HeaderXRequestID as net/http stores it. The request path reads and
// writes headers by such canonical keys (headerValue), without Header.Get's canonicalizing of
// every key at every call (and its allocation for a key that is not canonical).
const headerRequestID = "X-Request-Id"

// headerValue is h.Get(key) for a key in canonical form (http.CanonicalHeaderKey).
func headerValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// headerEngineRequestID holds, in a request's own headers, the id its worker is sent when that is
// not the request's id (see setRequestID); a client's value of it is never read.
const headerEngineRequestID = "X-Usher-Engine-Request-Id"

// setRequestID gives every request an id (in its headers in): the client's X-Request-ID when it
// is a sane token, a fresh random one otherwise. It is echoed in the response's headers out and
// logged. The worker is sent an id of its own that no other request has: vLLM takes the header as
// its request id, which must be unique among the requests it runs (a duplicate is refused, or,
// in versions before late 2025, mixes two requests' states), and a client's id is any tenant's
// choice, so a client's id goes to the worker with a random suffix (in headerEngineRequestID), a
// fresh one as it is.
func setRequestID(in, out http.Header) {
	id := headerValue(in, headerRequestID)
	if validRequestID(id) {
		in[headerEngineRequestID] = []string{id + "-" + newRequestID()[:16]}
	} else {
		id = newRequestID()
		in[headerRequestID] = []string{id}
		delete(in, headerEngineRequestID)
	}
	// The request's value, shared read-only (net/http never writes into a header's values).
	out[headerRequestID] = in[headerRequestID][:1:1]
}

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(id); i++ {
		ch := id[i]
		ok := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' ||
			ch == '-' || ch == '_' || ch == '.' || ch == ':'
		if !ok {
			return false
		}
	}
	return true
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func newUpstreamTransport(cfg Config) *http.Transport {
	// Every wait for a worker's headers is bounded already, by its attempt's silence bound
	// (proxy: the idle timeout for a stream, wholeAnswerSilence for a whole answer, never above
	// max(header, idle)) or by a piece's timeout (sendPiece: the idle timeout). The transport's
	// own header timer, a timer set and stopped at every request, is kept only where it fires
	// first: a header timeout below the idle timeout.
	var header time.Duration
	if cfg.UpstreamHeaderTimeout < cfg.UpstreamIdleTimeout {
		header = cfg.UpstreamHeaderTimeout
	}
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   cfg.UpstreamConnectTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		MaxIdleConns:          4096,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: header,
		DisableCompression:    true,
	}
}
