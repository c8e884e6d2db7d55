package adminui

import (
	"bytes"
	"context"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// loadOpenAPI fetches the document the gateway serves, without a credential, and validates it
// as OpenAPI 3.
func loadOpenAPI(t *testing.T, g *testGateway) *openapi3.T {
	t.Helper()
	resp, err := http.Get(g.url + openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("GET %s: got %d %s, want 200 application/json", openAPIPath, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	doc, err := openapi3.NewLoader().LoadFromData(body)
	if err != nil {
		t.Fatalf("the served document does not load as OpenAPI: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("the served document is not valid OpenAPI 3: %v", err)
	}
	return doc
}

// echoParam is a path parameter as Echo writes it (":id"); OpenAPI writes "{id}".
var echoParam = regexp.MustCompile(`:([A-Za-z0-9_]+)`)

// TestOpenAPIDocumentsEveryRoute holds admin-ui/openapi.yaml to the routes the admin plane
// really serves: every route is documented and every documented operation is served.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	g := startTenantsGateway(t)
	doc := loadOpenAPI(t, g)

	served := map[string]bool{}
	for _, r := range g.plane.echo.Routes() {
		path, ok := strings.CutPrefix(r.Path, apiPrefix)
		if !ok || !slices.Contains([]string{http.MethodGet, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}, r.Method) {
			continue // the console's routes, and Echo's not-found catch-alls of the group
		}
		served[r.Method+" "+echoParam.ReplaceAllString(path, "{$1}")] = true
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented[method+" "+path] = true
		}
	}
	if len(served) < 20 {
		t.Fatalf("found only %d admin API routes (%v): the route listing is broken", len(served), served)
	}
	for _, route := range slices.Sorted(maps.Keys(served)) {
		if !documented[route] {
			t.Errorf("route %s is served but not documented: add it under paths in admin-ui/openapi.yaml",
				strings.Replace(route, " ", " "+apiPrefix, 1))
		}
	}
	for _, route := range slices.Sorted(maps.Keys(documented)) {
		if !served[route] {
			t.Errorf("admin-ui/openapi.yaml documents %s, which the admin plane does not serve",
				strings.Replace(route, " ", " "+apiPrefix, 1))
		}
	}
}

// TestOpenAPIDescribesAnswers calls every documented operation on a real gateway and checks
// the requests sent and the answers got against the document: bodies with exactly the
// documented field names and types, and only documented statuses.
func TestOpenAPIDescribesAnswers(t *testing.T) {
	g := startTenantsGatewayRouted(t, "sticky_session")
	doc := loadOpenAPI(t, g)
	newBrowser(t, g.url).signIn(rootToken) // a console session to list and end
	worker := newFakeWorker(t)
	vars := map[string]string{"{worker_url}": worker.srv.URL}
	calls := []struct {
		method, route, path, body string
		token                     string // "": rootToken; "-": none
		status                    int
	}{
		{"GET", "/openapi.json", "/openapi.json", "", "-", 200},
		{"GET", "/workers", "/workers", "", "-", 401},
		{"GET", "/workers", "/workers", "", "", 200},
		{"POST", "/workers", "/workers", `{"id":"w3","url":"{worker_url}","models":["m1"],"max_concurrency":4}`, "", 201},
		{"POST", "/workers", "/workers", `{"id":"w3","url":"{worker_url}","models":["m1"]}`, "", 409},
		{"POST", "/workers", "/workers", `{"id":"w4","url":"{worker_url}","models":["m1"],"weight":2}`, "", 400},
		{"GET", "/workers/{id}", "/workers/w3", "", "", 200},
		{"PUT", "/workers/{id}", "/workers/w3", `{"id":"w3","url":"{worker_url}","models":["m1"],"max_concurrency":8}`, "", 200},
		{"GET", "/workers/{id}", "/workers/nope", "", "", 404},
		{"POST", "/workers/{id}/drain", "/workers/w3/drain", "", "", 200},
		{"POST", "/pins", "/pins", `{"model":"m1","tenant":"acme","key":"s-2","worker":"w3"}`, "", 409}, // w3 is drained
		{"POST", "/workers/{id}/undrain", "/workers/w3/undrain", "", "", 200},
		{"POST", "/pins", "/pins", `{"model":"m1","tenant":"acme","key":"s-1","worker":"w1","ttl_seconds":600}`, "", 200},
		{"GET", "/pins", "/pins?model=m1&tenant=acme", "", "", 200},
		{"POST", "/pins", "/pins", `{"model":"m1","tenant":"acme","key":"s-3","worker":"w1"}`, "", 200},
		{"GET", "/pins", "/pins?limit=1", "", "", 200}, // a page with a next
		{"GET", "/pins", "/pins?limit=0", "", "", 400},
		{"GET", "/pins", "/pins?after=nonsense", "", "", 400},
		{"POST", "/pins/move", "/pins/move", `{"from":"w1","to":"w2"}`, "", 200},
		{"DELETE", "/pins", "/pins?model=m1&tenant=acme&key=s-1", "", "", 204},
		{"DELETE", "/workers/{id}", "/workers/w3", "", "", 204},
		{"GET", "/queue", "/queue", "", "", 200},
		{"GET", "/overview", "/overview", "", "", 200},
		{"GET", "/fleet", "/fleet", "", "", 200},
		{"GET", "/console-sessions", "/console-sessions", "", "", 200},
		{"DELETE", "/console-sessions/{id}", "/console-sessions/{session_id}", "", "", 204},
		{"POST", "/tenants", "/tenants", `{"id":"acme","name":"Acme","tier":"pro"}`, "", 201},
		{"GET", "/tenants", "/tenants?q=acm", "", "", 200},
		{"GET", "/tenants/{id}", "/tenants/acme", "", "", 200},
		{"PATCH", "/tenants/{id}", "/tenants/acme", `{"name":"Acme Corp"}`, "", 200},
		{"POST", "/tenants/{id}/suspend", "/tenants/acme/suspend", "", "", 200},
		{"POST", "/tenants/{id}/resume", "/tenants/acme/resume", "", "", 200},
		{"POST", "/tenants/{id}/keys", "/tenants/acme/keys", `{"name":"ci","manage_keys":true,"expires":"2099-01-01T00:00:00Z"}`, "", 201},
		{"GET", "/tenants/{id}/keys", "/tenants/acme/keys", "", "", 200},
		{"PUT", "/tenants/{id}/budget", "/tenants/acme/budget", `{"tokens_per_day":1000,"requests_per_month":50}`, "", 200},
		{"GET", "/tenants/{id}/budget", "/tenants/acme/budget", "", "", 200},
		{"PUT", "/tenants/{id}/keys/{key}/budget", "/tenants/acme/keys/{key_id}/budget", `{"tokens_per_month":500}`, "", 200},
		{"GET", "/tenants/{id}/keys/{key}/budget", "/tenants/acme/keys/{key_id}/budget", "", "", 200},
		{"DELETE", "/tenants/{id}/keys/{key}/budget", "/tenants/acme/keys/{key_id}/budget", "", "", 204},
		{"DELETE", "/tenants/{id}/budget", "/tenants/acme/budget", "", "", 204},
		{"PUT", "/tenants/{id}/budget", "/tenants/acme/budget", `{"tokens_per_day":-1}`, "", 400},
		{"GET", "/usage", "/usage?tenant=acme&from=2026-01-01", "", "", 200},
		{"GET", "/usage", "/usage?format=csv", "", "", 200},
		{"GET", "/usage", "/usage?from=yesterday", "", "", 400},
		{"GET", "/attainment", "/attainment", "", "", 200},
		{"GET", "/attainment", "/attainment?tier=pro&from=2026-01-01&to=2026-01-02", "", "", 200},
		{"GET", "/attainment", "/attainment?from=2026-01-02&to=2026-01-01", "", "", 400},
		{"DELETE", "/tenants/{id}/keys/{key}", "/tenants/acme/keys/{key_id}", "", "", 204},
		{"GET", "/tenants/{id}/keys", "/tenants/acme/keys", "", "", 200},
		{"GET", "/tiers", "/tiers", "", "", 200},
		{"GET", "/audit", "/audit?limit=100", "", "", 200},
		{"GET", "/audit", "/audit?limit=0", "", "", 400},
		{"POST", "/tenants", "/tenants", `{"id":"globex","name":"Globex"}`, viewerToken, 403},
		{"DELETE", "/tenants/{id}", "/tenants/acme", "", "", 204},
	}
	opts := &openapi3filter.Options{IncludeResponseStatus: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}
	answered := map[string]bool{}
	for _, call := range calls {
		name := call.method + " " + call.path
		path, body := call.path, call.body
		for k, v := range vars {
			path, body = strings.ReplaceAll(path, k, v), strings.ReplaceAll(body, k, v)
		}
		item := doc.Paths.Value(call.route)
		if item == nil || item.GetOperation(call.method) == nil {
			t.Fatalf("%s: %s %s is not documented", name, call.method, call.route)
		}
		route := &routers.Route{Spec: doc, Path: call.route, PathItem: item, Method: call.method, Operation: item.GetOperation(call.method)}
		req, err := http.NewRequest(call.method, g.url+apiPrefix+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		switch call.token {
		case "":
			req.Header.Set("Authorization", "Bearer "+rootToken)
		case "-":
		default:
			req.Header.Set("Authorization", "Bearer "+call.token)
		}
		in := &openapi3filter.RequestValidationInput{Request: req, PathParams: pathParams(call.route, path), Route: route, Options: opts}
		if call.status < 300 {
			// What a client sends by the document is what the gateway takes.
			if err := openapi3filter.ValidateRequest(context.Background(), in); err != nil {
				t.Fatalf("%s: the request does not follow the document: %v", name, err)
			}
			req.Body = io.NopCloser(strings.NewReader(body))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != call.status {
			t.Fatalf("%s: got %d, want %d: %s", name, resp.StatusCode, call.status, got)
		}
		err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
			RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Body: io.NopCloser(bytes.NewReader(got)), Options: opts})
		if err != nil {
			t.Fatalf("%s: the %d answer does not match admin-ui/openapi.yaml: %v\nanswer: %s", name, resp.StatusCode, err, got)
		}
		if call.status < 300 {
			answered[call.method+" "+call.route] = true
		}
		if m := regexp.MustCompile(`"key":\{"id":"([^"]+)"`).FindSubmatch(got); m != nil {
			vars["{key_id}"] = string(m[1])
		}
		if m := regexp.MustCompile(`"sessions":\[\{"id":"([0-9a-f]+)"`).FindSubmatch(got); m != nil {
			vars["{session_id}"] = string(m[1])
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !answered[method+" "+path] {
				t.Errorf("no call checked a successful answer of %s %s: add one to this test", method, path)
			}
		}
	}
}

// pathParams matches the OpenAPI route template against the path (without its query).
func pathParams(route, path string) map[string]string {
	path, _, _ = strings.Cut(path, "?")
	rs, ps := strings.Split(route, "/"), strings.Split(path, "/")
	out := map[string]string{}
	for i, r := range rs {
		if strings.HasPrefix(r, "{") && i < len(ps) {
			out[strings.Trim(r, "{}")] = ps[i]
		}
	}
	return out
}
