package adminui

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/migrations"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

const viewerToken = "viewer-token-of-24-characters-or-more"

// startTenantsGateway is a gateway with the real tenant directory and admin service (SQLite),
// an admin and a viewer token, in front of two fake workers w1 and w2 whose model pins sessions.
func startTenantsGateway(t *testing.T) *testGateway {
	t.Helper()
	return startTenantsGatewayRouted(t, "sticky_session")
}

// startTenantsGatewayRouted is startTenantsGateway with the workers routed by policy.
func startTenantsGatewayRouted(t *testing.T, policy string) *testGateway {
	t.Helper()
	g, _ := startTenantsReplicaRouted(t, filepath.Join(t.TempDir(), "usher.db"), rootToken, policy)
	return g
}

// startTenantsReplica is startTenantsGateway on the SQLite file db with admin token token: two
// calls with the same file are two replicas of one deployment. Console sessions are stored.
func startTenantsReplica(t *testing.T, db, token string) (*testGateway, *tenants.Store) {
	t.Helper()
	return startTenantsReplicaRouted(t, db, token, "sticky_session")
}

// startTenantsReplicaRouted is startTenantsReplica with the workers routed by policy.
func startTenantsReplicaRouted(t *testing.T, db, token, policy string) (*testGateway, *tenants.Store) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := tenants.Config{Admin: tenants.AdminConfig{Token: token, ViewerToken: viewerToken},
		Tiers: []tenants.Tier{{Name: "pro", Weight: 4}, {Name: "free", Weight: 1}}} // free grants less than pro
	cfg.Database.URL = "sqlite:" + db
	cfg.SetDefaults()
	store, err := tenants.Open(ctx, cfg.Database.URL, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.MigrateUp(ctx); err != nil {
		t.Fatal(err)
	}
	dir, err := tenants.NewDirectory(ctx, cfg, store, tenants.DirectoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tenants.NewAdmin(cfg.Admin, store, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := newFakeWorker(t)
	specs := []routing.WorkerSpec{w.spec("w1"), w.spec("w2")}
	return startGateway(t, specs, func(s *setup) {
		s.Auth, s.Admins, s.Tenants, s.Sessions = dir, admin, admin, store
		s.Pool = newPool(t, specs, policy)
	}), store
}

// browser is a cookie-keeping client that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (b *browser) do(method, path string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	req, err := http.NewRequest(method, b.base+path, strings.NewReader(form.Encode()))
	if err != nil {
		b.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of the forms of the page at path.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	resp, body := b.do("GET", path, nil)
	m := csrfInput.FindStringSubmatch(body)
	if resp.StatusCode != 200 || m == nil {
		b.t.Fatalf("GET %s: status %d, no CSRF token in the page", path, resp.StatusCode)
	}
	return m[1]
}

// signIn signs in with token and returns the session's CSRF token.
func (b *browser) signIn(token string) string {
	b.t.Helper()
	resp, _ := b.do("POST", "/admin/signin", url.Values{"csrf": {b.csrf("/admin/signin")}, "token": {token}})
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/overview" {
		b.t.Fatalf("sign in: got %d to %q, want 303 to /admin/overview", resp.StatusCode, resp.Header.Get("Location"))
	}
	return b.csrf("/admin/workers")
}

// consolePosts are every state-changing console route with a form that would succeed.
func consolePosts() []struct {
	path string
	form url.Values
} {
	return []struct {
		path string
		form url.Values
	}{
		{"/admin/workers", url.Values{"id": {"w9"}, "url": {"http://127.0.0.1:9"}, "models": {testModel}}},
		{"/admin/workers/change", url.Values{"id": {"w9"}, "url": {"http://127.0.0.1:10"}, "models": {testModel}}},
		{"/admin/workers/w1/drain", url.Values{}},
		{"/admin/workers/w1/undrain", url.Values{}},
		{"/admin/pins", url.Values{"model": {testModel}, "tenant": {"acme"}, "key": {"s1"}, "worker": {"w1"}}},
		{"/admin/pins/delete", url.Values{"model": {testModel}, "tenant": {"acme"}, "key": {"s0"}}},
		{"/admin/pins/move", url.Values{"from": {"w1"}, "to": {"w2"}}},
		{"/admin/workers/w2/remove", url.Values{}},
		{"/admin/tenants", url.Values{"id": {"newco"}, "tier": {"pro"}}},
		{"/admin/tenants/acme/suspend", url.Values{}},
		{"/admin/tenants/acme/resume", url.Values{}},
		{"/admin/tenants/acme/keys", url.Values{"name": {"k2"}}},
		{"/admin/tenants/acme/keys/KEYID/revoke", url.Values{}},
	}
}

var consoleGets = []string{"/admin/", "/admin/overview", "/admin/workers", "/admin/sessions", "/admin/signins", "/admin/tenants",
	"/admin/tenants/acme", "/admin/queue", "/admin/audit"}

// fixture creates tenant acme with a key and pins session s0 to w1; it returns the key's id.
func consoleFixture(t *testing.T, g *testGateway) string {
	t.Helper()
	if resp, out := g.admin(t, "POST", "/tenants", rootToken, `{"id":"acme","name":"Acme","tier":"pro"}`); resp.StatusCode != 201 {
		t.Fatalf("create tenant: %d %v", resp.StatusCode, out)
	}
	_, out := g.admin(t, "POST", "/tenants/acme/keys", rootToken, `{"name":"ci"}`)
	keyID, _ := out["key"].(map[string]any)["id"].(string)
	if resp, out := g.admin(t, "POST", "/pins", rootToken, `{"model":"`+testModel+`","tenant":"acme","key":"s0","worker":"w1"}`); resp.StatusCode != 200 {
		t.Fatalf("pin: %d %v", resp.StatusCode, out)
	}
	return keyID
}

func TestConsoleRequiresSession(t *testing.T) {
	g := startTenantsGateway(t)
	b := newBrowser(t, g.url)
	for _, path := range consoleGets {
		t.Run("GET "+path, func(t *testing.T) {
			resp, body := b.do("GET", path, nil)
			if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/admin/signin" {
				t.Fatalf("got %d to %q, want 303 to /admin/signin", resp.StatusCode, resp.Header.Get("Location"))
			}
			if strings.Contains(body, "<table") {
				t.Fatal("the redirect carries page content")
			}
		})
	}
	for _, path := range []string{"/admin/overview/live", "/admin/workers/live"} {
		if resp, _ := b.do("GET", path, nil); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s: got %d, want 401", path, resp.StatusCode)
		}
	}
	for _, p := range consolePosts() {
		if resp, _ := b.do("POST", p.path, p.form); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST %s without a session: got %d, want 401", p.path, resp.StatusCode)
		}
	}
	// A forged or tampered cookie is no session.
	for _, v := range []string{"x", "YWRtaW58OTk5OTk5OTk5OXxhYmM.AAAA", ""} {
		req, _ := http.NewRequest("GET", g.url+"/admin/workers", nil)
		req.AddCookie(&http.Cookie{Name: sessionCookie, Value: v})
		resp, err := b.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther {
			t.Errorf("forged cookie %q: got %d, want 303", v, resp.StatusCode)
		}
	}
	for _, path := range []string{"/workers", "/pins", "/queue", "/overview", "/tenants", "/audit"} {
		if resp, _ := g.admin(t, "GET", path, "", ""); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("API GET %s without a credential: got %d, want 401", path, resp.StatusCode)
		}
	}
}

