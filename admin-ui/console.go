package adminui

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The admin console at /admin/: server-rendered pages over the same actions and domain methods
// as the admin JSON API, for a signed-in operator (see console_session.go). Reads are GETs;
// every change is a form POST carrying the session's CSRF token, answered by a redirect back to
// its page (or, for a new key, by the page showing the secret once). The viewer sees every page
// without the forms, and its POSTs are refused with 403.

// console holds the console's parts. Safe for concurrent use after registerConsole.
type console struct {
	p     *Plane
	auth  Authenticator
	ta    *tenants.Admin // nil: no tenants, keys or audit pages
	codec sessionCodec
	pages map[string]*template.Template // by page name; each is the layout plus the page
	// signin is the sign-in page, which has no layout.
	signin *template.Template
}

// consolePages are the page templates parsed with the layout.
var consolePages = []string{"overview", "workers", "sessions", "tenants", "tenant", "queue", "audit", "signins", "usage", "attainment", "error"}

const consoleSessionKey = "usher.console.session"

// registerConsole mounts the console on e. Without the tenant admin service it has no tenant,
// key or audit pages.
func (p *Plane) registerConsole(e *echo.Echo, auth Authenticator) error {
	ta := p.ta
	con := &console{p: p, auth: auth, ta: ta, codec: p.codec, pages: map[string]*template.Template{}}
	funcs := template.FuncMap{
		"workerStates": func() []routing.WorkerState {
			return []routing.WorkerState{routing.StateHealthy, routing.StateDraining, routing.StateDrained, routing.StateUnhealthy, routing.StateCircuitOpen}
		},
		// stateLabel is a worker state for people: circuit_open reads "circuit open".
		"stateLabel": func(s routing.WorkerState) string { return strings.ReplaceAll(string(s), "_", " ") },
		"ms":         func(sec float64) string { return strconv.FormatFloat(sec*1000, 'f', 0, 64) + " ms" },
		"percent":    func(f float64) string { return strconv.FormatFloat(f*100, 'f', 1, 64) + "%" },
		"ratio": func(a, b int64) float64 {
			if b == 0 {
				return 0
			}
			return float64(a) / float64(b)
		},
		"join":  func(s []string) string { return strings.Join(s, ", ") },
		"deref": func(f *float64) float64 { return *f },
		"count": count,
		// chartLegend is the key of the Overview charts' class lines.
		"chartLegend": historyLegend,
		"replicaQueued": func(o Overview) (n int) {
			for _, c := range o.Classes {
				n += c.Queued
			}
			return n
		},
		"replicaInFlight": func(o Overview) (n int) {
			for _, c := range o.Classes {
				n += c.InFlight
			}
			return n
		},
		"replicaTTFT": func(o Overview) (worst float64) {
			for _, c := range o.Classes {
				worst = max(worst, c.TTFTP99Seconds)
			}
			return worst
		},
		"list": func(s ...string) []string { return s },
		"dur": func(d time.Duration) string {
			if d < 10*time.Second {
				return d.Round(time.Millisecond).String()
			}
			return d.Round(time.Second).String()
		},
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "–"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
	}
	for _, p := range consolePages {
		t, err := template.New(p).Funcs(funcs).ParseFS(files, "templates/layout.html", "templates/"+p+".html")
		if err != nil {
			return fmt.Errorf("console: page %s: %w", p, err)
		}
		con.pages[p] = t
	}
	var err error
	if con.signin, err = template.New("signin.html").ParseFS(files, "templates/signin.html"); err != nil {
		return fmt.Errorf("console: sign-in page: %w", err)
	}
	static, err := fs.Sub(files, "static")
	if err != nil {
		return err
	}

	e.GET("/admin", func(c echo.Context) error { return c.Redirect(http.StatusSeeOther, consolePath) })
	g := e.Group("/admin", consoleHeaders)
	g.GET("/static/*", echo.WrapHandler(http.StripPrefix("/admin/static/", http.FileServerFS(static))))
	g.GET("/signin", con.signinPage)
	g.POST("/signin", con.signinSubmit)

	in := g.Group("", con.session)
	in.GET("/", func(c echo.Context) error { return c.Redirect(http.StatusSeeOther, "/admin/overview") })
	in.GET("/overview", con.overviewPage)
	in.GET("/overview/live", con.overviewLive)
	in.GET("/workers", con.workersPage)
	in.GET("/workers/live", con.workersLive)
	in.GET("/sessions", con.sessionsPage)
	in.GET("/queue", con.queuePage)
	in.GET("/signins", con.signinsPage)
	in.POST("/signout", con.signout)

	ch := in.Group("", con.changes)
	ch.POST("/workers", con.act("/admin/workers", con.addWorker))
	ch.POST("/workers/change", con.act("/admin/workers", con.changeWorker))
	ch.POST("/workers/:id/drain", con.act("/admin/workers", con.drain))
	ch.POST("/workers/:id/undrain", con.act("/admin/workers", con.undrain))
	ch.POST("/workers/:id/remove", con.act("/admin/workers", con.remove))
	ch.POST("/pins", con.act("/admin/sessions", con.pin))
	ch.POST("/pins/delete", con.act("/admin/sessions", con.unpin))
	ch.POST("/pins/move", con.act("/admin/sessions", con.movePins))
	ch.POST("/signins/:id/end", con.act("/admin/signins", con.endSignin))
	if ta != nil {
		in.GET("/tenants", con.tenantsPage)
		in.GET("/tenants/:id", con.tenantPage)
		in.GET("/audit", con.auditPage)
		in.GET("/usage", con.usagePage)
		in.GET("/attainment", con.attainmentPage)
		ch.POST("/tenants", con.act("/admin/tenants", con.createTenant))
		ch.POST("/tenants/:id/suspend", con.act("/admin/tenants", con.suspend))
		ch.POST("/tenants/:id/resume", con.act("/admin/tenants", con.resume))
		ch.POST("/tenants/:id/keys", con.createKey)
		ch.POST("/tenants/:id/keys/:key/revoke", con.act("", con.revokeKey))
	}
	return nil
}

