package adminui

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The console's pages and actions. Each reads with, or acts through, the same methods as the
// admin JSON API's handlers.

// overviewView is the Overview page: this replica's overview, and the fleet's.
type overviewView struct {
	Overview
	Fleet FleetView
	// FleetError says the other replicas' reports could not be read.
	FleetError string
}

func (con *console) overviewView(c echo.Context) (overviewView, error) {
	o, err := con.p.overview()
	if err != nil {
		return overviewView{}, err
	}
	v := overviewView{Overview: o}
	if v.Fleet, err = con.p.fleetView(c.Request().Context()); err != nil {
		v.FleetError = "the other replicas' reports could not be read"
	}
	return v, nil
}

func (con *console) overviewPage(c echo.Context) error {
	v, err := con.overviewView(c)
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	return con.page(c, "overview", v)
}

func (con *console) overviewLive(c echo.Context) error {
	v, err := con.overviewView(c)
	if err != nil {
		return err
	}
	return con.render(c, http.StatusOK, "overview", "overview-live", v)
}

// workersView is the Workers page: the workers by pool and how many pins each holds.
type workersView struct {
	// Pools are the workers by role, prefill, decode then both, each holding some; a fleet
	// without prefill or decode workers is one pool (the page then shows no pool headings).
	Pools  []workerPool
	Pinned map[string]int
}

// workerPool is the workers of one role (routing.WorkerSpec.Role: the stage of a disaggregated
// model they serve) and their load together: the requests in flight on them all, and the sum
// of the limits of those that take requests now (healthy), which is the room the pool has.
type workerPool struct {
	Role     routing.Role
	Workers  []routing.WorkerStatus
	InFlight int64
	Limit    int64
	Taking   int // the workers that take requests now
}

// poolsOf groups ws (sorted) by role, prefill, decode then both, leaving out the empty pools.
func poolsOf(ws []routing.WorkerStatus) []workerPool {
	pools := []workerPool{{Role: routing.RolePrefill}, {Role: routing.RoleDecode}, {Role: routing.RoleBoth}}
	for _, w := range ws {
		i := 2
		switch w.Role {
		case routing.RolePrefill:
			i = 0
		case routing.RoleDecode:
			i = 1
		}
		p := &pools[i]
		p.Workers = append(p.Workers, w)
		p.InFlight += w.InFlight
		if w.State == routing.StateHealthy {
			p.Limit += w.MaxConcurrency
			p.Taking++
		}
	}
	out := pools[:0]
	for _, p := range pools {
		if len(p.Workers) > 0 {
			out = append(out, p)
		}
	}
	return out
}

func (con *console) workersView(c echo.Context) (workersView, error) {
	v := workersView{Pinned: map[string]int{}}
	pins, err := con.p.fleet.Pins(c.Request().Context(), routing.PinFilter{})
	if err != nil {
		return v, err
	}
	for _, p := range pins {
		v.Pinned[p.Worker]++
	}
	ws := con.p.fleet.Workers()
	sortWorkers(ws)
	v.Pools = poolsOf(ws)
	return v, nil
}

func (con *console) workersPage(c echo.Context) error {
	v, err := con.workersView(c)
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	return con.page(c, "workers", v)
}

func (con *console) workersLive(c echo.Context) error {
	v, err := con.workersView(c)
	if err != nil {
		return err
	}
	return con.render(c, http.StatusOK, "workers", "workers-live", con.pageData(c, "workers", v))
}

// sessionsPageSize is how many pins the Sessions page shows at once.
const sessionsPageSize = 50

// sessionsView is the Sessions page: one page of the pins a search finds, their total, and
// the choices of its forms.
type sessionsView struct {
	Filter routing.PinFilter
	Key    string
	Pins   []routing.Pin
	// Total is how many pins the search finds; First and Last number the page's first and last
	// pin among them (from 1; 0 when none).
	Total, First, Last int
	// Prev and Next are the addresses of the pages before and after this one, "" when there
	// is none.
	Prev, Next string
	Workers    []string
	Models     []string
}

