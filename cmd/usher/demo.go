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
	"strings"
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
	prefill := fs.Int("prefill-workers", 0, "serve the model disaggregated: this many of the workers prefill, the others decode (vLLM's KV-connector flow)")
	timeScale := fs.Float64("time-scale", 1, "simulated workers' time scale (0.1 = ten times faster)")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: usher demo [flags]\n\nRun the gateway with simulated workers and two demo tenants; the banner says how to try it.")
		fs.PrintDefaults()
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "usher demo: unexpected arguments %q\n", fs.Args())
		return exitUsage
	}
	if *workers < 1 {
		fmt.Fprintln(os.Stderr, "usher demo: --workers must be at least 1")
		return exitUsage
	}
	if *prefill < 0 || *prefill > 0 && *prefill >= *workers {
		fmt.Fprintln(os.Stderr, "usher demo: --prefill-workers must be 0, or fewer than --workers so that some decode")
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := newLogger(LogConfig{Level: *logLevel, Format: "text"}, os.Stderr)
	if err := demo(ctx, *listen, *workers, *prefill, *timeScale, logger, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "usher demo: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// demo runs n simulated workers on free loopback ports (scheduling by priority) and a gateway in
// front of them configured by demoConfig, prints the banner to out, and runs until ctx ends.
// With prefill above 0, the first prefill workers prefill and the others decode: the model is
// served disaggregated. Shutdown order: the gateway first (it drains in-flight requests), then
// the workers.
func demo(ctx context.Context, listen string, n, prefill int, timeScale float64, logger *slog.Logger, out io.Writer) error {
	var specs []routing.WorkerSpec
	for i := 1; i <= n; i++ {
		scfg := sim.DefaultConfig()
		scfg.Model = demoModel
		scfg.TimeScale = timeScale
		role := routing.RoleBoth
		switch {
		case i <= prefill:
			scfg.Role, role = sim.RolePrefill, routing.RolePrefill
		case prefill > 0:
			scfg.Role, role = sim.RoleDecode, routing.RoleDecode
		}
		// Interactive before batch inside the worker too: the gateway hands the class down.
		scfg.SchedulingPolicy = sim.PolicyPriority
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
			PriorityHandoff: true, Role: role,
		})
	}
	keys := demoKeys{
		Interactive: "sk-usher-demo-" + rand.Text(),
		Batch:       "sk-usher-batch-" + rand.Text(),
		Admin:       "usher-admin-" + rand.Text(),
	}
	dataDir, err := os.MkdirTemp("", "usher-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	cfg := demoConfig(listen, specs, keys, "sqlite:"+filepath.Join(dataDir, "usher.db"))
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	err = serve(ctx, cfg, logger, serveHooks{ready: func(addr net.Addr) {
		printBanner(out, addr.String(), keys, n, os.Args[0])
		if prefill > 0 {
			fmt.Fprintf(out, "Disaggregated: the first %d worker(s) prefill, the others decode; X-Usher-Prefill-Worker names the prefill worker.\n\n", prefill)
		}
	}})
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// demoKeys are the secrets of one demo run, drawn at random at every start.
type demoKeys struct {
	Interactive string // tenant demo, tier interactive
	Batch       string // tenant demo-batch, tier batch
	Admin       string // the admin API and the console
}

// The demo's tiers: both have limits, so every answer carries the x-ratelimit-* headers. They
// leave room for the banner's bench line (demoBenchArgs). The batch tier's concurrency stays
// below a client address's connection bound (server.max_connections_per_client, 256) less the
// interactive tier's, with 16 to spare: one bench process sends both tenants' requests from one
// address, and a batch flood past its own cap is refused (429) instead of taking the
// connections the interactive requests need.
var (
	demoInteractiveTier = tenants.Tier{
		Name: "interactive", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassInteractive,
		Weight: 4, RequestsPerMinute: 1200, TokensPerMinute: 1_000_000, MaxConcurrent: 64,
	}
	demoBatchTier = tenants.Tier{
		Name: "batch", HighestClass: tenants.ClassBatch, DefaultClass: tenants.ClassBatch,
		Weight: 1, RequestsPerMinute: 3000, TokensPerMinute: 4_000_000, MaxConcurrent: 176,
	}
)

// demoBenchArgs are the arguments of the banner's `usher bench` line against the demo at base
// (its /v1 URL): for 30 s, an interactive tenant at 2 requests/s beside a batch tenant at 26,
// about 1.2 times what three simulated workers prefill of such prompts (1,024 tokens, 32 out)
// while interactive requests are present, so batch waits in usher's queue while interactive
// goes first; the HTML report shows both classes.
func demoBenchArgs(base string, keys demoKeys) []string {
	return []string{"--url", base, "--model", demoModel, "--workload", "random",
		"--random-input-len", "1024", "--random-output-len", "32", "--random-spread", "0.5", "--duration", "30s",
		"--tenant", "chat=" + keys.Interactive + ":1:interactive:2", "--tenant", "bulk=" + keys.Batch + ":1:batch:26",
		"--html", "report.html"}
}

// demoConfig is the demo's whole configuration: every headline feature on with no flags. Two
// tenants in two tiers with limits (an interactive and a batch key), and demoModel routed by
// sticky_session over cache_aware: requests with an X-Session-ID stay on their session's
// worker, the others and new sessions go where their prompt prefix is cached.
func demoConfig(listen string, workers []routing.WorkerSpec, keys demoKeys, databaseURL string) Config {
	return Config{
		// No load balancer to wait for: Ctrl-C stops the demo at once.
		Server: gateway.Config{Listen: listen, ShutdownSettle: time.Millisecond},
		Routing: routing.Config{Workers: workers, Models: map[string]routing.ModelConfig{
			demoModel: {Policy: "sticky_session", StickySession: routing.StickySessionConfig{Fallback: "cache_aware"}},
		}},
		Tenants: tenants.Config{
			Tiers:       []tenants.Tier{demoInteractiveTier, demoBatchTier},
			DefaultTier: demoInteractiveTier.Name,
			Tenants: []tenants.TenantSpec{
				{ID: "demo", Name: "Demo tenant (interactive)", Tier: demoInteractiveTier.Name,
					Keys: []tenants.KeySpec{{Name: "interactive", SHA256: tenants.HashKey(keys.Interactive)}}},
				{ID: "demo-batch", Name: "Demo tenant (batch)", Tier: demoBatchTier.Name,
					Keys: []tenants.KeySpec{{Name: "batch", SHA256: tenants.HashKey(keys.Batch)}}},
			},
			Database: tenants.DatabaseConfig{URL: databaseURL},
			Admin:    tenants.AdminConfig{Token: keys.Admin},
		},
		Log: LogConfig{Level: "info", Format: "text"},
	}
}

// printBanner tells what the demo runs and how to try it. Its export lines paste into a shell
// as they are; the demo tests of test/binary_test.go read them. Its last command is a bench
// line run with bin, the path this binary was started by.
func printBanner(out io.Writer, addr string, keys demoKeys, workers int, bin string) {
	base := "http://" + addr
	it, bt := demoInteractiveTier, demoBatchTier
	chat := func(key, session string) string {
		return fmt.Sprintf(`curl -sN -D - %s/v1/chat/completions -H "Authorization: Bearer %s" -H "X-Session-ID: %s" `+
			`-H "Content-Type: application/json" -d '{"model":"%s","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"Hello, usher!"}]}'`,
			base, key, session, demoModel)
	}
	fmt.Fprintf(out, `
usher demo: gateway on %[1]s, %[2]d simulated workers serving model %[3]q.

Paste these into a shell for any OpenAI client (the interactive key), and the batch key:
export OPENAI_BASE_URL=%[1]s/v1
export OPENAI_API_KEY=%[4]s
export USHER_BATCH_KEY=%[5]s

Keys (each answer carries x-ratelimit-limit|remaining|reset-requests|tokens headers):
  interactive key $OPENAI_API_KEY: tenant "demo", tier %[6]q, class interactive, %[7]d requests/min, %[8]d tokens/min
  batch key $USHER_BATCH_KEY: tenant "demo-batch", tier %[9]q, class batch (yields to interactive), %[10]d requests/min, %[11]d tokens/min
Routing of %[3]s: sticky_session over cache_aware: an X-Session-ID stays on its worker (X-Usher-Route: sticky),
  new sessions and requests without one go to the worker holding their prompt prefix (cache_hit, cache_miss, ...).

Stream a chat completion with its headers (X-Usher-Worker, X-Usher-Route, X-Usher-Class, x-ratelimit-*), run it twice:
  %[12]s
The same as batch:
  %[13]s

Console: %[1]s/admin/  (sign in with the admin token)
Admin API (workers, pins, queue, tenants, keys): %[1]s/admin/api/v1/  admin token: %[14]s
  curl -s %[1]s/admin/api/v1/pins -H "Authorization: Bearer %[14]s"
  every call, its body and answer: %[1]s/admin/api/v1/openapi.json (OpenAPI 3, no token needed)
Metrics: %[1]s/metrics    Ready: %[1]s/readyz

Interactive beside a batch flood, 30 s, then open report.html (TTFT per class, queue depth):
  %[15]s
Ctrl-C stops everything.

`, base, workers, demoModel, keys.Interactive, keys.Batch,
		it.Name, it.RequestsPerMinute, it.TokensPerMinute, bt.Name, bt.RequestsPerMinute, bt.TokensPerMinute,
		chat(keys.Interactive, "my-chat"), chat(keys.Batch, "my-batch-job"), keys.Admin,
		strings.Join(append([]string{bin, "bench"}, demoBenchArgs(base+"/v1", keys)...), " "))
}