// consoleHeaders keeps the console's pages out of caches and frames, and lets them run only
// the console's own script and style.
func consoleHeaders(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Response().Header()
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
			"connect-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'; object-src 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(c.Request().URL.Path, "/admin/static/") {
			h.Set("Cache-Control", "no-store")
		}
		return next(c)
	}
}

// session admits requests with a valid session cookie and, for POSTs, the session's CSRF token
// in the form; it sets the session's actor for the actions. Without a session, a page is
// redirected to the sign-in page and anything else answered 401.
func (con *console) session(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		var sess consoleSession
		err := errBadSession
		if ck, cerr := r.Cookie(sessionCookie); cerr == nil {
			sess, err = con.codec.parse(ck.Value)
		}
		if err == nil {
			err = con.p.checkStoredSession(r.Context(), sess)
		}
		if errors.Is(err, errSessionStore) {
			return refuse(c, err)
		}
		if err != nil {
			if r.Method == http.MethodGet && !strings.HasSuffix(r.URL.Path, "/live") {
				return c.Redirect(http.StatusSeeOther, "/admin/signin")
			}
			return refuse(c, errSignInFirst)
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(c.Response(), r.Body, maxAdminBody)
			if !con.codec.checkCSRF(sess, r.PostFormValue(csrfField)) {
				return refuse(c, errBadCSRF)
			}
		}
		c.Set(consoleSessionKey, sess)
		c.Set(actorKey, sess.actor())
		return next(c)
	}
}

// Refusals of requests the console cannot answer with a page.
var (
	errSignInFirst = fmt.Errorf("%w: sign in first", gateway.ErrAdminCredential)
	errBadCSRF     = fmt.Errorf("%w: missing or invalid CSRF token; reload the page", tenants.ErrForbidden)
	// errSigninExpired: the sign-in form's CSRF token does not match its cookie.
	errSigninExpired = fmt.Errorf("%w: the sign-in form expired", tenants.ErrForbidden)
)

