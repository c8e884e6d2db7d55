package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/sim"
)

const demoModel = "demo-7b"

func runDemo(args []string) int {
	fs := flag.NewFlagSet("usher demo", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8080", "gateway `address`")
	workers := fs.Int("workers", 3, "number of simulated workers")
	timeScale := fs.Float64("time-scale", 1, "simulated workers' time scale (0.1 = ten times faster)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if *workers < 1 {
		fmt.Fprintln(os.Stderr, "usher demo: --workers must be at least 1")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := newLogger(LogConfig{Level: *logLevel, Format: "text"}, os.Stderr)
	if err := demo(ctx, *listen, *workers, *timeScale, logger, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "usher demo: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// demo runs n simulated workers on free loopback ports and a gateway in front of them with one
// demo tenant, prints the banner to out, and runs until ctx ends. Shutdown order: the gateway
// first (it drains in-flight requests), then the workers.
func demo(ctx context.Context, listen string, n int, timeScale float64, logger *slog.Logger, out io.Writer) error {
	var specs []routing.WorkerSpec
	for i := 1; i <= n; i++ {
		scfg := sim.DefaultConfig()
		scfg.Model = demoModel
		scfg.TimeScale = timeScale
		engine, err := sim.New(scfg, sim.Options{Logger: logger.With("sim", i)})
		if err != nil {
			return err
		}
		defer engine.Close()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: engine, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		specs = append(specs, routing.WorkerSpec{
			ID: fmt.Sprintf("sim-%d", i), URL: "http://" + ln.Addr().String(), Models: []string{demoModel},
		})
	}
	key := "sk-usher-demo-" + rand.Text()
	adminToken := "usher-admin-" + rand.Text()
	dataDir, err := os.MkdirTemp("", "usher-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	cfg := Config{
		// No load balancer to wait for: Ctrl-C stops the demo at once.
		Server:  gateway.Config{Listen: listen, ShutdownSettle: time.Millisecond},
		Routing: routing.Config{Workers: specs, Policy: "least_request"},
		Tenants: tenants.Config{Tenants: []tenants.TenantSpec{{
			ID: "demo", Name: "Demo tenant",
			Keys: []tenants.KeySpec{{Name: "demo", SHA256: tenants.HashKey(key)}},
		}},
			Database: tenants.DatabaseConfig{URL: "sqlite:" + filepath.Join(dataDir, "usher.db")},
			Admin:    tenants.AdminConfig{Token: adminToken},
		},
		Log: LogConfig{Level: "info", Format: "text"},
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	err = serve(ctx, cfg, logger, serveHooks{ready: func(addr net.Addr) {
		printBanner(out, addr.String(), key, adminToken, n)
	}})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

func printBanner(out io.Writer, addr, key, adminToken string, workers int) {
	base := "http://" + addr
	fmt.Fprintf(out, `
usher demo: gateway on %[1]s, %[3]d simulated workers serving model %[4]q, tenant "demo".

Export these for any OpenAI client:
OPENAI_BASE_URL=%[1]s/v1
OPENAI_API_KEY=%[2]s

Try a streamed chat completion:
  curl -N %[1]s/v1/chat/completions -H "Authorization: Bearer %[2]s" -H "Content-Type: application/json" -d '{"model":"%[4]s","stream":true,"messages":[{"role":"user","content":"Hello, usher!"}]}'

Console: %[1]s/admin/  (sign in with the admin token)
Admin API (workers, pins, queue, tenants, keys): %[1]s/admin/api/v1/  token: %[5]s
  curl %[1]s/admin/api/v1/workers -H "Authorization: Bearer %[5]s"
Metrics: %[1]s/metrics    Ready: %[1]s/readyz
Ctrl-C stops everything.

`, base, key, workers, demoModel, adminToken)
}
