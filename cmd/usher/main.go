// Command usher is a multi-tenant, priority-queueing API gateway for LLM inference.
//
// Subcommands:
//
//	usher serve --config FILE   run the gateway
//	usher demo                  the gateway with three simulated workers and two demo tenants
//	usher sim --listen ADDR     a simulated OpenAI-compatible inference worker
//	usher bench --url URL       an open-loop load generator for OpenAI-compatible endpoints
//	usher migrate up|status     apply or list the tenant database's migrations
//	usher keyhash               print the SHA-256 of an API key read from stdin (for config files)
//	usher version               print the version of the binary
//
// Every command prints its flags with -h and exits 0.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
)

// Exit codes: 0 success, 1 a failure while running, 2 bad usage or configuration.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

const usage = `usage: usher <command> [flags]

commands:
  serve     run the gateway (--config FILE)
  demo      run the gateway with three simulated workers and two demo tenants
  sim       run a simulated OpenAI-compatible inference worker
  bench     run an open-loop load test against an OpenAI-compatible endpoint
  migrate   apply (up) or list (status) the tenant database's migrations
  keyhash   print the SHA-256 of an API key read from stdin
  version   print the version of this binary

Run 'usher <command> -h' for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(exitUsage)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var code int
	switch cmd {
	case "serve":
		code = runServe(args)
	case "demo":
		code = runDemo(args)
	case "sim":
		code = runSim(args)
	case "bench":
		code = runBench(args)
	case "migrate":
		code = runMigrate(args, os.Stdout, os.Stderr)
	case "keyhash":
		code = runKeyhash(args, os.Stdin, os.Stdout)
	case "version", "--version":
		code = runVersion(args, os.Stdout, os.Stderr)
	case "-h", "--help", "help":
		fmt.Fprint(os.Stdout, usage)
	default:
		fmt.Fprintf(os.Stderr, "usher: unknown command %q\n\n%s", cmd, usage)
		code = exitUsage
	}
	os.Exit(code)
}

// parseFlags parses args into fs. done says the command must stop and return code: 0 after
// -h or --help (the usage is printed), exitUsage after a bad flag (the error is printed).
func parseFlags(fs *flag.FlagSet, args []string) (code int, done bool) {
	err := fs.Parse(args)
	switch {
	case err == nil:
		return exitOK, false
	case errors.Is(err, flag.ErrHelp):
		return exitOK, true
	default:
		return exitUsage, true
	}
}