// sessionsPage shows the pins a search finds, sessionsPageSize at a time by page number: it
// lists them all to count them, as the Workers page does (one listing of the search's pins).
func (con *console) sessionsPage(c echo.Context) error {
	v := sessionsView{
		Filter: routing.PinFilter{Model: c.QueryParam("model"), Tenant: c.QueryParam("tenant"), Worker: c.QueryParam("worker")},
		Key:    c.QueryParam("key"),
		Models: con.p.fleet.Models(),
	}
	page := 0
	if s := c.QueryParam("page"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return con.fail(c, "/admin/sessions", gateway.BadRequest("page", "page must be a whole number from 1"))
		}
		page = n - 1
	}
	ws := con.p.fleet.Workers()
	sortWorkers(ws)
	for _, w := range ws {
		v.Workers = append(v.Workers, w.ID)
	}
	f := v.Filter
	f.Key = v.Key
	pins, err := con.p.fleet.Pins(c.Request().Context(), f)
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	v.Total = len(pins)
	from := min(page*sessionsPageSize, v.Total)
	v.Pins = pins[from:min(from+sessionsPageSize, v.Total)]
	if len(v.Pins) > 0 {
		v.First, v.Last = from+1, from+len(v.Pins)
	}
	q := c.Request().URL.Query()
	if page > 0 {
		q.Set("page", strconv.Itoa(max(1, min(page, (v.Total+sessionsPageSize-1)/sessionsPageSize))))
		v.Prev = "/admin/sessions?" + q.Encode()
	}
	if from+sessionsPageSize < v.Total {
		q.Set("page", strconv.Itoa(page+2))
		v.Next = "/admin/sessions?" + q.Encode()
	}
	return con.page(c, "sessions", v)
}

// queuePageView is the Queue page: the fleet's queues by replica, and this replica's in detail.
type queuePageView struct {
	Queues     []queueView
	Fleet      FleetView
	FleetError string
}

func (con *console) queuePage(c echo.Context) error {
	qs, err := con.p.queueViews()
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	v := queuePageView{Queues: qs}
	if v.Fleet, err = con.p.fleetView(c.Request().Context()); err != nil {
		v.FleetError = "the other replicas' reports could not be read"
	}
	return con.page(c, "queue", v)
}

// tenantsView is the Tenants page.
type tenantsView struct {
	Query   string
	Tenants []tenants.Tenant
	Tiers   []tenants.Tier
}

func (con *console) tenantsPage(c echo.Context) error {
	actor := actorOf(c)
	list, err := con.ta.Tenants(c.Request().Context(), actor)
	if err != nil {
		return con.fail(c, "/admin/", err)
	}
	q := c.QueryParam("q")
	return con.page(c, "tenants", tenantsView{Query: q, Tenants: searchTenants(list, q), Tiers: con.ta.Tiers(actor)})
}

// tenantView is one tenant's page; Secret is set only right after a key was created.
type tenantView struct {
	Tenant tenants.Tenant
	Keys   []tenants.APIKey
	Secret string
}

func (con *console) tenantView(c echo.Context, id string) (tenantView, error) {
	ctx, actor := c.Request().Context(), actorOf(c)
	t, err := con.ta.Tenant(ctx, actor, id)
	if err != nil {
		return tenantView{}, err
	}
	keys, err := con.ta.Keys(ctx, actor, id)
	return tenantView{Tenant: t, Keys: keys}, err
}

func (con *console) tenantPage(c echo.Context) error {
	v, err := con.tenantView(c, c.Param("id"))
	if err != nil {
		return con.fail(c, "/admin/tenants", err)
	}
	return con.page(c, "tenant", v)
}

// auditView is the Audit page.
type auditView struct {
	Query tenants.AuditQuery
	Page  tenants.AuditPage
}

func (con *console) auditPage(c echo.Context) error {
	q := tenants.AuditQuery{Actor: c.QueryParam("actor"), Object: c.QueryParam("object"), Before: c.QueryParam("before"), Limit: 50}
	page, err := con.ta.Audit(c.Request().Context(), actorOf(c), q)
	if err != nil {
		return con.fail(c, "/admin/audit", err)
	}
	return con.page(c, "audit", auditView{Query: q, Page: page})
}

// workerForm reads the declaration of the add and change forms.
func workerForm(c echo.Context) (routing.WorkerSpec, error) {
	spec := routing.WorkerSpec{ID: strings.TrimSpace(c.FormValue("id")), URL: strings.TrimSpace(c.FormValue("url"))}
	for _, m := range strings.Split(c.FormValue("models"), ",") {
		if m = strings.TrimSpace(m); m != "" {
			spec.Models = append(spec.Models, m)
		}
	}
	n, err := formInt(c, "max_concurrency")
	spec.MaxConcurrency = int(n)
	return spec, err
}

func (con *console) addWorker(c echo.Context) (string, string, error) {
	spec, err := workerForm(c)
	if err != nil {
		return "", "", err
	}
	if err := con.p.addWorkerAction(c, spec); err != nil {
		return "", "", err
	}
	return "Worker " + spec.ID + " added.", "", nil
}

// changeWorker replaces the declaration of a worker added through the admin API or console.
func (con *console) changeWorker(c echo.Context) (string, string, error) {
	spec, err := workerForm(c)
	if err != nil {
		return "", "", err
	}
	if err := con.p.updateWorkerAction(c, spec); err != nil {
		return "", "", err
	}
	return "Worker " + spec.ID + " changed; requests in flight finish on its old declaration.", "", nil
}

