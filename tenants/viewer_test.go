package tenants

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

const testViewerToken = "view-0123456789abcdef012345"

func TestAdminViewerReadsAndChangesNothing(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []AdminConfig{
		{Token: testAdminToken, ViewerToken: testViewerToken},
		{TokenSHA256: HashKey(testAdminToken), ViewerTokenSHA256: HashKey(testViewerToken)},
	} {
		a, f := newAdminFixture(t, cfg)
		viewer, err := a.AuthenticateActor(ctx, testViewerToken)
		if err != nil || !viewer.Viewer || viewer.Admin || viewer.Name != "viewer" || !viewer.ReadOnly() {
			t.Fatalf("viewer token: got %+v, %v; want the read-only viewer", viewer, err)
		}
		if admin, _ := a.AuthenticateActor(ctx, testAdminToken); admin.ReadOnly() {
			t.Fatalf("admin token: got %+v, want a read-write actor", admin)
		}
		reads := []struct {
			name string
			call func() error
		}{
			{"tenants", func() error {
				list, err := a.Tenants(ctx, viewer)
				if err == nil && len(list) < 2 {
					return errors.New("the viewer sees only some tenants")
				}
				return err
			}},
			{"tenant", func() error { _, err := a.Tenant(ctx, viewer, "acme"); return err }},
			{"keys", func() error { _, err := a.Keys(ctx, viewer, "acme"); return err }},
			{"audit", func() error { _, err := a.Audit(ctx, viewer, AuditQuery{}); return err }},
		}
		for _, r := range reads {
			if err := r.call(); err != nil {
				t.Errorf("viewer %s: got %v, want it allowed", r.name, err)
			}
		}
		name := "x"
		changes := []struct {
			name string
			call func() error
		}{
			{"create tenant", func() error { _, err := a.CreateTenant(ctx, viewer, TenantInput{ID: "new"}); return err }},
			{"update tenant", func() error { _, err := a.UpdateTenant(ctx, viewer, "acme", TenantUpdate{Name: &name}); return err }},
			{"suspend", func() error { return a.SuspendTenant(ctx, viewer, "acme") }},
			{"resume", func() error { return a.ResumeTenant(ctx, viewer, "sus") }},
			{"delete", func() error { return a.DeleteTenant(ctx, viewer, "acme") }},
			{"create key", func() error { _, _, err := a.CreateKey(ctx, viewer, "acme", KeyInput{Name: "k"}); return err }},
			{"revoke key", func() error { return a.RevokeKey(ctx, viewer, "acme", f.keyID) }},
		}
		for _, c := range changes {
			if err := c.call(); !errors.Is(err, ErrForbidden) {
				t.Errorf("viewer %s: got %v, want ErrForbidden", c.name, err)
			}
		}
		if _, err := f.dir.Authenticate(ctx, f.key); err != nil {
			t.Errorf("the viewer's refused revoke changed the key: %v", err)
		}
	}
}

func TestAdminSessionKey(t *testing.T) {
	none, _ := newAdminFixture(t, AdminConfig{})
	if k := none.SessionKey(); k != nil {
		t.Errorf("no tokens: got key %x, want nil", k)
	}
	clear, _ := newAdminFixture(t, AdminConfig{Token: testAdminToken, ViewerToken: testViewerToken})
	hashed, _ := newAdminFixture(t, AdminConfig{TokenSHA256: HashKey(testAdminToken), ViewerTokenSHA256: HashKey(testViewerToken)})
	other, _ := newAdminFixture(t, AdminConfig{Token: testAdminToken + "-rotated"})
	if !bytes.Equal(clear.SessionKey(), hashed.SessionKey()) || len(clear.SessionKey()) != 32 {
		t.Errorf("same tokens, clear and hashed: got %x and %x, want the same 32 bytes", clear.SessionKey(), hashed.SessionKey())
	}
	if bytes.Equal(clear.SessionKey(), other.SessionKey()) {
		t.Error("a rotated admin token keeps the session key")
	}
}

func TestAdminConfigViewerValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  AdminConfig
		want string
	}{
		{"short", AdminConfig{ViewerToken: "short"}, "admin.viewer_token: must be at least 24 characters"},
		{"bad hash", AdminConfig{ViewerTokenSHA256: "abc"}, "admin.viewer_token_sha256: must be 64 hex characters"},
		{"both", AdminConfig{ViewerToken: testViewerToken, ViewerTokenSHA256: HashKey(testViewerToken)}, "admin.viewer_token: set either"},
		{"same as admin", AdminConfig{Token: testAdminToken, ViewerToken: testAdminToken}, "admin.viewer_token: must differ from the admin token"},
		{"same hash as admin", AdminConfig{TokenSHA256: HashKey(testAdminToken), ViewerTokenSHA256: strings.ToUpper(HashKey(testAdminToken))}, "admin.viewer_token: must differ"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			errs := tt.cfg.validate()
			var got []string
			for _, e := range errs {
				got = append(got, e.Error())
			}
			if !strings.Contains(strings.Join(got, "; "), tt.want) {
				t.Errorf("got %q, want an error containing %q", got, tt.want)
			}
		})
	}
	if errs := (AdminConfig{Token: testAdminToken, ViewerToken: testViewerToken}).validate(); len(errs) != 0 {
		t.Errorf("good config: got %v, want no error", errs)
	}
}
