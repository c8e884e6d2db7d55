package tenants

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const testAdminToken = "adm-0123456789abcdef0123456789"

func newAdminFixture(t *testing.T, cfg AdminConfig) (*Admin, *directoryFixture) {
	t.Helper()
	return newAdminFixtureOn(t, openSQLite(t), cfg)
}

func newAdminFixtureOn(t *testing.T, s *Store, cfg AdminConfig) (*Admin, *directoryFixture) {
	t.Helper()
	f := newDirectoryFixture(t, s, DirectoryOptions{})
	a, err := NewAdmin(cfg, f.store, f.dir, f.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	return a, f
}

func TestAdminAuthenticateActor(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []AdminConfig{{Token: testAdminToken}, {TokenSHA256: HashKey(testAdminToken)}} {
		a, f := newAdminFixture(t, cfg)
		got, err := a.AuthenticateActor(ctx, testAdminToken)
		if err != nil || !got.Admin || got.Name != "admin" {
			t.Errorf("admin token: got %+v, %v; want the admin", got, err)
		}
		got, err = a.AuthenticateActor(ctx, f.key)
		if err != nil || got.Admin || got.TenantID != "acme" || got.Name != "tenant:acme/"+f.keyID {
			t.Errorf("tenant key: got %+v, %v; want tenant acme", got, err)
		}
		for _, bad := range []string{"", testAdminToken + "x", HashKey(testAdminToken), f.revoked} {
			_, err := a.AuthenticateActor(ctx, bad)
			if !errors.Is(err, ErrUnauthenticated) {
				t.Errorf("credential %q: got %v, want ErrUnauthenticated", bad, err)
			}
			if bad != "" && strings.Contains(err.Error(), bad) {
				t.Errorf("error %q contains the credential", err)
			}
		}
	}
	a, _ := newAdminFixture(t, AdminConfig{})
	if _, err := a.AuthenticateActor(ctx, testAdminToken); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("no admin token configured: got %v, want ErrUnauthenticated", err)
	}
}

func TestAdminTenantLifecycle(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) { testAdminTenantLifecycle(t, d.open(t)) })
	}
}

