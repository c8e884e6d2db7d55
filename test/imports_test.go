package test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The import rules of the design (DESIGN.md, section 2), checked over `go list`: cmd over gateway
// and adminui over the leaves queue, tenants and routing, which import no other package of the
// project; Echo only at the HTTP edges; jwt only in tenants; no net/http in queue or tenants;
// gateway never imports adminui, whose only importers are cmd and the tests.

const module = "github.com/usherllm/usher"

// goPackage is what the rules read of `go list -json`.
type goPackage struct {
	ImportPath   string
	Imports      []string // direct imports of the package's own files
	Deps         []string // every package it depends on, transitively
	TestImports  []string
	XTestImports []string
}

// Packages of the project, by path below the module.
const (
	pkgGateway = module + "/gateway"
	pkgAdminUI = module + "/admin-ui"
	pkgQueue   = module + "/queue"
	pkgTenants = module + "/tenants"
	pkgRouting = module + "/routing"
	pkgCmd     = module + "/cmd/usher"
	pkgTest    = module + "/test"
)

// importRule is one rule; check returns a line per violation by p.
type importRule struct {
	name  string
	check func(p goPackage) []string
}

var importRules = []importRule{
	{"the leaves import no other package of the project", func(p goPackage) []string {
		if !isLeaf(p.ImportPath) {
			return nil
		}
		return matching(p.Deps, func(dep string) bool { return inModule(dep) && dep != p.ImportPath })
	}},
	{"only gateway, adminui and the tests import Echo", func(p goPackage) []string {
		if p.ImportPath == pkgGateway || p.ImportPath == pkgAdminUI || isTest(p.ImportPath) {
			return nil
		}
		return matching(allImports(p), func(imp string) bool { return under(imp, "github.com/labstack/echo") })
	}},
	{"only tenants and the tests import jwt", func(p goPackage) []string {
		if p.ImportPath == pkgTenants || isTest(p.ImportPath) {
			return nil
		}
		return matching(allImports(p), func(imp string) bool { return under(imp, "github.com/golang-jwt/jwt") })
	}},
	{"queue and tenants do not import net/http", func(p goPackage) []string {
		if p.ImportPath != pkgQueue && p.ImportPath != pkgTenants {
			return nil
		}
		return matching(p.Imports, func(imp string) bool { return imp == "net/http" })
	}},
	{"gateway never imports adminui", func(p goPackage) []string {
		if p.ImportPath != pkgGateway {
			return nil
		}
		return matching(append(slices.Clone(p.Deps), allImports(p)...), func(imp string) bool { return imp == pkgAdminUI })
	}},
	{"only cmd and the tests import adminui", func(p goPackage) []string {
		if p.ImportPath == pkgCmd || p.ImportPath == pkgAdminUI || isTest(p.ImportPath) {
			return nil
		}
		return matching(allImports(p), func(imp string) bool { return imp == pkgAdminUI })
	}},
}

func isLeaf(path string) bool {
	return path == pkgQueue || path == pkgTenants || path == pkgRouting
}

func inModule(path string) bool { return under(path, module) }

func isTest(path string) bool { return under(path, pkgTest) }

// under reports whether path is root or a package below it.
func under(path, root string) bool { return path == root || strings.HasPrefix(path, root+"/") }

// allImports is what p's own files and its tests import directly.
func allImports(p goPackage) []string {
	return slices.Concat(p.Imports, p.TestImports, p.XTestImports)
}

func matching(list []string, bad func(string) bool) []string {
	var out []string
	for _, s := range list {
		if bad(s) && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// importViolations checks every rule over pkgs: one line per rule broken by a package.
func importViolations(pkgs []goPackage) []string {
	var out []string
	for _, r := range importRules {
		for _, p := range pkgs {
			if bad := r.check(p); len(bad) > 0 {
				out = append(out, fmt.Sprintf("%s: %s imports %s", r.name, p.ImportPath, strings.Join(bad, ", ")))
			}
		}
	}
	return out
}

// listPackages runs `go list -json ./...` at the module's root.
func listPackages(t *testing.T) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = ".."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []goPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p goPackage
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	seen := map[string]bool{}
	for _, p := range pkgs {
		seen[p.ImportPath] = true
	}
	for _, want := range []string{pkgGateway, pkgAdminUI, pkgQueue, pkgTenants, pkgRouting, pkgCmd} {
		if !seen[want] {
			t.Fatalf("go list did not list %s: the rules would check nothing", want)
		}
	}
	for _, v := range importViolations(pkgs) {
		t.Error(v)
	}
}

// TestImportRulesCatchViolations breaks each rule once in a made-up module graph.
func TestImportRulesCatchViolations(t *testing.T) {
	tests := []struct {
		name string
		pkg  goPackage
		want string // the rule that must fire
	}{
		{"leaf imports a leaf", goPackage{ImportPath: pkgQueue, Deps: []string{"fmt", pkgTenants}}, importRules[0].name},
		{"leaf imports gateway indirectly", goPackage{ImportPath: pkgRouting, Deps: []string{pkgGateway, pkgQueue}}, importRules[0].name},
		{"queue imports echo", goPackage{ImportPath: pkgQueue, Imports: []string{"github.com/labstack/echo/v4"}}, importRules[1].name},
		{"cmd's tests import echo middleware", goPackage{ImportPath: pkgCmd, TestImports: []string{"github.com/labstack/echo/v4/middleware"}}, importRules[1].name},
		{"gateway imports jwt", goPackage{ImportPath: pkgGateway, Imports: []string{"github.com/golang-jwt/jwt/v5"}}, importRules[2].name},
		{"tenants imports net/http", goPackage{ImportPath: pkgTenants, Imports: []string{"net/http"}}, importRules[3].name},
		{"queue imports net/http", goPackage{ImportPath: pkgQueue, Imports: []string{"context", "net/http"}}, importRules[3].name},
		{"gateway imports adminui", goPackage{ImportPath: pkgGateway, Imports: []string{pkgAdminUI}}, importRules[4].name},
		{"gateway's tests import adminui", goPackage{ImportPath: pkgGateway, XTestImports: []string{pkgAdminUI}}, importRules[4].name},
		{"routing imports adminui", goPackage{ImportPath: pkgRouting, Imports: []string{pkgAdminUI}}, importRules[5].name},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := importViolations([]goPackage{tt.pkg})
			if !slices.ContainsFunc(got, func(v string) bool { return strings.HasPrefix(v, tt.want+":") }) {
				t.Errorf("got %q, want a violation of %q", got, tt.want)
			}
		})
	}
	allowed := []goPackage{
		{ImportPath: pkgAdminUI, Imports: []string{"github.com/labstack/echo/v4", pkgGateway, pkgQueue}},
		{ImportPath: pkgGateway, Imports: []string{"github.com/labstack/echo/v4", "net/http", pkgTenants}},
		{ImportPath: pkgTenants, Imports: []string{"github.com/golang-jwt/jwt/v5"}, Deps: []string{"net/http"}},
		{ImportPath: pkgCmd, Imports: []string{pkgAdminUI, pkgGateway, pkgRouting}},
		{ImportPath: pkgTest, Imports: []string{"github.com/golang-jwt/jwt/v5", "github.com/labstack/echo/v4", pkgAdminUI}},
	}
	if got := importViolations(allowed); len(got) != 0 {
		t.Errorf("allowed imports: got violations %q", got)
	}
}
