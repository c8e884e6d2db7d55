package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	adminui "github.com/usherllm/usher/admin-ui"
	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

func runServe(args []string) int {
	fs := flag.NewFlagSet("usher serve", flag.ContinueOnError)
	configPath := fs.String("config", os.Getenv("USHER_CONFIG"), "configuration `file` (YAML); also $USHER_CONFIG")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: usher serve --config FILE\n\nRun the gateway (see deploy/usher.example.yaml).")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "usher serve: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if *configPath == "" {
		fmt.Fprintln(os.Stderr, "usher serve: --config FILE is required (see deploy/usher.example.yaml)")
		return exitUsage
	}
	cfg, err := loadConfig(*configPath, lookupEnv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "usher serve: config %s:\n%s\n", *configPath, indent(err.Error()))
		return exitUsage
	}
	logger := newLogger(cfg.Log, os.Stderr)
	if msg, ok := noAdminTokenWarning(cfg.Tenants.Admin); ok {
		logger.Warn(msg)
	}
	for _, field := range literalEngineKeys(cfg.Routing) {
		logger.Warn("an engine key is written in the config file; prefer api_key_env", "field", field)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal the default handling comes back: a second one stops at once.
	context.AfterFunc(ctx, stop)
	startHeapFloor(ctx, lookupEnv)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	err = serve(ctx, cfg, logger, serveHooks{
		ready: func(addr net.Addr) {
			logger.Info("usher is serving", "addr", addr.String(), "models", len(configuredModels(cfg.Routing)),
				"workers", len(cfg.Routing.Workers), "discovery", len(cfg.Routing.Discovery))
		},
		reload: hup,
		load:   func() (Config, error) { return loadConfig(*configPath, lookupEnv) },
	})
	if err != nil {
		logger.Error("usher stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

// serveHooks are the outside events serve answers besides the end of its ctx.
type serveHooks struct {
	// ready is called with the listening address once requests are accepted.
	ready func(net.Addr)
	// reload delivers requests to re-read the configuration (SIGHUP), read with load; nil: none.
	reload <-chan os.Signal
	load   func() (Config, error)
}

// serve runs the gateway described by cfg until ctx ends: it migrates the tenant store, builds
// the parts and serves, applying a new configuration on every hooks.reload (see reloader). When
// ctx ends it shuts down in order:
//  1. settle: /readyz turns 503 (BeginShutdown) while requests are still accepted, admitted and
//     served for server.shutdown_settle, so load balancers stop sending here first; requests
//     queued now keep their place and are served if capacity frees in time;
//  2. requests still queued and any that still arrive get 503 with Retry-After (StopAdmitting),
//     the listener closes and in-flight requests run to completion, up to server.shutdown_grace,
//     after which the remaining connections are closed;
//  3. the worker pool's health checks, discovery and retirements, the gateway's capacity refresh
//     and the tenant directory's refresh stop (the directory writes its last batch of key
//     last-used times), the usage ledger writes what it still holds, then the store and Redis
//     close.
func serve(ctx context.Context, cfg Config, logger *slog.Logger, hooks serveHooks) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	var rdb *redis.Client
	if cfg.Redis.URL != "" {
		ropts, err := redis.ParseURL(cfg.Redis.URL)
		if err != nil {
			return fmt.Errorf("redis.url: %w", err)
		}
		rdb = redis.NewClient(ropts)
		defer rdb.Close()
	}
	store, err := openStore(ctx, cfg.Tenants.Database.URL)
	if err != nil {
		return err
	}
	defer store.Close()
	popts := routing.Options{Logger: logger, Registerer: reg, Registry: adminui.StoredWorkers{Store: store}}
	if rdb != nil {
		rs := routing.NewRedisStore(rdb, cfg.Routing.MaxPinsPerTenant)
		popts.Pins, popts.Drains, popts.Announcer, popts.Prefixes, popts.Shares = rs, rs, rs, rs, rs
		popts.InteractiveReserve = cfg.Queue.ReserveShare()
	}
	pool, err := routing.NewPool(cfg.Routing, popts)
	if err != nil {
		return fmt.Errorf("worker pool: %w", err)
	}
	// The workers added through the admin API, before the first request.
	if err := pool.SyncRegistry(ctx); err != nil {
		logger.Warn("workers added through the admin API not loaded yet; retrying in the background", "err", err)
	}
	jwtOptions := tenants.JWTOptions{Fetcher: newJWKSFetcher(), Logger: logger}
	jwt, err := tenants.NewJWTVerifierWith(cfg.Tenants.JWT, jwtOptions)
	if err != nil {
		return fmt.Errorf("jwt: %w", err)
	}
	// The gateway, built below from the directory, forgets each tenant the directory finds
	// deleted; the directory reloads only after serving starts, with gw set.
	var gw *gateway.Server
	dopts := tenants.DirectoryOptions{JWT: jwt, Logger: logger, Registerer: reg,
		TenantRemoved: func(id string) { gw.ForgetTenant(id) }}
	lopts := tenants.LimiterOptions{Logger: logger, Registerer: reg}
	if rdb != nil {
		dopts.Redis, lopts.Redis = rdb, rdb
	}
	directory, err := tenants.NewDirectory(ctx, cfg.Tenants, store, dopts)
	if err != nil {
		return fmt.Errorf("tenants: %w", err)
	}
	admin, err := tenants.NewAdmin(cfg.Tenants.Admin, store, directory, nil)
	if err != nil {
		return fmt.Errorf("admin: %w", err)
	}
	ln, err := gateway.Listen(cfg.Server, reg, logger)
	if err != nil {
		return err
	}
	defer ln.Close()
	var plane *adminui.Plane
	budgets := tenants.NewBudgets(tenants.BudgetsOptions{Redis: lopts.Redis, Store: store, Logger: logger, Registerer: reg})
	var fairShare gateway.FairShare
	if rdb != nil {
		if fairShare, err = tenants.NewFairShareCounters(tenants.FairShareOptions{Redis: rdb}); err != nil {
			return err
		}
	}
	ledger := tenants.NewLedger(cfg.Tenants.Usage, store, tenants.LedgerOptions{Redis: lopts.Redis, Logger: logger, Registerer: reg})
	gw, err = gateway.New(cfg.Server, gateway.Deps{
		Pool: pool, Auth: directory, Limits: tenants.NewLimiter(cfg.Tenants.Limits, lopts), Ledger: ledger, Budgets: budgets,
		Logger: logger, Registerer: reg, Gatherer: reg, Queue: cfg.Queue, FairShare: fairShare,
		Admin: func(live *gateway.Server) (http.Handler, error) {
			deps := adminui.Deps{Fleet: pool, Live: live, Admins: admin, Tenants: admin, Sessions: store,
				Replica: replicaName(ln.Addr()), Logger: logger, ClientAddr: live.ClientAddr}
			if rdb != nil {
				deps.Board = adminui.RedisBoard{Client: rdb}
			}
			var err error
			plane, err = adminui.New(cfg.AdminUI, deps)
			return plane, err
		},
	})
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           gw,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		ReadTimeout:       cfg.Server.ReadTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}

	bgCtx, stopBackground := context.WithCancel(context.Background())
	var background sync.WaitGroup
	background.Go(func() { pool.Run(bgCtx) })
	background.Go(func() { gw.Run(bgCtx) })
	background.Go(func() { plane.Run(bgCtx) })
	background.Go(func() { ledger.Run(bgCtx) })
	background.Go(func() { budgets.Run(bgCtx) })
	background.Go(func() {
		if err := directory.Run(bgCtx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("tenant directory stopped", "err", err)
		}
	})
	defer func() {
		stopBackground()
		background.Wait()
	}()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	hooks.ready(ln.Addr())

	reload := &reloader{running: cfg, pool: pool, tiers: directory, logger: logger, jwt: directory,
		newJWT: func(c tenants.JWTConfig) (*tenants.JWTVerifier, error) {
			return tenants.NewJWTVerifierWith(c, jwtOptions)
		}}
	for ctx.Err() == nil {
		select {
		case err := <-serveErr:
			return err
		case <-hooks.reload:
			next, err := hooks.load()
			if err != nil {
				logger.Error("config reload refused, the running configuration stays", "err", err)
				continue
			}
			reload.apply(next)
		case <-ctx.Done():
		}
	}
	logger.Info("shutting down: not ready, still serving while load balancers settle",
		"settle", cfg.Server.ShutdownSettle, "grace", cfg.Server.ShutdownGrace)
	gw.BeginShutdown()
	settle := time.NewTimer(cfg.Server.ShutdownSettle)
	select {
	case err := <-serveErr:
		settle.Stop()
		return err
	case <-settle.C:
	}
	logger.Info("shutting down: no new requests, in-flight ones finish")
	gw.StopAdmitting()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), cfg.Server.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("grace period over, closing remaining connections", "err", err)
		_ = srv.Close()
	}
	if err := <-serveErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// replicaName names this replica on the fleet console: its host name (a pod's name under
