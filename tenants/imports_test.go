package tenants

import (
	"go/build"
	"strings"
	"testing"
)

// TestImports keeps the package's place in the design: no HTTP (the gateway writes the rate
// limit headers from Quota) and no other package of the project.
func TestImports(t *testing.T) {
	pkg, err := build.ImportDir(".", 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range pkg.Imports {
		if imp == "net/http" || strings.HasPrefix(imp, "net/http/") || strings.HasPrefix(imp, "github.com/usherllm/usher/") {
			t.Errorf("tenants imports %s", imp)
		}
	}
}
