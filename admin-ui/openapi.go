package adminui

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"
	"go.yaml.in/yaml/v3"
)

// openAPIPath is where the admin API's OpenAPI document is served, without a credential: it
// describes the routes, never their data.
const openAPIPath = apiPrefix + "/openapi.json"

// openAPIYAML is the OpenAPI 3 document of the admin API, kept in YAML so it reads and diffs
// well. TestOpenAPIDocumentsEveryRoute holds it to the routes registerAPI mounts and to the
// shapes they answer: a route added without its entry fails that test.
//
//go:embed openapi.yaml
var openAPIYAML []byte

// openAPIJSON is openAPIYAML as JSON, converted once.
var openAPIJSON = sync.OnceValues(func() ([]byte, error) {
	var doc any
	if err := yaml.Unmarshal(openAPIYAML, &doc); err != nil {
		return nil, fmt.Errorf("adminui: openapi.yaml: %w", err)
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("adminui: openapi.yaml to JSON: %w", err)
	}
	return out, nil
})

func serveOpenAPI(c echo.Context) error {
	doc, err := openAPIJSON()
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-cache")
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, doc)
}
