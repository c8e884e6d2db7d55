package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/usherllm/usher/test/bench"
)

// runBench is `usher bench`: it parses args, runs the load generator until its end or SIGINT or
// SIGTERM, prints the table to stdout and, with --out, writes the JSON report to a file, with
// --html the HTML report. `usher bench report` writes the HTML report of JSON reports instead
// (benchReport). It returns the exit code: 0 done, 1 the run failed (the report is still
// printed when there is one), 2 bad flags.
func runBench(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return benchMain(ctx, args, os.Stdout, os.Stderr)
}

// benchMain is runBench with its context and outputs given.
func benchMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "report" {
		return benchReport(args[1:], stderr)
	}
	fs := flag.NewFlagSet("usher bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: usher bench --url http://HOST:PORT/v1 --model NAME [flags]")
		fmt.Fprintln(stderr, "       usher bench report --html FILE [NAME=]REPORT.json...")
		fmt.Fprintln(stderr, "Open-loop load generator for OpenAI-compatible endpoints. Without --url and --api-key (and")
		fmt.Fprintln(stderr, "--tenant), it takes $OPENAI_BASE_URL and $OPENAI_API_KEY, as OpenAI's client libraries do.")
		fs.PrintDefaults()
	}
	var cfg bench.Config
	cfg.RegisterFlags(fs)
	out := fs.String("out", "", "write the JSON report to this file")
	htmlOut := fs.String("html", "", "write the HTML report (plots, one self-contained page) to this file")
	name := fs.String("name", "", "the run's name in the HTML report (default: the workload)")
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
	// Read after parsing, so -h never prints the key as a default.
	if cfg.URL == "" {
		cfg.URL = os.Getenv("OPENAI_BASE_URL")
	}
	if cfg.APIKey == "" && len(cfg.Tenants) == 0 {
		cfg.APIKey = os.Getenv("OPENAI_API_KEY")
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
		if werr := writeFile(*out, rep.WriteJSON); werr != nil {
			fmt.Fprintf(stderr, "usher bench: %v\n", werr)
			return 1
		}
	}
	if *htmlOut != "" {
		runName := cmp.Or(*name, rep.Run.Workload)
		if werr := writeFile(*htmlOut, func(w io.Writer) error {
			return bench.WriteHTML(w, []bench.NamedReport{{Name: runName, Report: rep}})
		}); werr != nil {
			fmt.Fprintf(stderr, "usher bench: %v\n", werr)
			return 1
		}
	}
	return code
}

// benchReport is `usher bench report`: the HTML report of JSON reports written by --out, side
// by side in the order given, each named NAME or by its file name. Exit codes as runBench's.
func benchReport(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("usher bench report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: usher bench report --html FILE [NAME=]REPORT.json...")
		fmt.Fprintln(stderr, "One HTML page comparing the runs of `usher bench --out REPORT.json` side by side, e.g.")
		fmt.Fprintln(stderr, "  usher bench report --html bakeoff.html least_request=lr.json cache_aware=ca.json")
		fs.PrintDefaults()
	}
	htmlOut := fs.String("html", "", "write the HTML report to this file (required)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *htmlOut == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usher bench report: need --html FILE and at least one JSON report")
		return 2
	}
	var runs []bench.NamedReport
	for _, arg := range fs.Args() {
		name, path, ok := strings.Cut(arg, "=")
		if !ok {
			path = arg
			name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		data, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintf(stderr, "usher bench report: %v\n", err)
			return 1
		}
		var rep bench.Report
		if err := json.Unmarshal(data, &rep); err != nil {
			fmt.Fprintf(stderr, "usher bench report: %s is not a JSON report of usher bench: %v\n", path, err)
			return 1
		}
		runs = append(runs, bench.NamedReport{Name: name, Report: &rep})
	}
	if err := writeFile(*htmlOut, func(w io.Writer) error { return bench.WriteHTML(w, runs) }); err != nil {
		fmt.Fprintf(stderr, "usher bench report: %v\n", err)
		return 1
	}
	return 0
}

// writeFile creates path and writes it with write.
func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
