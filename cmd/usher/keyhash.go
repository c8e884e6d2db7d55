package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/usherllm/usher/tenants"
)

// runKeyhash prints the hash to put in a config file's tenants[].keys[].sha256 for the key read
// from stdin (a key on the command line would land in the shell's history).
func runKeyhash(args []string, stdin io.Reader, stdout io.Writer) int {
	fs := flag.NewFlagSet("usher keyhash", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: echo -n KEY | usher keyhash\n\nPrints the lowercase hex SHA-256 of the API key read from stdin.")
	}
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return exitUsage
	}
	line, err := bufio.NewReader(io.LimitReader(stdin, 64<<10)).ReadString('\n')
	key := strings.TrimRight(line, "\r\n")
	if (err != nil && err != io.EOF) || key == "" {
		fmt.Fprintln(os.Stderr, "usher keyhash: expected an API key on stdin")
		return exitUsage
	}
	fmt.Fprintln(stdout, tenants.HashKey(key))
	return exitOK
}
