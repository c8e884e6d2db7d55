package adminui

import (
	"encoding/csv"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
)

// usageAPI answers GET /admin/api/v1/usage: the usage ledger's rows, filtered by the query
// parameters tenant, key, model, class, from and to (RFC 3339 or a date, UTC) and limit, as JSON
// or, with format=csv or Accept: text/csv, as CSV. A tenant's credential reads only its own.
func (h tenantAdmin) usage(c echo.Context) error {
	q, err := usageQuery(c)
	if err != nil {
		return adminError(c, err)
	}
	rows, err := h.ta.Usage(c.Request().Context(), actorOf(c), q)
	if err != nil {
		return adminError(c, err)
	}
	if c.QueryParam("format") == "csv" || c.QueryParam("format") == "" && strings.Contains(c.Request().Header.Get("Accept"), "text/csv") {
		return writeUsageCSV(c, rows)
	}
	var total tenants.UsageCounts
	for _, r := range rows {
		total.Add(r.UsageCounts)
	}
	if rows == nil {
		rows = []tenants.UsageRow{}
	}
	// truncated: the filter matched more rows than one answer holds; the oldest are left out.
	return c.JSON(http.StatusOK, map[string]any{"usage": rows, "total": total, "truncated": len(rows) == tenants.MaxUsageRows})
}

// attainment answers GET /admin/api/v1/attainment: per tenant and class, how the calls fared
// against their tier's latency objectives over a window (from, to: RFC 3339 or a date, UTC;
// default the last 24 hours), the worst first; filtered by tenant, tier and model. A tenant's
// credential reads only its own.
func (h tenantAdmin) attainment(c echo.Context) error {
	u, err := usageQuery(c)
	if err != nil {
		return adminError(c, err)
	}
	q := tenants.AttainmentQuery{Tenant: u.Tenant, Tier: c.QueryParam("tier"), Model: u.Model, From: u.From, To: u.To}
	if q.To.IsZero() {
		q.To = time.Now()
	}
	if q.From.IsZero() {
		q.From = q.To.Add(-24 * time.Hour)
	}
	rows, err := h.ta.Attainment(c.Request().Context(), actorOf(c), q)
	if err != nil {
		return adminError(c, err)
	}
	if rows == nil {
		rows = []tenants.Attainment{}
	}
	return c.JSON(http.StatusOK, map[string]any{"attainment": rows, "from": q.From.UTC(), "to": q.To.UTC()})
}

// usageQuery reads the filter of a usage request.
func usageQuery(c echo.Context) (tenants.UsageQuery, error) {
	q := tenants.UsageQuery{Tenant: c.QueryParam("tenant"), Key: c.QueryParam("key"), Model: c.QueryParam("model"), Class: c.QueryParam("class")}
	for _, f := range []struct {
		name string
		to   *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		v := c.QueryParam(f.name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			t, err = time.Parse(time.DateOnly, v)
		}
		if err != nil {
			return q, gateway.BadRequest(f.name, "%s must be an RFC 3339 time or a date (2006-01-02)", f.name)
		}
		*f.to = t
	}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return q, gateway.BadRequest("limit", "limit must be a positive integer")
		}
		q.Limit = n
	}
	if f := c.QueryParam("format"); f != "" && f != "csv" && f != "json" {
		return q, gateway.BadRequest("format", "format must be json or csv")
	}
	return q, nil
}

var usageCSVHeader = []string{"period", "start", "tenant", "key", "model", "class", "requests", "prompt_tokens",
	"cached_tokens", "completion_tokens", "estimated", "refused_limit", "refused_budget", "queue_full", "deadline", "worker_errors",
	"ttft_met", "ttft_missed", "tpot_met", "tpot_missed", "objectives_met", "objectives_missed"}

func writeUsageCSV(c echo.Context, rows []tenants.UsageRow) error {
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	h.Set(echo.HeaderContentDisposition, `attachment; filename="usage.csv"`)
	c.Response().WriteHeader(http.StatusOK)
	w := csv.NewWriter(c.Response())
	_ = w.Write(usageCSVHeader)
	for _, r := range rows {
		rec := []string{r.Period, r.Start.Format(time.RFC3339), csvSafe(r.Tenant), csvSafe(r.Key), csvSafe(r.Model), r.Class}
		for _, n := range []int64{r.Requests, r.PromptTokens, r.CachedTokens, r.CompletionTokens, r.Estimated,
			r.RefusedLimit, r.RefusedBudget, r.QueueFull, r.Deadline, r.WorkerErrors,
			r.TTFTMet, r.TTFTMissed, r.TPOTMet, r.TPOTMissed, r.ObjectivesMet, r.ObjectivesMissed} {
			rec = append(rec, strconv.FormatInt(n, 10))
		}
		_ = w.Write(rec)
	}
	w.Flush()
	return w.Error()
}

// csvSafe keeps a spreadsheet from reading a name as a formula (CSV injection): a leading
// =, +, - or @ gets a quote in front.
func csvSafe(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// Budgets set through the admin API: PUT, GET and DELETE /tenants/{id}/budget and
// /tenants/{id}/keys/{key}/budget. The body of PUT is {"tokens_per_day", "tokens_per_month",
// "requests_per_day", "requests_per_month"}; 0 means no cap.

func (h tenantAdmin) setBudget(c echo.Context) error {
	var o tenants.BudgetOverride
	if err := decodeAdminBody(c, &o); err != nil {
		return adminError(c, err)
	}
	o.TenantID, o.KeyID = c.Param("id"), c.Param("key")
	if err := h.ta.SetBudget(c.Request().Context(), actorOf(c), o); err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, o)
}

func (h tenantAdmin) getBudget(c echo.Context) error {
	o, err := h.ta.Budget(c.Request().Context(), actorOf(c), c.Param("id"), c.Param("key"))
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, o)
}

func (h tenantAdmin) deleteBudget(c echo.Context) error {
	if err := h.ta.DeleteBudget(c.Request().Context(), actorOf(c), c.Param("id"), c.Param("key")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}