// refuse answers err in plain text with the status the error table gives it.
func refuse(c echo.Context, err error) error {
	ae := gateway.ErrorFor(err)
	return c.String(ae.Status, ae.Message+"\n")
}

// changes refuses the viewer.
func (con *console) changes(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if sessionOf(c).Role != roleAdmin {
			return con.fail(c, "/admin/overview", gateway.ErrReadOnlyActor)
		}
		return next(c)
	}
}

func sessionOf(c echo.Context) consoleSession {
	s, _ := c.Get(consoleSessionKey).(consoleSession)
	return s
}

// pageData is what every page template gets.
type pageData struct {
	Page       string
	Role       string
	CSRF       string
	CanChange  bool
	HasTenants bool
	Flash      string
	Error      string
	Data       any
}

func (con *console) pageData(c echo.Context, page string, data any) pageData {
	sess := sessionOf(c)
	pd := pageData{Page: page, Role: sess.Role, CSRF: con.codec.csrf(sess), CanChange: sess.Role == roleAdmin,
		HasTenants: con.ta != nil, Data: data}
	pd.Flash = takeFlash(c, flashCookie)
	pd.Error = takeFlash(c, refusalCookie)
	return pd
}

// takeFlash reads and clears the one-time message of cookie name ("" without one).
func takeFlash(c echo.Context, name string) string {
	ck, err := c.Request().Cookie(name)
	if err != nil {
		return ""
	}
	c.SetCookie(consoleCookie(c.Request(), name, "", -1))
	msg, err := base64.RawURLEncoding.DecodeString(ck.Value)
	if err != nil {
		return ""
	}
	return string(msg)
}

// setFlash sets the one-time message msg in cookie name, shown by the next page.
func setFlash(c echo.Context, name, msg string) {
	c.SetCookie(consoleCookie(c.Request(), name, base64.RawURLEncoding.EncodeToString([]byte(msg)), time.Minute))
}