func TestConsoleSignIn(t *testing.T) {
	g := startTenantsGateway(t)
	consoleFixture(t, g)
	_, out := g.admin(t, "POST", "/tenants/acme/keys", rootToken, `{"name":"tenant-cred"}`)
	tenantKey, _ := out["secret"].(string)
	tests := []struct {
		name, token string
		csrf        func(b *browser) string
		want        int
	}{
		{"admin", rootToken, func(b *browser) string { return b.csrf("/admin/signin") }, http.StatusSeeOther},
		{"viewer", viewerToken, func(b *browser) string { return b.csrf("/admin/signin") }, http.StatusSeeOther},
		{"wrong token", rootToken + "x", func(b *browser) string { return b.csrf("/admin/signin") }, http.StatusUnauthorized},
		{"tenant key", tenantKey, func(b *browser) string { return b.csrf("/admin/signin") }, http.StatusUnauthorized},
		{"no csrf", rootToken, func(b *browser) string { b.csrf("/admin/signin"); return "" }, http.StatusForbidden},
		{"csrf without its cookie", rootToken, func(b *browser) string {
			return newBrowser(t, g.url).csrf("/admin/signin")
		}, http.StatusForbidden},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := newBrowser(t, g.url)
			resp, body := b.do("POST", "/admin/signin", url.Values{"csrf": {tt.csrf(b)}, "token": {tt.token}})
			if resp.StatusCode != tt.want {
				t.Fatalf("got %d, want %d", resp.StatusCode, tt.want)
			}
			if tt.token != "" && strings.Contains(body, tt.token) {
				t.Fatal("the answer shows the token")
			}
			var session *http.Cookie
			for _, ck := range resp.Cookies() {
				if ck.Name == sessionCookie {
					session = ck
				}
			}
			if (session != nil) != (tt.want == http.StatusSeeOther) {
				t.Fatalf("session cookie: got %v, want one only on success", session)
			}
		})
	}
}

