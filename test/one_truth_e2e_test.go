package test

import (
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/usherllm/usher/test/pgtest"
	"github.com/usherllm/usher/test/redistest"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

// consoleClient is a cookie-keeping client that does not follow redirects: one operator's
// browser, which a load balancer may send to any replica.
type consoleClient struct {
	t   *testing.T
	jar *cookiejar.Jar
	c   *http.Client
}

func newConsoleClient(t *testing.T) *consoleClient {
	jar, _ := cookiejar.New(nil)
	return &consoleClient{t: t, jar: jar, c: &http.Client{Jar: jar, Timeout: 10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// get fetches base+path and returns the status and body.
func (cc *consoleClient) get(base, path string) (int, string) {
	cc.t.Helper()
	resp, err := cc.c.Get(base + path)
	if err != nil {
		cc.t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, b.String()
}

func (cc *consoleClient) post(base, path string, form url.Values) int {
	cc.t.Helper()
	resp, err := cc.c.PostForm(base+path, form)
	if err != nil {
		cc.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// signIn signs in on base and returns the session's CSRF token.
func (cc *consoleClient) signIn(base, token string) string {
	cc.t.Helper()
	_, page := cc.get(base, "/admin/signin")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		cc.t.Fatal("no CSRF token on the sign-in page")
	}
	if st := cc.post(base, "/admin/signin", url.Values{"csrf": {m[1]}, "token": {token}}); st != http.StatusSeeOther {
		cc.t.Fatalf("sign in: got %d, want 303", st)
	}
	_, page = cc.get(base, "/admin/workers")
	if m = csrfField.FindStringSubmatch(page); m == nil {
		cc.t.Fatal("signed in, but no CSRF token on the workers page")
	}
	return m[1]
}

// carryTo copies the cookies the client holds for from to to: the same browser behind a load
// balancer that sends it to another replica.
func (cc *consoleClient) carryTo(from, to string) {
	fu, _ := url.Parse(from + "/admin/")
	tu, _ := url.Parse(to + "/admin/")
	cc.jar.SetCookies(tu, cc.jar.Cookies(fu))
}

// fleetReplicas is GET /admin/api/v1/fleet on base: whether each replica is live, by name.
func fleetReplicas(t *testing.T, base string) map[string]bool {
	t.Helper()
	resp, out := fleetCall(t, "GET", base+"/admin/api/v1/fleet", e2eAdminToken, "", nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /fleet: %d %v", resp.StatusCode, out)
	}
	got := map[string]bool{}
	list, _ := out["replicas"].([]any)
	for _, r := range list {
		m, _ := r.(map[string]any)
		name, _ := m["replica"].(string)
		live, _ := m["live"].(bool)
		got[name] = live
	}
	return got
}

// replicaOf is the name a replica listening at base reports under: it ends with its port.
func replicaOf(names map[string]bool, base string) (string, bool) {
	port := base[strings.LastIndex(base, ":"):]
	for n, live := range names {
		if strings.HasSuffix(n, port) {
			return n, live
		}
	}
	return "", false
}

// TestOneFleetOneTruth is issue 11's fleet: three `usher serve` replicas on one Redis and one
// database (a SQLite file they share, or PostgreSQL) agree on workers, keys, console sessions and
// the console's view of the fleet.
func TestOneFleetOneTruth(t *testing.T) {
	t.Run("sqlite", func(t *testing.T) { testOneFleetOneTruth(t, "sqlite:"+filepath.Join(t.TempDir(), "usher.db")) })
	t.Run("postgres", func(t *testing.T) { testOneFleetOneTruth(t, pgtest.URL(t)) })
}

func testOneFleetOneTruth(t *testing.T, dbURL string) {
	rs := redistest.Start(t)
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.01
	_, configured := simtest.Start(t, cfg)
	extra := sim.DefaultConfig()
	extra.Model, extra.TimeScale = "extra-model", 0.01
	_, added := simtest.Start(t, extra)
	start := func(round int) []*serveProcess {
		var reps []*serveProcess
		for i := range 3 {
			reps = append(reps, startServe(t, fmt.Sprintf("round-%d-replica-%d", round, i), func(listen string) string {
				return fleetConfig(listen, rs.Addr(), dbURL, []string{configured.URL})
			}))
		}
		return reps
	}
	reps := start(0)
	a, b, c := reps[0].url, reps[1].url, reps[2].url
	servedByAdded := func(base string) bool {
		resp, _ := fleetCall(t, "POST", base+"/v1/chat/completions", fleetLoadKey, `{"model":"extra-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, nil)
		return resp.StatusCode == http.StatusOK && resp.Header.Get("X-Usher-Worker") == "added-1"
	}

	t.Run("a worker added on A is used by B and C within a second", func(t *testing.T) {
		body := `{"id":"added-1","url":"` + added.URL + `","models":["extra-model"]}`
		if resp, out := fleetCall(t, "POST", a+"/admin/api/v1/workers", e2eAdminToken, body, nil); resp.StatusCode != http.StatusCreated || out["source"] != "admin" {
			t.Fatalf("add worker on A: %d %v", resp.StatusCode, out)
		}
		addedAt := time.Now()
		eventually(t, time.Second, "B and C serve extra-model on added-1", func() bool { return servedByAdded(b) && servedByAdded(c) })
		t.Logf("the worker added on A served requests on B and C after %v", time.Since(addedAt).Round(time.Millisecond))
		if resp, _ := fleetCall(t, "POST", b+"/admin/api/v1/workers", e2eAdminToken, body, nil); resp.StatusCode != http.StatusConflict {
			t.Fatalf("the same worker added on B: got %d, want 409", resp.StatusCode)
		}
		if resp, out := fleetCall(t, "DELETE", c+"/admin/api/v1/workers/sim-0", e2eAdminToken, "", nil); resp.StatusCode != http.StatusConflict {
			t.Fatalf("removing the config's worker: got %d %v, want 409 (read-only)", resp.StatusCode, out)
		}
	})

	t.Run("a key created on A works on B and C on the first request, 100 times", func(t *testing.T) {
		if resp, out := fleetCall(t, "POST", a+"/admin/api/v1/tenants", e2eAdminToken, `{"id":"acme","tier":"big"}`, nil); resp.StatusCode != http.StatusCreated {
			t.Fatalf("create tenant: %d %v", resp.StatusCode, out)
		}
		for i := range 100 {
			resp, out := fleetCall(t, "POST", a+"/admin/api/v1/tenants/acme/keys", e2eAdminToken, fmt.Sprintf(`{"name":"k%d"}`, i), nil)
			secret, _ := out["secret"].(string)
			if resp.StatusCode != http.StatusCreated || secret == "" {
				t.Fatalf("create key %d: %d %v", i, resp.StatusCode, out)
			}
			for name, base := range map[string]string{"B": b, "C": c} {
				if resp, out := fleetCall(t, "GET", base+"/v1/models", secret, "", nil); resp.StatusCode != http.StatusOK {
					t.Fatalf("key %d, first request on %s: got %d %v, want 200", i, name, resp.StatusCode, out)
				}
			}
		}
	})

	t.Run("a console session signed out on A is refused on B", func(t *testing.T) {
		cc := newConsoleClient(t)
		csrf := cc.signIn(a, e2eAdminToken)
		cc.carryTo(a, b)
		if st, _ := cc.get(b, "/admin/overview"); st != http.StatusOK {
			t.Fatalf("the session opened on A, on B: got %d, want 200", st)
		}
		if st := cc.post(a, "/admin/signout", url.Values{"csrf": {csrf}}); st != http.StatusSeeOther {
			t.Fatalf("sign out on A: got %d, want 303", st)
		}
		// The browser would drop the cookie; a copy of it (stolen, or another tab) is refused.
		stolen := newConsoleClient(t)
		bu, _ := url.Parse(b + "/admin/")
		stolen.jar.SetCookies(bu, cc.jar.Cookies(bu))
		if st, _ := stolen.get(b, "/admin/overview"); st != http.StatusSeeOther {
			t.Fatalf("the signed-out session on B: got %d, want 303 to the sign-in page", st)
		}
	})

	t.Run("the fleet overview shows the three replicas and marks a killed one", func(t *testing.T) {
		eventually(t, 5*time.Second, "A's fleet view shows three live replicas", func() bool {
			got := fleetReplicas(t, a)
			n := 0
			for _, live := range got {
				if live {
					n++
				}
			}
			return n == 3
		})
		ctx := startBrowser(t)
		do(t, ctx, "sign in on A", chromedp.Navigate(a+"/admin/signin"), chromedp.WaitVisible(chromedp.CSS("#signin-form")),
			chromedp.SendKeys(chromedp.CSS("#token"), e2eAdminToken), chromedp.Click(chromedp.CSS("#signin")),
			chromedp.WaitVisible(chromedp.CSS("#fleet-total")))
		do(t, ctx, "three reporting replicas on the overview",
			chromedp.WaitVisible(chromedp.CSS(`#fleet tr.replica[data-live="true"]:nth-of-type(4)`)))
		if got := text(t, ctx, "#fleet-total"); !strings.Contains(got, "3 reporting") {
			t.Fatalf("fleet total: got %q, want 3 reporting", got)
		}
		screenshot(t, ctx, "10-fleet-overview")

		reps[2].signal(syscall.SIGKILL)
		reps[2].exitCode(10 * time.Second)
		killed := time.Now()
		// Reports live 5 s: the killed replica is marked within that, plus a page refresh.
		do(t, ctx, "the killed replica marked as stopped reporting as the page refreshes itself",
			chromedp.WaitVisible(chromedp.CSS(`#fleet tr.replica[data-live="false"] td.gone`)))
		t.Logf("the killed replica was marked as stopped reporting after %v", time.Since(killed).Round(100*time.Millisecond))
		name, live := replicaOf(fleetReplicas(t, b), c)
		if name == "" || live {
			t.Fatalf("B's fleet view of the killed replica: got %q live=%v, want it listed as not live", name, live)
		}
		if got := text(t, ctx, "#fleet-total"); !strings.Contains(got, "2 reporting") || !strings.Contains(got, "1 stopped") {
			t.Fatalf("fleet total after the kill: got %q, want 2 reporting, 1 stopped", got)
		}
		screenshot(t, ctx, "11-fleet-overview-replica-gone")
		do(t, ctx, "the Queue page lists the fleet's queues and the stopped replica",
			chromedp.Navigate(a+"/admin/queue"), chromedp.WaitVisible(chromedp.CSS(`#fleet-queues tr.gone`)))
		if got := text(t, ctx, "#fleet-queues tr.gone"); !strings.Contains(got, "stopped reporting") {
			t.Fatalf("the stopped replica on the Queue page: got %q", got)
		}
		screenshot(t, ctx, "12-fleet-queue")
	})

	t.Run("the added worker survives a restart of all three", func(t *testing.T) {
		for _, r := range reps[:2] {
			r.signal(syscall.SIGKILL)
			r.exitCode(10 * time.Second)
		}
		for _, r := range start(1) {
			if resp, out := fleetCall(t, "GET", r.url+"/admin/api/v1/workers/added-1", e2eAdminToken, "", nil); resp.StatusCode != http.StatusOK || out["source"] != "admin" {
				t.Fatalf("%s after the restart: added-1 got %d %v, want it from the registry", r.name, resp.StatusCode, out)
			}
			if !servedByAdded(r.url) {
				t.Fatalf("%s after the restart: extra-model not served by added-1", r.name)
			}
		}
	})
}