// Kubernetes) and the port it listens on, so replicas sharing a host stay apart.
func replicaName(addr net.Addr) string {
	host, _ := os.Hostname()
	if host == "" {
		host = "usher"
	}
	if ta, ok := addr.(*net.TCPAddr); ok {
		return host + ":" + strconv.Itoa(ta.Port)
	}
	return host
}

// noAdminTokenWarning is the warning serve logs when the file sets no admin token: the gateway
// works, but no operator can sign into the console or manage workers, tenants and keys.
func noAdminTokenWarning(c tenants.AdminConfig) (string, bool) {
	if c.Token != "" || c.TokenSHA256 != "" {
		return "", false
	}
	return "NO ADMIN TOKEN: no operator can sign into the console (/admin/) or use the admin API (tenants reach only their own objects); " +
		"set admin.token (or USHER_ADMIN_TOKEN, at least 24 characters, e.g. $(head -c 24 /dev/urandom | base64)) " +
		"or admin.token_sha256, and restart", true
}

// configuredModels are the models the file's workers and discovery entries serve, sorted.
func configuredModels(c routing.Config) []string {
	var models []string
	for _, w := range c.Workers {
		models = append(models, w.Models...)
	}
	for _, d := range c.Discovery {
		models = append(models, d.Models...)
	}
	slices.Sort(models)
	return slices.Compact(models)
}

func indent(s string) string {
	out := "  "
	for _, r := range s {
		out += string(r)
		if r == '\n' {
			out += "  "
		}
	}
	return out
}