func TestConsoleSessionCookieFlags(t *testing.T) {
	g := startTenantsGateway(t)
	for _, tt := range []struct {
		name   string
		proto  string
		secure bool
	}{{"plain http", "", false}, {"behind a TLS proxy", "https", true}} {
		t.Run(tt.name, func(t *testing.T) {
			b := newBrowser(t, g.url)
			token := b.csrf("/admin/signin")
			req, _ := http.NewRequest("POST", g.url+"/admin/signin", strings.NewReader(url.Values{"csrf": {token}, "token": {rootToken}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			if tt.proto != "" {
				req.Header.Set("X-Forwarded-Proto", tt.proto)
			}
			resp, err := b.c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var ck *http.Cookie
			for _, c := range resp.Cookies() {
				if c.Name == sessionCookie {
					ck = c
				}
			}
			if ck == nil {
				t.Fatalf("no session cookie (status %d)", resp.StatusCode)
			}
			if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/admin/" || ck.Secure != tt.secure {
				t.Errorf("got HttpOnly=%v SameSite=%v Path=%q Secure=%v; want HttpOnly, Strict, /admin/, Secure=%v",
					ck.HttpOnly, ck.SameSite, ck.Path, ck.Secure, tt.secure)
			}
			if ck.MaxAge != int(sessionLifetime.Seconds()) || ck.Expires.IsZero() {
				t.Errorf("got MaxAge=%d Expires=%v, want %v and an expiry", ck.MaxAge, ck.Expires, sessionLifetime)
			}
		})
	}
}

func TestConsoleCSRF(t *testing.T) {
	g := startTenantsGateway(t)
	keyID := consoleFixture(t, g)
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	other := newBrowser(t, g.url).signIn(rootToken) // a valid token of another session
	for _, p := range consolePosts() {
		path := strings.Replace(p.path, "KEYID", keyID, 1)
		for _, token := range []string{"", "bm90LWEtdG9rZW4", other} {
			form := url.Values{}
			for k, v := range p.form {
				form[k] = v
			}
			if token != "" {
				form.Set("csrf", token)
			}
			if resp, _ := b.do("POST", path, form); resp.StatusCode != http.StatusForbidden {
				t.Errorf("POST %s with CSRF token %q: got %d, want 403", path, token, resp.StatusCode)
			}
		}
	}
	// Nothing changed.
	if _, out := g.admin(t, "GET", "/workers/w1", rootToken, ""); out["state"] != "healthy" {
		t.Errorf("w1 after refused posts: got %v, want healthy", out["state"])
	}
	if _, out := g.admin(t, "GET", "/tenants/acme", rootToken, ""); out["status"] != "active" {
		t.Errorf("acme after refused posts: got %v, want active", out["status"])
	}
	if resp, _ := g.admin(t, "GET", "/tenants/newco", rootToken, ""); resp.StatusCode != 404 {
		t.Errorf("tenant newco after a refused create: got %d, want 404", resp.StatusCode)
	}
}

func TestConsoleAdminActions(t *testing.T) {
	g := startTenantsGateway(t)
	keyID := consoleFixture(t, g)
	b := newBrowser(t, g.url)
	csrf := b.signIn(rootToken)
	for _, p := range consolePosts() {
		path := strings.Replace(p.path, "KEYID", keyID, 1)
		form := url.Values{"csrf": {csrf}}
		for k, v := range p.form {
			form[k] = v
		}
		resp, body := b.do("POST", path, form)
		if resp.StatusCode != http.StatusSeeOther && resp.StatusCode != http.StatusCreated {
			t.Fatalf("POST %s: got %d, want 303 or 201: %s", path, resp.StatusCode, body)
		}
		if strings.HasSuffix(path, "/keys") && !strings.Contains(body, `id="secret"`) {
			t.Fatalf("POST %s: the page does not show the new secret", path)
		}
	}
	checks := []struct{ path, field, want string }{
		{"/workers/w1", "state", "healthy"}, {"/workers/w9", "url", "http://127.0.0.1:10"}, {"/tenants/newco", "tier", "pro"}, {"/tenants/acme", "status", "active"},
	}
	for _, c := range checks {
		if _, out := g.admin(t, "GET", c.path, rootToken, ""); out[c.field] != c.want {
			t.Errorf("GET %s: got %s=%v, want %v", c.path, c.field, out[c.field], c.want)
		}
	}
	if resp, _ := g.admin(t, "GET", "/workers/w2", rootToken, ""); resp.StatusCode != 404 {
		t.Errorf("removed w2: got %d, want 404", resp.StatusCode)
	}
	// A failed action comes back to its page with the API's message.
	resp, _ := b.do("POST", "/admin/workers/nope/drain", url.Values{"csrf": {csrf}})
	if _, body := b.do("GET", "/admin/workers", nil); resp.StatusCode != http.StatusSeeOther || !strings.Contains(body, `id="error"`) || !strings.Contains(body, "nope") {
		t.Errorf("drain of an unknown worker: got %d, then a page without an error naming it", resp.StatusCode)
	}
	// Sign out ends the session in the browser.
	if resp, _ := b.do("POST", "/admin/signout", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: got %d", resp.StatusCode)
	}
	if resp, _ := b.do("GET", "/admin/workers", nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("after sign out: got %d, want 303 to sign-in", resp.StatusCode)
	}
}

func TestConsoleViewerChangesNothing(t *testing.T) {
	g := startTenantsGateway(t)
	keyID := consoleFixture(t, g)
	b := newBrowser(t, g.url)
	csrf := b.signIn(viewerToken)
	for _, path := range consoleGets {
		resp, body := b.do("GET", path, nil)
		if path == "/admin/" {
			continue
		}
		if resp.StatusCode != 200 {
			t.Errorf("viewer GET %s: got %d, want 200", path, resp.StatusCode)
		}
		for _, form := range []string{`id="add-worker"`, `id="pin-form"`, `id="create-tenant"`, `id="create-key"`, "/drain", "/revoke"} {
			if strings.Contains(body, form) {
				t.Errorf("viewer GET %s: the page offers %s", path, form)
			}
		}
	}
	for _, p := range consolePosts() {
		form := url.Values{"csrf": {csrf}}
		for k, v := range p.form {
			form[k] = v
		}
		path := strings.Replace(p.path, "KEYID", keyID, 1)
		if resp, _ := b.do("POST", path, form); resp.StatusCode != http.StatusForbidden {
			t.Errorf("viewer POST %s: got %d, want 403", path, resp.StatusCode)
		}
	}
	api := []struct {
		method, path, body string
		want               int
	}{
		{"GET", "/workers", "", 200}, {"GET", "/pins", "", 200}, {"GET", "/queue", "", 200}, {"GET", "/overview", "", 200},
		{"GET", "/tenants", "", 200}, {"GET", "/tenants/acme/keys", "", 200}, {"GET", "/audit", "", 200}, {"GET", "/tiers", "", 200},
		{"POST", "/workers", `{"id":"w9","url":"http://127.0.0.1:9","models":["m1"]}`, 403},
		{"DELETE", "/workers/w2", "", 403}, {"POST", "/workers/w1/drain", "", 403}, {"POST", "/workers/w1/undrain", "", 403},
		{"POST", "/pins", `{"model":"` + testModel + `","tenant":"acme","key":"s1","worker":"w1"}`, 403},
		{"DELETE", "/pins?model=" + testModel + "&tenant=acme&key=s0", "", 403}, {"POST", "/pins/move", `{"from":"w1","to":"w2"}`, 403},
		{"POST", "/tenants", `{"id":"newco"}`, 403}, {"PATCH", "/tenants/acme", `{"name":"x"}`, 403}, {"DELETE", "/tenants/acme", "", 403},
		{"POST", "/tenants/acme/suspend", "", 403}, {"POST", "/tenants/acme/keys", `{"name":"k"}`, 403},
		{"DELETE", "/tenants/acme/keys/" + keyID, "", 403},
	}
	for _, a := range api {
		resp, out := g.admin(t, a.method, a.path, viewerToken, a.body)
		if resp.StatusCode != a.want {
			t.Errorf("viewer API %s %s: got %d, want %d (%v)", a.method, a.path, resp.StatusCode, a.want, out)
		}
		if a.want == http.StatusForbidden && errorCode(out) != "read_only" {
			t.Errorf("viewer API %s %s: got code %q, want read_only", a.method, a.path, errorCode(out))
		}
	}
	if _, out := g.admin(t, "GET", "/pins", rootToken, ""); len(out["pins"].([]any)) != 1 {
		t.Errorf("pins after the viewer's attempts: got %v, want only s0", out["pins"])
	}
}

func TestConsoleEscapesNamesAndKeys(t *testing.T) {
	g := startTenantsGateway(t)
	const evil = `<script>alert(1)</script>`
	const evilKey = `"><img src=x onerror=alert(2)>`
	if resp, out := g.admin(t, "POST", "/tenants", rootToken, `{"id":"evil","name":"`+strings.ReplaceAll(evil, `/`, `\/`)+`","tier":"pro"}`); resp.StatusCode != 201 {
		t.Fatalf("create: %d %v", resp.StatusCode, out)
	}
	if resp, out := g.admin(t, "POST", "/pins", rootToken, `{"model":"`+testModel+`","tenant":"evil","key":"\"><img src=x onerror=alert(2)>","worker":"w1"}`); resp.StatusCode != 200 {
		t.Fatalf("pin: %d %v", resp.StatusCode, out)
	}
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	for _, path := range []string{"/admin/tenants", "/admin/tenants/evil", "/admin/sessions", "/admin/sessions?key=" + url.QueryEscape(evilKey), "/admin/audit", "/admin/tenants?q=" + url.QueryEscape(evil)} {
		_, body := b.do("GET", path, nil)
		if strings.Contains(body, evil) || strings.Contains(body, "<img src=x") {
			t.Errorf("GET %s: the page holds the markup unescaped", path)
		}
	}
	_, body := b.do("GET", "/admin/tenants", nil)
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("tenants page: the escaped name is missing")
	}
	_, body = b.do("GET", "/admin/sessions", nil)
	if !strings.Contains(body, "&lt;img src=x onerror=alert(2)&gt;") {
		t.Error("sessions page: the escaped key is missing")
	}
	resp, _ := b.do("GET", "/admin/tenants", nil)
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy: got %q, want script-src 'self'", csp)
	}
}

