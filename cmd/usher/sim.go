package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/usherllm/usher/test/sim"
)

// runSim is `usher sim`: a simulated inference engine serving the OpenAI API on --listen until
// SIGINT or SIGTERM. It returns the process exit code: 0 after a signal, 2 for bad flags, 1 when
// serving fails or the engine dies of --exit-after.
func runSim(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return serveSim(ctx, args, os.Stderr, nil)
}

// simShutdownGrace bounds how long a stopping `usher sim` waits for handlers to write their
// last bytes after the engine has ended their requests.
const simShutdownGrace = 5 * time.Second

// serveSim runs `usher sim` until ctx ends. ready, if not nil, is called with the listening
// address once the server accepts connections.
//
// Shutdown order: the engine closes first, so every request in flight (hanging ones included)
// ends at once with an error; then the HTTP server shuts down, letting handlers finish writing.
// When the engine dies of --exit-after it has already dropped every request in flight but the
// last one, whose answer is let out before the process exits.
func serveSim(ctx context.Context, args []string, stderr io.Writer, ready func(net.Addr)) int {
	fs := flag.NewFlagSet("usher sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:9001", "address to serve the OpenAI API, /health and /metrics on")
	kvPort := fs.Int("kv-events-port", 0, "publish KV-cache events as vLLM does (ZeroMQ PUB on this port of the --listen host, replay ROUTER on the next port); 0: none")
	var cfg sim.Config
	cfg.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: usher sim [flags]\n\nServe a simulated OpenAI-compatible inference engine.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "usher sim: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *kvPort < 0 || *kvPort > 65534 {
		fmt.Fprintf(stderr, "usher sim: --kv-events-port must be a port in 0..65534, got %d\n", *kvPort)
		return 2
	}
	if *kvPort > 0 {
		host, _, err := net.SplitHostPort(*listen)
		if err != nil {
			fmt.Fprintf(stderr, "usher sim: --listen: %v\n", err)
			return 2
		}
		cfg.KVEvents = net.JoinHostPort(host, strconv.Itoa(*kvPort))
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "usher sim: %v\n", err)
		return 2
	}

	log := slog.New(slog.NewTextHandler(stderr, nil))
	engine, err := sim.New(cfg, sim.Options{Logger: log})
	if err != nil {
		fmt.Fprintf(stderr, "usher sim: %v\n", err)
		return 2
	}
	defer engine.Close()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(stderr, "usher sim: %v\n", err)
		return 1
	}
	srv := &http.Server{Handler: engine, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	c := engine.Config()
	attrs := []any{"addr", ln.Addr().String(), "model", c.Model, "mode", c.Mode}
	if c.Mode == sim.ModeSlots {
		attrs = append(attrs, "slots", c.Slots)
	} else {
		attrs = append(attrs, "max_num_seqs", c.MaxNumSeqs)
	}
	attrs = append(attrs, "max_num_batched_tokens", c.MaxNumBatchedTokens, "kv_cache_tokens", c.KVCacheTokens, "time_scale", c.TimeScale, "role", c.Role)
	if c.Role != sim.RoleBoth {
		// A decode worker pulls held KV from this address (the vLLM answer's remote_host and
		// remote_port, SGLang's bootstrap_host and bootstrap_port): the sim's HTTP listener is
		// also its side channel and bootstrap server.
		attrs = append(attrs, "engine_id", engine.EngineID())
	}
	log.Info("usher sim serving", attrs...)
	if ready != nil {
		ready(ln.Addr())
	}

	select {
	case <-ctx.Done():
		log.Info("usher sim stopping")
		engine.Close()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), simShutdownGrace)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			_ = srv.Close()
		}
		<-served
		return 0
	case <-engine.Exited():
		// The engine has already dropped every other request; Shutdown only lets the last
		// answer's connection finish its response before the process goes.
		log.Warn("usher sim exiting: --exit-after reached", "requests", c.Faults.ExitAfter)
		shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			_ = srv.Close()
		}
		<-served
		return 1
	case err := <-served:
		log.Error("usher sim: serving failed", "err", err)
		return 1
	}
}
