package adminui

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
)

// sessionCookieOf is the console session cookie b holds for base.
func (b *browser) sessionCookie() *http.Cookie {
	u, _ := url.Parse(b.base + consolePath)
	for _, ck := range b.c.Jar.Cookies(u) {
		if ck.Name == sessionCookie {
			return ck
		}
	}
	return nil
}

// signedIn reports whether the browser's session opens a console page of g (it carries its
// cookie to g, as a load balancer sends one browser to any replica).
func signedIn(t *testing.T, g *testGateway, ck *http.Cookie) bool {
	t.Helper()
	b := newBrowser(t, g.url)
	u, _ := url.Parse(g.url + consolePath)
	b.c.Jar.SetCookies(u, []*http.Cookie{{Name: ck.Name, Value: ck.Value, Path: consolePath}})
	resp, _ := b.do("GET", "/admin/workers", nil)
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusSeeOther:
		return false
	}
	t.Fatalf("GET /admin/workers: got %d, want 200 or a redirect to sign in", resp.StatusCode)
	return false
}

// Two replicas on one database: a session opened on A works on B; signing out on A, or an admin
// ending it on B, refuses it on both at once; the store holds only the id's hash; rotating the
// admin token ends every session.
func TestConsoleSessionsAreServerSide(t *testing.T) {
	db := filepath.Join(t.TempDir(), "usher.db")
	a, store := startTenantsReplica(t, db, rootToken)
	b, _ := startTenantsReplica(t, db, rootToken)

	first := newBrowser(t, a.url)
	csrf := first.signIn(rootToken)
	ck := first.sessionCookie()
	if ck == nil || !signedIn(t, b, ck) {
		t.Fatal("a session opened on A does not open B")
	}
	// Sign out on A: B refuses the copied cookie at once.
	if resp, _ := first.do("POST", "/admin/signout", url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("sign out: got %d, want 303", resp.StatusCode)
	}
	if signedIn(t, b, ck) || signedIn(t, a, ck) {
		t.Fatal("a signed-out session still opens a replica")
	}

	// An admin lists the sessions and ends one on B; A refuses it.
	second := newBrowser(t, a.url)
	second.signIn(rootToken)
	viewer := newBrowser(t, a.url)
	viewer.signIn(viewerToken)
	resp, out := b.admin(t, "GET", "/console-sessions", rootToken, "")
	list, _ := out["sessions"].([]any)
	if resp.StatusCode != 200 || len(list) != 2 {
		t.Fatalf("GET /console-sessions: got %d %v, want the two open sessions", resp.StatusCode, out)
	}
	id := sessionIDHash(mustParseSession(t, second.sessionCookie()))
	for _, s := range list {
		if m, _ := s.(map[string]any); m["id"] == id && m["role"] != "admin" {
			t.Fatalf("session %s: got role %v, want admin", id, m["role"])
		}
	}
	if resp, out := b.admin(t, "DELETE", "/console-sessions/"+id, viewerToken, ""); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the viewer ends a session: got %d %v, want 403", resp.StatusCode, out)
	}
	if resp, out := b.admin(t, "DELETE", "/console-sessions/"+id, rootToken, ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("end session: got %d %v, want 204", resp.StatusCode, out)
	}
	if signedIn(t, a, second.sessionCookie()) {
		t.Fatal("a session an admin ended still opens A")
	}
	if resp, _ := b.admin(t, "DELETE", "/console-sessions/"+id, rootToken, ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("end an ended session: got %d, want 404", resp.StatusCode)
	}
	if signedIn(t, a, viewer.sessionCookie()) != true {
		t.Fatal("ending one session ended another")
	}

	// The store never holds a session's secret id: only its SHA-256.
	secret := mustParseSession(t, viewer.sessionCookie()).ID
	rows, err := store.AdminSessions(context.Background(), keyIDOf(t, store, rootToken), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, s := range rows {
		if strings.Contains(toJSON(s)+s.KeyID, secret) {
			t.Fatalf("the store holds the session id in clear: %+v", s)
		}
		found = found || s.IDHash == sessionIDHash(consoleSession{ID: secret})
	}
	if !found {
		t.Fatalf("the viewer's session is not stored under its id's hash: %+v", rows)
	}

	// The Sign-ins page lists the sessions and ends one (the admin only), here the viewer's.
	admin := newBrowser(t, b.url)
	adminCSRF := admin.signIn(rootToken)
	viewerID := sessionIDHash(mustParseSession(t, viewer.sessionCookie()))
	if resp, page := admin.do("GET", "/admin/signins", nil); resp.StatusCode != 200 || !strings.Contains(page, `data-session="`+viewerID+`"`) || !strings.Contains(page, "(this session)") {
		t.Fatalf("Sign-ins page: got %d, want the viewer's session listed and this one marked", resp.StatusCode)
	}
	if resp, _ := viewer.do("POST", "/admin/signins/"+viewerID+"/end", url.Values{"csrf": {viewer.csrf("/admin/signins")}}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("the viewer ends a session in the console: got %d, want 403", resp.StatusCode)
	}
	if resp, _ := admin.do("POST", "/admin/signins/"+viewerID+"/end", url.Values{"csrf": {adminCSRF}}); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("end the viewer's session in the console: got %d, want 303", resp.StatusCode)
	}
	if signedIn(t, a, viewer.sessionCookie()) {
		t.Fatal("a session ended in the console still opens A")
	}

	// A new admin token (a replica restarted with it): every session opened before is refused.
	if !signedIn(t, a, admin.sessionCookie()) {
		t.Fatal("the admin's session does not open A before the rotation")
	}
	rotated, _ := startTenantsReplica(t, db, rootToken+"-rotated")
	if signedIn(t, rotated, admin.sessionCookie()) {
		t.Fatal("a session of the old tokens opens a replica with the new admin token")
	}
	if _, out := rotated.admin(t, "GET", "/console-sessions", rootToken+"-rotated", ""); len(out["sessions"].([]any)) != 0 {
		t.Fatalf("sessions listed after the rotation: got %v, want none", out["sessions"])
	}
}

// mustParseSession decodes a session cookie the way the replicas do (they share the key).
func mustParseSession(t *testing.T, ck *http.Cookie) consoleSession {
	t.Helper()
	if ck == nil {
		t.Fatal("no session cookie")
	}
	enc, _, _ := strings.Cut(ck.Value, ".")
	fields := strings.Split(mustDecode(t, enc), "|")
	if len(fields) != 3 {
		t.Fatalf("session cookie payload: %q", fields)
	}
	return consoleSession{Role: fields[0], ID: fields[2]}
}

// keyIDOf is the key id of the sessions opened under the admin token token (and viewerToken).
func keyIDOf(t *testing.T, store *tenants.Store, token string) string {
	t.Helper()
	cfg := tenants.Config{Admin: tenants.AdminConfig{Token: token, ViewerToken: viewerToken}, Tiers: []tenants.Tier{{Name: "pro"}}}
	cfg.SetDefaults()
	dir, err := tenants.NewDirectory(context.Background(), cfg, nil, tenants.DirectoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := tenants.NewAdmin(cfg.Admin, store, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return newSessionCodec(admin, time.Now).keyID
}