func TestSessionCodec(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time { return now }
	codec := newSessionCodec(tokenAdmins{}, clock)
	sess, value := codec.issue(roleAdmin)
	if got, err := codec.parse(value); err != nil || got != sess {
		t.Fatalf("parse: got %+v, %v; want %+v", got, err, sess)
	}
	payload, sig, _ := strings.Cut(value, ".")
	forged := b64.EncodeToString([]byte("admin|99999999999|" + sess.ID))
	tests := []struct{ name, value string }{
		{"no signature", payload},
		{"forged payload", forged + "." + sig},
		{"other key", func() string { _, v := newSessionCodec(tokenAdmins{}, clock).issue(roleAdmin); return v }()},
		{"bad role", func() string {
			p := "root|" + strings.SplitN(mustDecode(t, payload), "|", 2)[1]
			return b64.EncodeToString([]byte(p)) + "." + b64.EncodeToString(codec.mac("session", p))
		}()},
	}
	for _, tt := range tests {
		if _, err := codec.parse(tt.value); err == nil {
			t.Errorf("%s: got a session, want an error", tt.name)
		}
	}
	now = now.Add(sessionLifetime)
	if _, err := codec.parse(value); err == nil {
		t.Error("expired session: got a session, want an error")
	}
	other, _ := codec.issue(roleViewer)
	if codec.checkCSRF(sess, codec.csrf(other)) || !codec.checkCSRF(sess, codec.csrf(sess)) || codec.checkCSRF(sess, "") {
		t.Error("CSRF tokens are not tied to their session")
	}
}