func testAdminTenantLifecycle(t *testing.T, s *Store) {
	a, f := newAdminFixtureOn(t, s, AdminConfig{Token: testAdminToken})
	ctx := context.Background()
	admin := Actor{Name: "admin", Admin: true}
	tn, err := a.CreateTenant(ctx, admin, TenantInput{ID: "initech", Name: "Initech"})
	if err != nil {
		t.Fatal(err)
	}
	if tn.Tier != f.cfg.DefaultTier || tn.Status != StatusActive {
		t.Errorf("got %+v, want the default tier %q, active", tn, f.cfg.DefaultTier)
	}
	k, key, err := a.CreateKey(ctx, admin, "initech", KeyInput{Name: "prod"})
	if err != nil {
		t.Fatal(err)
	}
	if p, err := f.dir.Authenticate(ctx, key); err != nil || p.TenantID != "initech" || p.KeyID != k.ID {
		t.Fatalf("new key right after creation: got %+v, %v; want tenant initech", p, err)
	}
	keys, err := a.Keys(ctx, admin, "initech")
	if err != nil || len(keys) != 1 {
		t.Fatalf("got %v, %v; want one key", keys, err)
	}
	js, _ := json.Marshal(keys)
	if secret := key[len(keyPrefix)+keyIDLen+1:]; strings.Contains(string(js), secret) || strings.Contains(string(js), HashKey(secret)) {
		t.Errorf("key listing %s contains the secret or its hash", js)
	}
	tier := "enterprise"
	if got, err := a.UpdateTenant(ctx, admin, "initech", TenantUpdate{Tier: &tier}); err != nil || got.Tier != "enterprise" {
		t.Fatalf("update: got %+v, %v", got, err)
	}
	if p, _ := f.dir.Authenticate(ctx, key); p.Tier != "enterprise" {
		t.Errorf("after tier change: got tier %q, want enterprise at once", p.Tier)
	}
	if err := a.SuspendTenant(ctx, admin, "initech"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dir.Authenticate(ctx, key); !errors.Is(err, errSuspendedTenant) {
		t.Errorf("suspended: got %v, want %v", err, errSuspendedTenant)
	}
	if err := a.ResumeTenant(ctx, admin, "initech"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dir.Authenticate(ctx, key); err != nil {
		t.Errorf("resumed: got %v, want accepted", err)
	}
	if err := a.RevokeKey(ctx, admin, "initech", k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.dir.Authenticate(ctx, key); !errors.Is(err, errRevokedKey) {
		t.Errorf("revoked: got %v, want %v", err, errRevokedKey)
	}
	if err := a.DeleteTenant(ctx, admin, "initech"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Tenant(ctx, admin, "initech"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deleted: got %v, want ErrNotFound", err)
	}
	page, err := a.Audit(ctx, admin, AuditQuery{Object: "tenant:initech"})
	if err != nil {
		t.Fatal(err)
	}
	var actions []string
	for _, e := range page.Entries {
		if e.Actor != "admin" {
			t.Errorf("entry %+v: got actor %q, want admin", e, e.Actor)
		}
		actions = append(actions, e.Action)
	}
	if got, want := strings.Join(actions, ","), "tenant.delete,tenant.resume,tenant.suspend,tenant.update,tenant.create"; got != want {
		t.Errorf("audit: got %s, want %s", got, want)
	}
	all, err := a.Tenants(ctx, admin)
	if err != nil || len(all) != 3 || all[0].ID != "cfg" || !all[0].ReadOnly {
		t.Errorf("tenants: got %+v, %v; want cfg (read-only), acme, sus", all, err)
	}
}

// TestAdminTenantActorIsConfined: a tenant credential reaches only its own tenant and keys.
func TestAdminTenantActorIsConfined(t *testing.T) {
	a, f := newAdminFixture(t, AdminConfig{Token: testAdminToken})
	ctx := context.Background()
	acme, err := a.AuthenticateActor(ctx, f.key)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateTenant(ctx, Actor{Name: "admin", Admin: true}, TenantInput{ID: "globex"}); err != nil {
		t.Fatal(err)
	}
	gk, _, err := a.CreateKey(ctx, Actor{Name: "admin", Admin: true}, "globex", KeyInput{Name: "g"})
	if err != nil {
		t.Fatal(err)
	}
	tier := "enterprise"
	name := "mine now"
	refusals := []struct {
		name string
		do   func() error
		want error
	}{
		{"read another tenant", func() error { _, err := a.Tenant(ctx, acme, "globex"); return err }, ErrNotFound},
		{"list another tenant's keys", func() error { _, err := a.Keys(ctx, acme, "globex"); return err }, ErrNotFound},
		{"create a key for another tenant", func() error { _, _, err := a.CreateKey(ctx, acme, "globex", KeyInput{Name: "x"}); return err }, ErrNotFound},
		{"revoke another tenant's key", func() error { return a.RevokeKey(ctx, acme, "globex", gk.ID) }, ErrNotFound},
		{"revoke another tenant's key through its own tenant", func() error { return a.RevokeKey(ctx, acme, "acme", gk.ID) }, ErrNotFound},
		{"raise its own tier", func() error { _, err := a.UpdateTenant(ctx, acme, "acme", TenantUpdate{Tier: &tier}); return err }, ErrForbidden},
		{"rename another tenant", func() error { _, err := a.UpdateTenant(ctx, acme, "globex", TenantUpdate{Name: &name}); return err }, ErrForbidden},
		{"create a tenant", func() error { _, err := a.CreateTenant(ctx, acme, TenantInput{ID: "x"}); return err }, ErrForbidden},
		{"suspend another tenant", func() error { return a.SuspendTenant(ctx, acme, "globex") }, ErrForbidden},
		{"delete another tenant", func() error { return a.DeleteTenant(ctx, acme, "globex") }, ErrForbidden},
		{"read another tenant's audit log", func() error { _, err := a.Audit(ctx, acme, AuditQuery{TenantID: "globex"}); return err }, ErrNotFound},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	t.Run("own objects", func(t *testing.T) {
		if list, err := a.Tenants(ctx, acme); err != nil || len(list) != 1 || list[0].ID != "acme" {
			t.Errorf("tenants: got %+v, %v; want only acme", list, err)
		}
		k, _, err := a.CreateKey(ctx, acme, "acme", KeyInput{Name: "mine"})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.RevokeKey(ctx, acme, "acme", k.ID); err != nil {
			t.Errorf("revoke own key: %v", err)
		}
		page, _ := a.Audit(ctx, Actor{Admin: true}, AuditQuery{Object: "key:" + k.ID})
		if len(page.Entries) != 2 || page.Entries[0].Actor != acme.Name || page.Entries[0].TenantID != "acme" {
			t.Errorf("audit: got %+v, want two entries by %q about acme", page.Entries, acme.Name)
		}
		own, err := a.Audit(ctx, acme, AuditQuery{})
		if err != nil || len(own.Entries) == 0 {
			t.Fatalf("own audit log: got %+v, %v; want entries", own, err)
		}
		for _, e := range own.Entries {
			if e.TenantID != "acme" {
				t.Errorf("tenant acme's audit log shows %+v", e)
			}
		}
	})
}

func TestAdminRefusesBadInput(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) { testAdminRefusesBadInput(t, d.open(t)) })
	}
}

func testAdminRefusesBadInput(t *testing.T, s *Store) {
	a, f := newAdminFixtureOn(t, s, AdminConfig{Token: testAdminToken})
	ctx := context.Background()
	admin := Actor{Name: "admin", Admin: true}
	badTier := "platinum"
	refusals := []struct {
		name string
		do   func() error
		want error
	}{
		{"id with a quote", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "a'b"}); return err }, ErrInvalid},
		{"id too long", func() error {
			_, err := a.CreateTenant(ctx, admin, TenantInput{ID: strings.Repeat("a", 65)})
			return err
		}, ErrInvalid},
		{"unknown tier", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "x", Tier: "platinum"}); return err }, ErrInvalid},
		{"name with NUL", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "x", Name: "a\x00b"}); return err }, ErrInvalid},
		{"name not UTF-8", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "x", Name: "\xff"}); return err }, ErrInvalid},
		{"name too long", func() error {
			_, err := a.CreateTenant(ctx, admin, TenantInput{ID: "x", Name: strings.Repeat("n", 201)})
			return err
		}, ErrInvalid},
		{"existing id", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "acme"}); return err }, ErrConflict},
		{"config tenant id", func() error { _, err := a.CreateTenant(ctx, admin, TenantInput{ID: "cfg"}); return err }, ErrReadOnly},
		{"update config tenant", func() error { _, err := a.UpdateTenant(ctx, admin, "cfg", TenantUpdate{}); return err }, ErrReadOnly},
		{"suspend config tenant", func() error { return a.SuspendTenant(ctx, admin, "cfg") }, ErrReadOnly},
		{"key for config tenant", func() error { _, _, err := a.CreateKey(ctx, admin, "cfg", KeyInput{Name: "k"}); return err }, ErrReadOnly},
		{"update to unknown tier", func() error { _, err := a.UpdateTenant(ctx, admin, "acme", TenantUpdate{Tier: &badTier}); return err }, ErrInvalid},
		{"update missing tenant", func() error { _, err := a.UpdateTenant(ctx, admin, "nope", TenantUpdate{}); return err }, ErrNotFound},
		{"key without name", func() error { _, _, err := a.CreateKey(ctx, admin, "acme", KeyInput{}); return err }, ErrInvalid},
		{"key expiring in the past", func() error {
			_, _, err := a.CreateKey(ctx, admin, "acme", KeyInput{Name: "k", Expires: f.clock.Now().Add(-time.Second)})
			return err
		}, ErrInvalid},
		{"key for missing tenant", func() error { _, _, err := a.CreateKey(ctx, admin, "nope", KeyInput{Name: "k"}); return err }, ErrNotFound},
		{"revoke missing key", func() error { return a.RevokeKey(ctx, admin, "acme", "nope") }, ErrNotFound},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	t.Run("metacharacters round-trip", func(t *testing.T) {
		for i, m := range metacharacters {
			if strings.ContainsRune(m, 0) {
				continue
			}
			id := "meta" + string(rune('a'+i))
			if _, err := a.CreateTenant(ctx, admin, TenantInput{ID: id, Name: m}); err != nil {
				t.Fatalf("%q: %v", m, err)
			}
			k, _, err := a.CreateKey(ctx, admin, id, KeyInput{Name: m})
			if err != nil {
				t.Fatalf("%q: %v", m, err)
			}
			got, _ := a.Tenant(ctx, admin, id)
			keys, _ := a.Keys(ctx, admin, id)
			if got.Name != m || len(keys) != 1 || keys[0].Name != m || keys[0].ID != k.ID {
				t.Errorf("got %q and %+v, want %q", got.Name, keys, m)
			}
		}
	})
}

