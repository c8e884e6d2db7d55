package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/usherllm/usher/test/bench"
)

// runBench is `usher bench`: it parses args, runs the load generator until its end or SIGINT or
// SIGTERM, prints the table to stdout and, with --out, writes the JSON report to a file. It
// returns the exit code: 0 done, 1 the run failed (the report is still printed when there is
// one), 2 bad flags.
func runBench(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

// benchMain is runBench with its context and outputs given.
func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("usher bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: usher bench --url http://HOST:PORT/v1 --model NAME [flags]")
		fmt.Fprintln(stderr, "Open-loop load generator for OpenAI-compatible endpoints.")
		fs.PrintDefaults()
	}
	var cfg bench.Config
	cfg.RegisterFlags(fs)
	out := fs.String("out", "", "write the JSON report to this file")
	quiet := fs.Bool("quiet", false, "log only warnings to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "usher bench: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintf(stderr, "usher bench: invalid flags:\n%v\n", err)
		return 2
	}
	level := slog.LevelInfo
	if *quiet {
		level = slog.LevelWarn
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	rep, err := bench.Run(ctx, cfg, bench.Options{Logger: logger})
	code := 0
	if err != nil {
		fmt.Fprintf(stderr, "usher bench: %v\n", err)
		code = 1
	}
	if rep == nil {
		return 1
	}
	rep.WriteTable(stdout)
	if *out != "" {
		if werr := writeBenchReport(*out, rep); werr != nil {
			fmt.Fprintf(stderr, "usher bench: %v\n", werr)
			return 1
		}
	}
	return code
}

func writeBenchReport(path string, rep *bench.Report) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create report: %w", err)
	}
	if err := rep.WriteJSON(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close report: %w", err)
	}
	return nil
}