func mustDecode(t *testing.T, s string) string {
	t.Helper()
	b, err := b64.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestAdminPinsMoveAndOverview(t *testing.T) {
	g := startTenantsGateway(t)
	consoleFixture(t, g)
	g.admin(t, "POST", "/pins", rootToken, `{"model":"`+testModel+`","tenant":"acme","key":"s1","worker":"w1"}`)
	if _, out := g.admin(t, "GET", "/pins?key=s1", rootToken, ""); len(out["pins"].([]any)) != 1 {
		t.Fatalf("pins by key: got %v, want one", out["pins"])
	}
	if resp, out := g.admin(t, "POST", "/pins/move", rootToken, `{"from":"w1","to":"w2"}`); resp.StatusCode != 200 || out["moved"] != float64(2) {
		t.Fatalf("move: got %d %v, want 200 moved 2", resp.StatusCode, out)
	}
	if _, out := g.admin(t, "GET", "/pins?worker=w2", rootToken, ""); len(out["pins"].([]any)) != 2 {
		t.Fatalf("pins on w2 after the move: got %v, want two", out["pins"])
	}
	if resp, _ := g.admin(t, "POST", "/pins/move", rootToken, `{"from":"nope","to":"w2"}`); resp.StatusCode != 404 {
		t.Fatalf("move from an unknown worker: got %d, want 404", resp.StatusCode)
	}
	if _, out := g.admin(t, "GET", "/tenants?q=ACM", rootToken, ""); len(out["tenants"].([]any)) != 1 {
		t.Fatalf("tenant search: got %v, want acme", out["tenants"])
	}
	_, created := g.admin(t, "POST", "/tenants/acme/keys", rootToken, `{"name":"load"}`)
	secret, _ := created["secret"].(string)
	for range 3 {
		if resp := g.post(t, "/v1/chat/completions", secret, chatBody, nil); resp.StatusCode != 200 {
			t.Fatalf("chat: got %d, want 200", resp.StatusCode)
		}
	}
	_, out := g.admin(t, "GET", "/overview", rootToken, "")
	classes, _ := out["classes"].([]any)
	if out["worker_count"] != float64(2) || len(classes) != 3 {
		t.Fatalf("overview: got %v", out)
	}
	var requests float64
	for _, c := range classes {
		cl := c.(map[string]any)
		requests += cl["requests"].(float64)
		if cl["requests"].(float64) > 0 && cl["ttft_p50_seconds"].(float64) <= 0 {
			t.Errorf("class %v: requests without a TTFT: %v", cl["class"], cl)
		}
	}
	if requests != 3 {
		t.Errorf("overview requests over the classes: got %v, want 3", requests)
	}
}

func TestConsoleAuditIsPaged(t *testing.T) {
	g := startTenantsGateway(t)
	for i := range 55 {
		if resp, _ := g.admin(t, "POST", "/tenants", rootToken, `{"id":"t`+strconv.Itoa(i)+`"}`); resp.StatusCode != 201 {
			t.Fatalf("create t%d: %d", i, resp.StatusCode)
		}
	}
	b := newBrowser(t, g.url)
	b.signIn(viewerToken)
	_, first := b.do("GET", "/admin/audit", nil)
	older := regexp.MustCompile(`href="([^"]+)" id="older"`).FindStringSubmatch(first)
	if older == nil || strings.Count(first, "tenant.create") != 50 {
		t.Fatalf("first page: got %d entries and link %v, want 50 and a link to older ones", strings.Count(first, "tenant.create"), older)
	}
	resp, second := b.do("GET", strings.ReplaceAll(older[1], "&amp;", "&"), nil)
	if resp.StatusCode != 200 || strings.Count(second, "tenant.create") != 5 || strings.Contains(second, `id="older"`) {
		t.Fatalf("second page: got %d with %d entries, want 200 with the 5 oldest and no further link", resp.StatusCode, strings.Count(second, "tenant.create"))
	}
	if !strings.Contains(second, "tenant:t0") || strings.Contains(second, "tenant:t54") {
		t.Error("second page: want the oldest entries only")
	}
}

func TestConsoleCookieSecureOverTLS(t *testing.T) {
	tests := []struct {
		name   string
		tls    bool
		proto  string
		secure bool
	}{
		{"plain", false, "", false},
		{"direct TLS", true, "", true},
		{"proxy says https", false, "https", true},
		{"proxy says http", false, "http", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/admin/signin", nil)
			if tt.tls {
				r.TLS = &tls.ConnectionState{}
			}
			if tt.proto != "" {
				r.Header.Set("X-Forwarded-Proto", tt.proto)
			}
			ck := consoleCookie(r, sessionCookie, "v", sessionLifetime)
			if ck.Secure != tt.secure || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode {
				t.Errorf("got Secure=%v HttpOnly=%v SameSite=%v, want Secure=%v, HttpOnly, Strict", ck.Secure, ck.HttpOnly, ck.SameSite, tt.secure)
			}
		})
	}
}