func (con *console) drain(c echo.Context) (string, string, error) {
	id := c.Param("id")
	return "Worker " + id + " drains; its pins are released and each session is pinned elsewhere at its next request.", "", con.p.drainWorkerAction(c, id)
}

func (con *console) undrain(c echo.Context) (string, string, error) {
	id := c.Param("id")
	return "Worker " + id + " takes requests again.", "", con.p.undrainWorkerAction(c, id)
}

func (con *console) remove(c echo.Context) (string, string, error) {
	id := c.Param("id")
	return "Worker " + id + " removed.", "", con.p.removeWorkerAction(c, id)
}

func (con *console) pin(c echo.Context) (string, string, error) {
	ttl, err := formInt(c, "ttl_seconds")
	if err != nil {
		return "", "", err
	}
	r := pinRequest{Model: c.FormValue("model"), Tenant: strings.TrimSpace(c.FormValue("tenant")),
		Key: strings.TrimSpace(c.FormValue("key")), Worker: c.FormValue("worker"), TTLSeconds: ttl}
	if err := con.p.pinAction(c, r); err != nil {
		return "", "", err
	}
	return fmt.Sprintf("Session %s of %s pinned to %s.", r.Key, r.Tenant, r.Worker), "", nil
}

func (con *console) unpin(c echo.Context) (string, string, error) {
	key := c.FormValue("key")
	return "Session " + key + " unpinned.", "", con.p.unpinAction(c, c.FormValue("model"), c.FormValue("tenant"), key)
}

func (con *console) movePins(c echo.Context) (string, string, error) {
	ttl, err := formInt(c, "ttl_seconds")
	if err != nil {
		return "", "", err
	}
	r := movePinsRequest{From: c.FormValue("from"), To: c.FormValue("to"), TTLSeconds: ttl}
	n, err := con.p.movePinsAction(c, r)
	return fmt.Sprintf("%d pins moved from %s to %s.", n, r.From, r.To), "", err
}

func (con *console) createTenant(c echo.Context) (string, string, error) {
	in := tenants.TenantInput{ID: strings.TrimSpace(c.FormValue("id")), Name: strings.TrimSpace(c.FormValue("name")), Tier: c.FormValue("tier")}
	t, err := con.ta.CreateTenant(c.Request().Context(), actorOf(c), in)
	if err != nil {
		return "", "", err
	}
	return "Tenant " + t.ID + " created.", "/admin/tenants/" + t.ID, nil
}

func (con *console) suspend(c echo.Context) (string, string, error) {
	id := c.Param("id")
	return "Tenant " + id + " suspended.", "", con.ta.SuspendTenant(c.Request().Context(), actorOf(c), id)
}

func (con *console) resume(c echo.Context) (string, string, error) {
	id := c.Param("id")
	return "Tenant " + id + " resumed.", "", con.ta.ResumeTenant(c.Request().Context(), actorOf(c), id)
}

func (con *console) revokeKey(c echo.Context) (string, string, error) {
	id, key := c.Param("id"), c.Param("key")
	return "Key " + key + " revoked.", "/admin/tenants/" + id, revokeKeyOnce(c.Request().Context(), con.ta, actorOf(c), id, key)
}

// createKey answers with the tenant's page showing the new secret, once: it is in no URL,
// no cookie and no cache.
func (con *console) createKey(c echo.Context) error {
	id := c.Param("id")
	back := "/admin/tenants/" + id
	in := tenants.KeyInput{Name: strings.TrimSpace(c.FormValue("name"))}
	if d := c.FormValue("expires"); d != "" {
		t, err := time.Parse(time.DateOnly, d)
		if err != nil {
			return con.fail(c, back, gateway.BadRequest("expires", "expires must be a date YYYY-MM-DD"))
		}
		in.Expires = t
	}
	key, secret, err := con.ta.CreateKey(c.Request().Context(), actorOf(c), id, in)
	if err != nil {
		return con.fail(c, back, err)
	}
	v, err := con.tenantView(c, id)
	if err != nil {
		return con.fail(c, back, err)
	}
	v.Secret = secret
	pd := con.pageData(c, "tenants", v)
	pd.Flash = "Key " + key.ID + " created."
	return con.render(c, http.StatusCreated, "tenant", "", pd)
}

// formInt reads an optional non-negative integer field; empty is 0.
func formInt(c echo.Context, field string) (int64, error) {
	v := strings.TrimSpace(c.FormValue(field))
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, gateway.BadRequest(field, "%s must be a non-negative integer", field)
	}
	return n, nil
}
