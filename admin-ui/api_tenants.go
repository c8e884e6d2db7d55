package adminui

import (
	"context"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/tenants"
)

// registerTenantAdmin mounts tenants, keys, tiers, the audit log, the usage ledger, attainment
// and budgets
// on the admin group. The
// admin service decides what each actor may do (a tenant sees only itself and manages its own
// keys) and writes every change to the audit log; the handlers only translate HTTP.
func registerTenantAdmin(g *echo.Group, ta *tenants.Admin) {
	h := tenantAdmin{ta}
	g.GET("/tenants", h.list)
	g.POST("/tenants", h.create)
	g.GET("/tenants/:id", h.get)
	g.PATCH("/tenants/:id", h.update)
	g.DELETE("/tenants/:id", h.delete)
	g.POST("/tenants/:id/suspend", h.suspend)
	g.POST("/tenants/:id/resume", h.resume)
	g.GET("/tenants/:id/keys", h.keys)
	g.POST("/tenants/:id/keys", h.createKey)
	g.DELETE("/tenants/:id/keys/:key", h.revokeKey)
	g.GET("/tiers", h.tiers)
	g.GET("/audit", h.audit)
	g.GET("/usage", h.usage)
	g.GET("/attainment", h.attainment)
	for _, path := range []string{"/tenants/:id/budget", "/tenants/:id/keys/:key/budget"} {
		g.GET(path, h.getBudget)
		g.PUT(path, h.setBudget)
		g.DELETE(path, h.deleteBudget)
	}
}

type tenantAdmin struct{ ta *tenants.Admin }

func (h tenantAdmin) list(c echo.Context) error {
	list, err := h.ta.Tenants(c.Request().Context(), actorOf(c))
	if err != nil {
		return adminError(c, err)
	}
	list = searchTenants(list, c.QueryParam("q"))
	if list == nil {
		list = []tenants.Tenant{}
	}
	return c.JSON(http.StatusOK, map[string]any{"tenants": list})
}

func (h tenantAdmin) create(c echo.Context) error {
	var in tenants.TenantInput
	if err := decodeAdminBody(c, &in); err != nil {
		return adminError(c, err)
	}
	t, err := h.ta.CreateTenant(c.Request().Context(), actorOf(c), in)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusCreated, t)
}

func (h tenantAdmin) get(c echo.Context) error {
	t, err := h.ta.Tenant(c.Request().Context(), actorOf(c), c.Param("id"))
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, t)
}

func (h tenantAdmin) update(c echo.Context) error {
	var up tenants.TenantUpdate
	if err := decodeAdminBody(c, &up); err != nil {
		return adminError(c, err)
	}
	t, err := h.ta.UpdateTenant(c.Request().Context(), actorOf(c), c.Param("id"), up)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, t)
}

func (h tenantAdmin) delete(c echo.Context) error {
	if err := h.ta.DeleteTenant(c.Request().Context(), actorOf(c), c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

func (h tenantAdmin) suspend(c echo.Context) error {
	if err := h.ta.SuspendTenant(c.Request().Context(), actorOf(c), c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return h.get(c)
}

func (h tenantAdmin) resume(c echo.Context) error {
	if err := h.ta.ResumeTenant(c.Request().Context(), actorOf(c), c.Param("id")); err != nil {
		return adminError(c, err)
	}
	return h.get(c)
}

func (h tenantAdmin) keys(c echo.Context) error {
	keys, err := h.ta.Keys(c.Request().Context(), actorOf(c), c.Param("id"))
	if err != nil {
		return adminError(c, err)
	}
	if keys == nil {
		keys = []tenants.APIKey{}
	}
	return c.JSON(http.StatusOK, map[string]any{"keys": keys})
}

// createdKey is the answer to a key creation: the only time the secret is shown.
type createdKey struct {
	Key    tenants.APIKey `json:"key"`
	Secret string         `json:"secret"`
}

func (h tenantAdmin) createKey(c echo.Context) error {
	var in tenants.KeyInput
	if err := decodeAdminBody(c, &in); err != nil {
		return adminError(c, err)
	}
	key, secret, err := h.ta.CreateKey(c.Request().Context(), actorOf(c), c.Param("id"), in)
	if err != nil {
		return adminError(c, err)
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, createdKey{Key: key, Secret: secret})
}

func (h tenantAdmin) revokeKey(c echo.Context) error {
	if err := revokeKeyOnce(c.Request().Context(), h.ta, actorOf(c), c.Param("id"), c.Param("key")); err != nil {
		return adminError(c, err)
	}
	return c.NoContent(http.StatusNoContent)
}

// revokeKeyOnce revokes the key keyID of tenant tenantID, idempotently: a key already revoked
// is left alone, so a second revoke succeeds again without a second audit entry. Two revokes at
// the same instant may still both be recorded. Cost: one listing of the tenant's keys.
func revokeKeyOnce(ctx context.Context, ta *tenants.Admin, actor tenants.Actor, tenantID, keyID string) error {
	keys, err := ta.Keys(ctx, actor, tenantID)
	if err != nil {
		return err
	}
	for _, k := range keys {
		if k.ID == keyID && !k.Revoked.IsZero() {
			return nil
		}
	}
	return ta.RevokeKey(ctx, actor, tenantID, keyID)
}

func (h tenantAdmin) tiers(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]any{"tiers": tiersJSON(h.ta.Tiers(actorOf(c)))})
}

func (h tenantAdmin) audit(c echo.Context) error {
	q := tenants.AuditQuery{Actor: c.QueryParam("actor"), Object: c.QueryParam("object"), Before: c.QueryParam("before")}
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return adminError(c, gateway.BadRequest("limit", "limit must be a positive integer"))
		}
		q.Limit = n
	}
	page, err := h.ta.Audit(c.Request().Context(), actorOf(c), q)
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, page)
}