// The Workers page shows each worker's concurrency and token limits and where they come from.
func TestConsoleWorkersShowTheLimitAndItsSource(t *testing.T) {
	g := startTenantsGateway(t)
	b := newBrowser(t, g.url)
	b.signIn(rootToken)
	_, body := b.do("GET", "/admin/workers", nil)
	if !strings.Contains(body, `class="muted small limit-source"`) || !strings.Contains(body, "learned") {
		t.Fatalf("the Workers page shows no limit source: %.2000s", body)
	}
	if want := fmt.Sprintf("0 / %d tok · config", routing.DefaultMaxTokensInFlight); !strings.Contains(body, want) {
		t.Fatalf("the Workers page shows no token limit %q: %.3000s", want, body)
	}
}

// The address the console logs for a sign-in is the connection's: X-Forwarded-For and X-Real-IP
// are whatever a client sends (issue 10, item 10).
func TestSignInLogsTheConnectionsAddressNotAHeader(t *testing.T) {
	var log bytes.Buffer
	g := startGateway(t, []routing.WorkerSpec{newFakeWorker(t).spec("w1")}, func(s *setup) {
		s.Logger = slog.New(slog.NewTextHandler(&log, nil))
	})
	b := newBrowser(t, g.url)
	csrf := b.csrf("/admin/signin")
	req, _ := http.NewRequest("POST", g.url+"/admin/signin", strings.NewReader(url.Values{"csrf": {csrf}, "token": {adminToken}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	req.Header.Set("X-Real-IP", "7.7.7.7")
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign in: %d, want 303", resp.StatusCode)
	}
	if !strings.Contains(log.String(), "action=console.signin remote=127.0.0.1") || strings.Contains(log.String(), "6.6.6.6") || strings.Contains(log.String(), "7.7.7.7") {
		t.Fatalf("sign-in log: %s; want remote=127.0.0.1 and no header's address", log.String())
	}
}

// The Workers page names the stage a worker of a disaggregated model serves (issue 29).
func TestConsoleWorkersShowTheirRole(t *testing.T) {
	w := newFakeWorker(t)
	pre, dec, both := w.spec("p1"), w.spec("d1"), w.spec("b1")
	pre.Role, dec.Role = routing.RolePrefill, routing.RoleDecode
	g := startGateway(t, []routing.WorkerSpec{pre, dec, both}, nil)
	b := newBrowser(t, g.url)
	b.signIn(adminToken)
	_, body := b.do("GET", "/admin/workers", nil)
	for id, role := range map[string]string{"p1": "prefill", "d1": "decode"} {
		if want := fmt.Sprintf(`id="role-%s" title="the stage of a disaggregated model it serves: prefill or decode">%s<`, id, role); !strings.Contains(body, want) {
			t.Errorf("the Workers page does not show %s as %s: %.3000s", id, role, body)
		}
	}
	if strings.Contains(body, `id="role-b1"`) {
		t.Error("a worker of role both is marked with a role")
	}
	// Each pool heads its workers with their load together: in flight / the limits of those
	// taking requests.
	for _, role := range []string{"prefill", "decode", "both"} {
		pool := body[strings.Index(body, `id="pool-`+role+`"`):]
		pool = pool[:strings.Index(pool, "</tbody>")]
		if !strings.Contains(pool, role+` pool</span>`) || !regexp.MustCompile(`id="pool-load-`+role+`"[^>]*>0 / \d+<`).MatchString(pool) {
			t.Errorf("pool %s: %.1500s; want its heading and its load", role, pool)
		}
		id := map[string]string{"prefill": "p1", "decode": "d1", "both": "b1"}[role]
		if !strings.Contains(pool, `id="worker-`+id+`"`) || strings.Count(pool, `<tr id="worker-`) != 1 {
			t.Errorf("pool %s: want %s alone in it: %.1500s", role, id, pool)
		}
	}
}

// A fleet of one pool (no prefill or decode workers) shows no pool headings.
func TestConsoleWorkersOnePoolHasNoHeading(t *testing.T) {
	w := newFakeWorker(t)
	g := startGateway(t, []routing.WorkerSpec{w.spec("a1"), w.spec("a2")}, nil)
	b := newBrowser(t, g.url)
	b.signIn(adminToken)
	_, body := b.do("GET", "/admin/workers", nil)
	if !strings.Contains(body, `id="worker-a1"`) || !strings.Contains(body, `id="worker-a2"`) || strings.Contains(body, `class="pool-head"`) {
		t.Errorf("one pool: %.3000s; want both workers and no pool heading", body)
	}
}
