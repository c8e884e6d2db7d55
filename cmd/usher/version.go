package main

import (
	"flag"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// version is the release this binary was built from, set by the linker:
// go build -ldflags "-X main.version=v1.2.3" (make build passes `git describe`). Empty: the
// version comes from the build information Go records (module version and VCS revision).
var version string

// runVersion is `usher version`: one line with the version, the commit and the Go release.
func runVersion(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("usher version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprintln(stderr, "usage: usher version\n\nPrints the version of this binary.") }
	if code, done := parseFlags(fs, args); done {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return exitUsage
	}
	info, _ := debug.ReadBuildInfo()
	fmt.Fprintln(stdout, versionLine(version, info))
	return exitOK
}

// versionLine describes a build: "usher VERSION (commit REV[, modified], TIME, GO)". linked is
// the version set by the linker and wins when not empty; info may be nil.
func versionLine(linked string, info *debug.BuildInfo) string {
	v := linked
	var details []string
	if info != nil {
		if v == "" && info.Main.Version != "" {
			v = info.Main.Version
		}
		settings := map[string]string{}
		for _, s := range info.Settings {
			settings[s.Key] = s.Value
		}
		if rev := settings["vcs.revision"]; rev != "" {
			c := "commit " + rev[:min(12, len(rev))]
			if settings["vcs.modified"] == "true" {
				c += ", modified"
			}
			details = append(details, c)
		}
		if t := settings["vcs.time"]; t != "" {
			details = append(details, t)
		}
		details = append(details, info.GoVersion)
	}
	if v == "" {
		v = "(devel)"
	}
	line := "usher " + v
	if len(details) > 0 {
		line += " (" + strings.Join(details, ", ") + ")"
	}
	return line
}