// render writes page (or, when block is set, only that template of it) with data.
func (con *console) render(c echo.Context, status int, page, block string, data any) error {
	var buf bytes.Buffer
	name := "layout"
	if block != "" {
		name = block
	}
	if err := con.pages[page].ExecuteTemplate(&buf, name, data); err != nil {
		return fmt.Errorf("console: rendering %s: %w", page, err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}

func (con *console) page(c echo.Context, page string, data any) error {
	return con.render(c, http.StatusOK, page, "", con.pageData(c, page, data))
}

// errorPage is the data of the error page.
type errorPage struct {
	Status  int
	Message string
	Back    string
}

// fail answers a refused action or an unreadable page with the status and message the JSON API
// would give.
func (con *console) fail(c echo.Context, back string, err error) error {
	ae := gateway.Invalid(err)
	return con.render(c, ae.Status, "error", "", con.pageData(c, "", errorPage{Status: ae.Status, Message: ae.Message, Back: back}))
}

// act runs an action and redirects to back (or, when back is empty, to the page the action
// names) with its message as a one-time flash. A refused action comes back to the same page,
// its refusal (the JSON API's message) shown there as a one-time error: no bare error page.
func (con *console) act(back string, action func(c echo.Context) (msg, to string, err error)) echo.HandlerFunc {
	return func(c echo.Context) error {
		msg, to, err := action(c)
		if to == "" {
			to = back
		}
		if err != nil {
			setFlash(c, refusalCookie, "Refused: "+gateway.Invalid(err).Message)
			return c.Redirect(http.StatusSeeOther, to)
		}
		setFlash(c, flashCookie, msg)
		return c.Redirect(http.StatusSeeOther, to)
	}
}

func (con *console) signinPage(c echo.Context) error {
	if ck, err := c.Request().Cookie(sessionCookie); err == nil {
		if s, err := con.codec.parse(ck.Value); err == nil && con.p.checkStoredSession(c.Request().Context(), s) == nil {
			return c.Redirect(http.StatusSeeOther, "/admin/overview")
		}
	}
	return con.renderSignin(c, http.StatusOK, "")
}

func (con *console) renderSignin(c echo.Context, status int, msg string) error {
	nonce := rand.Text()
	c.SetCookie(consoleCookie(c.Request(), signinCookie, nonce, signinLifetime))
	var buf bytes.Buffer
	if err := con.signin.Execute(&buf, struct{ CSRF, Error string }{con.codec.signinCSRF(nonce), msg}); err != nil {
		return fmt.Errorf("console: rendering sign-in: %w", err)
	}
	return c.HTMLBlob(status, buf.Bytes())
}

// signinSubmit checks the token with the Authenticator and opens a session for the admin
// or the viewer; tenant credentials do not open the console.
func (con *console) signinSubmit(c echo.Context) error {
	r := c.Request()
	r.Body = http.MaxBytesReader(c.Response(), r.Body, maxAdminBody)
	var nonce string
	if ck, err := r.Cookie(signinCookie); err == nil {
		nonce = ck.Value
	}
	if !con.codec.checkSigninCSRF(nonce, r.PostFormValue(csrfField)) {
		return con.renderSignin(c, gateway.ErrorFor(errSigninExpired).Status, "The sign-in form expired; try again.")
	}
	if err := con.p.checkAttempts(c); err != nil {
		return con.renderSignin(c, gateway.ErrorFor(err).Status, "Too many failed sign-ins; wait a minute and try again.")
	}
	actor, err := con.auth.AuthenticateActor(r.Context(), r.PostFormValue("token"))
	if err != nil || !actor.Admin && !actor.Viewer {
		con.p.failedAttempt(c, "console.signin.refused")
		return con.renderSignin(c, gateway.ErrorFor(gateway.ErrAdminCredential).Status, "That token is not the admin or viewer token.")
	}
	con.p.acceptedAttempt(c)
	role := roleViewer
	if actor.Admin {
		role = roleAdmin
	}
	sess, value := con.codec.issue(role)
	if err := con.p.storeSession(r, sess); err != nil {
		con.p.log.Error("console session not stored", "err", err)
		return con.renderSignin(c, gateway.ErrorFor(errSessionStore).Status, "The console cannot open a session now; try again shortly.")
	}
	ck := consoleCookie(r, sessionCookie, value, sessionLifetime)
	ck.Expires = sess.Expires
	c.SetCookie(ck)
	c.SetCookie(consoleCookie(r, signinCookie, "", -1))
	con.p.log.Info("admin", "actor", actor.Name, "action", "console.signin", "remote", c.RealIP())
	return c.Redirect(http.StatusSeeOther, "/admin/overview")
}

func (con *console) signout(c echo.Context) error {
	if err := con.p.endSession(c.Request().Context(), sessionIDHash(sessionOf(c))); err != nil && con.p.sessions != nil && !errors.Is(err, tenants.ErrNotFound) {
		con.p.log.Error("console session not ended in the store", "err", err)
		return refuse(c, errSessionStore)
	}
	c.SetCookie(consoleCookie(c.Request(), sessionCookie, "", -1))
	con.p.log.Info("admin", "actor", actorOf(c).Name, "action", "console.signout")
	return c.Redirect(http.StatusSeeOther, "/admin/signin")
}

// count writes a whole number for people, thousands separated: 1234567 reads "1,234,567".
// It takes the integer types the pages hold (int and int64).
func count(n any) string {
	var v int64
	switch n := n.(type) {
	case int:
		v = int64(n)
	case int64:
		v = n
	default:
		return fmt.Sprint(n)
	}
	return thousands(v)
}

func thousands(v int64) string {
	s := strconv.FormatInt(v, 10)
	sign := ""
	if v < 0 {
		sign, s = "-", s[1:]
	}
	var b strings.Builder
	for i, d := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(d)
	}
	return sign + b.String()
}