func TestAdminConfigValidate(t *testing.T) {
	tests := []struct {
		cfg  AdminConfig
		want string
	}{
		{AdminConfig{TokenSHA256: "abc"}, "admin.token_sha256: must be 64 hex characters"},
		{AdminConfig{Token: "short"}, "admin.token: must be at least 24 characters"},
		{AdminConfig{Token: testAdminToken, TokenSHA256: HashKey("x")}, "admin.token: set either"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			c := testConfig(t)
			c.Admin = tt.cfg
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestAdminLoweredCredentialsMintNothingStronger is issue 10's item 2: a JWT whose tier claim
// lowered the tenant, or a key about to expire, could create a never-expiring key at the
// tenant's full tier and revoke the tenant's other keys. Keys are minted only within the
// creator's tier and expiry now, and key management is a permission of its own.
func TestAdminLoweredCredentialsMintNothingStronger(t *testing.T) {
	f, _ := jwtFixture(t)
	a, err := NewAdmin(AdminConfig{}, f.store, f.dir, f.clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	admin := Actor{Name: "admin", Admin: true}
	now := f.clock.Now()
	exp := now.Add(time.Hour).Truncate(time.Second)
	token := func(claims jwt.MapClaims) string {
		base := jwt.MapClaims{"sub": "acme", "iss": "https://idp.example", "aud": "usher", "exp": exp.Unix()}
		for n, v := range claims {
			base[n] = v
		}
		return sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", base)
	}
	actorOf := func(credential string) Actor {
		t.Helper()
		act, err := a.AuthenticateActor(ctx, credential)
		if err != nil {
			t.Fatal(err)
		}
		return act
	}
	adminKey := func(in KeyInput) (APIKey, string) {
		t.Helper()
		k, s, err := a.CreateKey(ctx, admin, "acme", in)
		if err != nil {
			t.Fatal(err)
		}
		return k, s
	}
	_, short := adminKey(KeyInput{Name: "short", Expires: now.Add(2 * time.Minute), ManageKeys: true})
	_, capped := adminKey(KeyInput{Name: "capped", Tier: "free", ManageKeys: true})
	plainKey, plain := adminKey(KeyInput{Name: "plain"})

	lowered := actorOf(token(jwt.MapClaims{"tier": "free", "scope": "read " + ScopeManageKeys}))
	loweredNoScope := actorOf(token(jwt.MapClaims{"tier": "free"}))
	refusals := []struct {
		name string
		do   func() error
	}{
		{"lowered JWT asks for the full tier", func() error {
			_, _, err := a.CreateKey(ctx, lowered, "acme", KeyInput{Name: "x", Tier: "pro"})
			return err
		}},
		{"lowered JWT asks to outlive it", func() error {
			_, _, err := a.CreateKey(ctx, lowered, "acme", KeyInput{Name: "x", Expires: exp.Add(time.Second)})
			return err
		}},
		{"lowered JWT revokes a full-tier key", func() error { return a.RevokeKey(ctx, lowered, "acme", f.keyID) }},
		{"JWT without the scope creates a key", func() error {
			_, _, err := a.CreateKey(ctx, loweredNoScope, "acme", KeyInput{Name: "x", Tier: "free"})
			return err
		}},
		{"JWT without the scope revokes a key", func() error { return a.RevokeKey(ctx, loweredNoScope, "acme", plainKey.ID) }},
		{"2-minute key asks for an hour", func() error {
			_, _, err := a.CreateKey(ctx, actorOf(short), "acme", KeyInput{Name: "x", Expires: now.Add(time.Hour)})
			return err
		}},
		{"2-minute key revokes a key that never expires", func() error { return a.RevokeKey(ctx, actorOf(short), "acme", plainKey.ID) }},
		{"free-capped key asks for pro", func() error {
			_, _, err := a.CreateKey(ctx, actorOf(capped), "acme", KeyInput{Name: "x", Tier: "pro"})
			return err
		}},
		{"free-capped key revokes a pro key", func() error { return a.RevokeKey(ctx, actorOf(capped), "acme", f.keyID) }},
		{"key without manage_keys creates a key", func() error {
			_, _, err := a.CreateKey(ctx, actorOf(plain), "acme", KeyInput{Name: "x"})
			return err
		}},
		{"key without manage_keys revokes another", func() error { return a.RevokeKey(ctx, actorOf(plain), "acme", f.keyID) }},
	}
	for _, tt := range refusals {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(); !errors.Is(err, ErrForbidden) {
				t.Errorf("got %v, want ErrForbidden", err)
			}
		})
	}

	// What they may do: keys within their own scope, which default to it.
	minted := []struct {
		name     string
		creator  Actor
		wantTier string
		wantExp  time.Time
	}{
		{"lowered JWT", lowered, "free", exp},
		{"2-minute key", actorOf(short), "pro", now.Add(2 * time.Minute)},
		{"free-capped key", actorOf(capped), "free", time.Time{}},
	}
	for _, m := range minted {
		t.Run(m.name+" mints within its scope", func(t *testing.T) {
			_, key, err := a.CreateKey(ctx, m.creator, "acme", KeyInput{Name: "child"})
			if err != nil {
				t.Fatal(err)
			}
			p, err := f.dir.Authenticate(ctx, key)
			if err != nil || p.Tier != m.wantTier || !p.Expires.Equal(m.wantExp) || p.ManageKeys {
				t.Errorf("minted key: got %+v, %v; want tier %s, expires %v, no manage_keys", p, err, m.wantTier, m.wantExp)
			}
		})
	}
	if err := a.RevokeKey(ctx, actorOf(plain), "acme", plainKey.ID); err != nil {
		t.Errorf("a key revoking itself: got %v, want allowed", err)
	}
}

// TestFreeTenantCannotMintOrUseABatchKey is issue 26's item 2 against the example config: a free
// tenant minted a key at the batch tier, listed after free but allowing every model, 10x the
// requests, 8x the prompt cap and no budget, and used it. Neither the tenant nor the admin mints
// it now, one minted before is refused, and a JWT tier claim cannot name it.
func TestFreeTenantCannotMintOrUseABatchKey(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	cfg := exampleTiers(t)
	jc := JWTConfig{Algorithms: []string{"HS256"}, HS256Secret: testHS256Secret, Issuer: "https://idp.example", Audience: "usher"}
	jc.setDefaults()
	v, err := NewJWTVerifier(jc, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	s := openSQLite(t)
	s.now = clock.Now
	for _, tn := range []Tenant{{ID: "frugal", Name: "Frugal", Tier: "free"}, {ID: "acme", Name: "Acme", Tier: "pro"}} {
		if _, err := s.CreateTenant(ctx, "test", tn); err != nil {
			t.Fatal(err)
		}
	}
	_, manager, err := s.CreateKey(ctx, "test", "frugal", NewKey{Name: "ci", ManageKeys: true})
	if err != nil {
		t.Fatal(err)
	}
	// A batch key as one was minted before tiers were compared by what they grant.
	_, old, err := s.CreateKey(ctx, "test", "frugal", NewKey{Name: "old", Tier: "batch"})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := NewDirectory(ctx, cfg, s, DirectoryOptions{JWT: v, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAdmin(AdminConfig{}, s, dir, clock.Now)
	if err != nil {
		t.Fatal(err)
	}
	tenant, err := a.AuthenticateActor(ctx, manager)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.CreateKey(ctx, tenant, "frugal", KeyInput{Name: "escape", Tier: "batch"}); !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrForbidden) {
		t.Errorf("free tenant mints a batch key: got %v, want refused", err)
	}
	if _, _, err := a.CreateKey(ctx, Actor{Name: "admin", Admin: true}, "frugal", KeyInput{Name: "escape", Tier: "batch"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("admin mints a batch key for a free tenant: got %v, want ErrInvalid", err)
	}
	if p, err := dir.Authenticate(ctx, old); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a batch key of a free tenant: got %+v, %v; want refused", p, err)
	}
	token := func(sub, tier string) string {
		return sign(t, jwt.SigningMethodHS256, []byte(testHS256Secret), "", jwt.MapClaims{
			"sub": sub, "iss": "https://idp.example", "aud": "usher", "exp": clock.Now().Add(time.Hour).Unix(), "tier": tier})
	}
	if p, err := dir.Authenticate(ctx, token("frugal", "batch")); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a free tenant's JWT claiming batch: got %+v, %v; want refused", p, err)
	}
	if p, err := dir.Authenticate(ctx, token("acme", "batch")); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("a pro tenant's JWT claiming batch (more tokens per minute, a longer queue): got %+v, %v; want refused", p, err)
	}
	p, err := dir.Authenticate(ctx, token("acme", "free"))
	if err != nil || p.Tier != "free" || p.TenantTier == nil || p.TenantTier.Name != "pro" {
		t.Errorf("a pro tenant's JWT claiming free: got %+v, %v; want free within pro", p, err)
	}
}
