package tenants

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// AdminConfig configures the bootstrap admin token and the read-only viewer token (`admin:` in
// the file). Set at most one of each pair; with no admin token, only tenants (acting on their own
// objects) and the viewer can use the admin service.
type AdminConfig struct {
	// TokenSHA256 is the hex SHA-256 of the admin token (`usher keyhash` prints it).
	TokenSHA256 string `yaml:"token_sha256"`
	// Token is the admin token itself, for example from the environment (USHER_ADMIN_TOKEN). It
	// is hashed by NewAdmin and not kept.
	Token string `yaml:"token"`
	// ViewerTokenSHA256 is the hex SHA-256 of the viewer token: it reads everything the admin
	// reads and changes nothing.
	ViewerTokenSHA256 string `yaml:"viewer_token_sha256"`
	// ViewerToken is the viewer token itself; hashed by NewAdmin and not kept.
	ViewerToken string `yaml:"viewer_token"`
}

func (c AdminConfig) validate() []error {
	errs := validateTokenPair("admin.token", c.Token, c.TokenSHA256)
	errs = append(errs, validateTokenPair("admin.viewer_token", c.ViewerToken, c.ViewerTokenSHA256)...)
	if c.Token != "" && c.Token == c.ViewerToken || c.TokenSHA256 != "" && strings.EqualFold(c.TokenSHA256, c.ViewerTokenSHA256) {
		errs = append(errs, errors.New("admin.viewer_token: must differ from the admin token"))
	}
	return errs
}

// validateTokenPair checks a token given either in clear (field) or as its hex SHA-256
// (field+"_sha256").
func validateTokenPair(field, token, hash string) []error {
	var errs []error
	if hash != "" && !isHexHash(hash) {
		errs = append(errs, fmt.Errorf("%s_sha256: must be 64 hex characters", field))
	}
	if hash != "" && token != "" {
		errs = append(errs, fmt.Errorf("%s: set either %s or %s_sha256, not both", field, field, field))
	}
	if token != "" && len(token) < 24 {
		errs = append(errs, fmt.Errorf("%s: must be at least 24 characters", field))
	}
	return errs
}

// tokenHash is the SHA-256 of a configured token, from the token or from its hex hash.
type tokenHash struct {
	sum [sha256.Size]byte
	set bool
}

func newTokenHash(field, token, hexHash string) (tokenHash, error) {
	switch {
	case token != "":
		return tokenHash{sum: sha256.Sum256([]byte(token)), set: true}, nil
	case hexHash != "":
		var h tokenHash
		if _, err := hex.Decode(h.sum[:], []byte(hexHash)); err != nil {
			return tokenHash{}, fmt.Errorf("%s_sha256: must be 64 hex characters", field)
		}
		h.set = true
		return h, nil
	}
	return tokenHash{}, nil
}

// matches compares in constant time.
func (t tokenHash) matches(h [sha256.Size]byte) bool {
	return t.set && subtle.ConstantTimeCompare(h[:], t.sum[:]) == 1
}

// Refusals of the admin service the gateway maps to HTTP: ErrForbidden 403, ErrInvalid 400,
// ErrNotFound 404, ErrConflict 409 (ErrReadOnly wraps it).
var (
	ErrForbidden = errors.New("forbidden")
	ErrInvalid   = errors.New("invalid input")
	ErrReadOnly  = fmt.Errorf("declared in the config file, read-only: %w", ErrConflict)
)

// Actor is who performs an admin action: the admin (token), the viewer (read-only token) or a
// tenant acting on its own objects with one of its credentials.
type Actor struct {
	// Name is what the audit log records: "admin", "viewer", or "tenant:<id>/<key id>".
	Name string
	// Admin actors may do everything; tenant actors only read their tenant and, when their
	// credential has the ManageKeys permission, manage its keys within the credential's scope.
	Admin bool
	// Viewer actors read everything the admin reads and change nothing (ErrForbidden).
	Viewer   bool
	TenantID string
	// Credential is, for a tenant actor, the principal of the credential it presented: its tier,
	// expiry and ManageKeys permission bound the keys it may create and revoke.
	Credential Principal
}

// ReadOnly reports whether the actor may not change anything.
func (a Actor) ReadOnly() bool { return a.Viewer && !a.Admin }

// Admin is the admin service: tenants CRUD, suspend and resume, keys, tiers and the audit log.
// Every change is written to the audit log with its actor, in the same transaction, and made
// effective on every replica through Directory.Changed. The gateway's HTTP handlers call it.
// Safe for concurrent use.
type Admin struct {
	store  *Store
	dir    *Directory
	token  tokenHash
	viewer tokenHash
	now    func() time.Time
}

// NewAdmin returns the admin service over store and dir; cfg must have passed validation. now
// nil means time.Now.
func NewAdmin(cfg AdminConfig, store *Store, dir *Directory, now func() time.Time) (*Admin, error) {
	if store == nil || dir == nil {
		return nil, errors.New("admin: needs a store and a directory")
	}
	a := &Admin{store: store, dir: dir, now: now}
	if a.now == nil {
		a.now = time.Now
	}
	var err error
	if a.token, err = newTokenHash("admin.token", cfg.Token, cfg.TokenSHA256); err != nil {
		return nil, err
	}
	if a.viewer, err = newTokenHash("admin.viewer_token", cfg.ViewerToken, cfg.ViewerTokenSHA256); err != nil {
		return nil, err
	}
	return a, nil
}

// SessionKey is a secret derived from the configured admin and viewer token hashes, for signing
// console sessions: every replica with the same tokens derives the same key, and changing a
// token invalidates every session signed before. Nil when neither token is configured.
func (a *Admin) SessionKey() []byte {
	if !a.token.set && !a.viewer.set {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("usher console session key v1\x00"))
	h.Write(a.token.sum[:])
	h.Write(a.viewer.sum[:])
	return h.Sum(nil)
}

// AuthenticateActor returns the actor of credential: the admin for the admin token, the viewer
// for the viewer token (constant-time comparisons of hashes), else the tenant of a valid tenant
// credential. Failures wrap ErrUnauthenticated and never contain the credential.
func (a *Admin) AuthenticateActor(ctx context.Context, credential string) (Actor, error) {
	if err := checkShape(credential); err != nil {
		return Actor{}, err
	}
	h := sum256(credential)
	isAdmin, isViewer := a.token.matches(h), a.viewer.matches(h)
	switch {
	case isAdmin:
		return Actor{Name: "admin", Admin: true}, nil
	case isViewer:
		return Actor{Name: "viewer", Viewer: true}, nil
	}
	p, err := a.dir.Authenticate(ctx, credential)
	if err != nil {
		return Actor{}, err
	}
	return Actor{Name: "tenant:" + p.TenantID + "/" + p.KeyID, TenantID: p.TenantID, Credential: p}, nil
}

func requireAdmin(actor Actor) error {
	if !actor.Admin {
		return fmt.Errorf("admin rights required: %w", ErrForbidden)
	}
	return nil
}

// requireTenant allows changes by the admin and the tenant id itself. The viewer gets
// ErrForbidden; another tenant gets ErrNotFound, so it cannot even learn whether the object
// exists.
func requireTenant(actor Actor, id string) error {
	switch {
	case actor.Admin || actor.TenantID == id && id != "":
		return nil
	case actor.Viewer:
		return fmt.Errorf("the viewer is read-only: %w", ErrForbidden)
	}
	return fmt.Errorf("tenant %q: %w", id, ErrNotFound)
}

// requireTenantRead allows reads by the admin, the viewer and the tenant id itself.
func requireTenantRead(actor Actor, id string) error {
	if actor.Viewer {
		return nil
	}
	return requireTenant(actor, id)
}

// readsAll reports whether the actor reads every tenant (the admin and the viewer).
func readsAll(actor Actor) bool { return actor.Admin || actor.Viewer }

func invalid(field, format string, args ...any) error {
	return fmt.Errorf("%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalid)
}

// checkText accepts 1 to 200 bytes of UTF-8 without NUL (PostgreSQL cannot store NUL).
func checkText(field, s string) error {
	if s == "" || len(s) > 200 || !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
		return invalid(field, "must be 1 to 200 bytes of UTF-8 text")
	}
	return nil
}

// TenantInput is the body of a tenant creation.
type TenantInput struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Tier string `json:"tier"` // default: the config's default tier
}

// TenantUpdate changes the fields that are set.
type TenantUpdate struct {
	Name *string `json:"name"`
	Tier *string `json:"tier"`
}

// Tenants lists every tenant (the config file's first, then the store's) for the admin and the
// viewer, and only its own for a tenant.
func (a *Admin) Tenants(ctx context.Context, actor Actor) ([]Tenant, error) {
	if !readsAll(actor) {
		t, err := a.Tenant(ctx, actor, actor.TenantID)
		if err != nil {
			return nil, err
		}
		return []Tenant{t}, nil
	}
	stored, err := a.store.Tenants(ctx)
	if err != nil {
		return nil, err
	}
	return append(a.dir.ConfigTenants(), stored...), nil
}

// Tenant returns one tenant (the admin, the viewer, or that tenant itself).
func (a *Admin) Tenant(ctx context.Context, actor Actor, id string) (Tenant, error) {
	if err := requireTenantRead(actor, id); err != nil {
		return Tenant{}, err
	}
	if a.dir.IsConfigTenant(id) {
		t, _ := a.dir.Tenant(id)
		return t, nil
	}
	return a.store.Tenant(ctx, id)
}

// CreateTenant creates an active tenant (admin only).
func (a *Admin) CreateTenant(ctx context.Context, actor Actor, in TenantInput) (Tenant, error) {
	if err := requireAdmin(actor); err != nil {
		return Tenant{}, err
	}
	if !idPattern.MatchString(in.ID) {
		return Tenant{}, invalid("id", "must be 1 to 64 characters of A-Z a-z 0-9 . _ -")
	}
	if in.Name == "" {
		in.Name = in.ID
	}
	if err := checkText("name", in.Name); err != nil {
		return Tenant{}, err
	}
	if in.Tier == "" {
		in.Tier = a.dir.DefaultTier()
	}
	if _, ok := a.dir.Tier(in.Tier); !ok {
		return Tenant{}, invalid("tier", "names no declared tier")
	}
	if a.dir.IsConfigTenant(in.ID) {
		return Tenant{}, fmt.Errorf("tenant %q: %w", in.ID, ErrReadOnly)
	}
	t, err := a.store.CreateTenant(ctx, actor.Name, Tenant{ID: in.ID, Name: in.Name, Tier: in.Tier})
	if err != nil {
		return Tenant{}, err
	}
	a.dir.Changed(ctx)
	return t, nil
}

// UpdateTenant changes a tenant's name or tier (admin only).
func (a *Admin) UpdateTenant(ctx context.Context, actor Actor, id string, up TenantUpdate) (Tenant, error) {
	if err := a.checkStoredTenantChange(actor, id); err != nil {
		return Tenant{}, err
	}
	t, err := a.store.Tenant(ctx, id)
	if err != nil {
		return Tenant{}, err
	}
	if up.Name != nil {
		if err := checkText("name", *up.Name); err != nil {
			return Tenant{}, err
		}
		t.Name = *up.Name
	}
	if up.Tier != nil {
		if _, ok := a.dir.Tier(*up.Tier); !ok {
			return Tenant{}, invalid("tier", "names no declared tier")
		}
		t.Tier = *up.Tier
	}
	if err := a.store.UpdateTenant(ctx, actor.Name, t); err != nil {
		return Tenant{}, err
	}
	a.dir.Changed(ctx)
	return t, nil
}

func (a *Admin) checkStoredTenantChange(actor Actor, id string) error {
	if err := requireAdmin(actor); err != nil {
		return err
	}
	if a.dir.IsConfigTenant(id) {
		return fmt.Errorf("tenant %q: %w", id, ErrReadOnly)
	}
	return nil
}

// SuspendTenant refuses the tenant's credentials from now on, on every replica (admin only).
func (a *Admin) SuspendTenant(ctx context.Context, actor Actor, id string) error {
	return a.setStatus(ctx, actor, id, StatusSuspended)
}

// ResumeTenant lifts a suspension (admin only).
func (a *Admin) ResumeTenant(ctx context.Context, actor Actor, id string) error {
	return a.setStatus(ctx, actor, id, StatusActive)
}

func (a *Admin) setStatus(ctx context.Context, actor Actor, id, status string) error {
	if err := a.checkStoredTenantChange(actor, id); err != nil {
		return err
	}
	if err := a.store.SetTenantStatus(ctx, actor.Name, id, status); err != nil {
		return err
	}
	a.dir.Changed(ctx)
	return nil
}

// DeleteTenant deletes a tenant and its keys (admin only).
func (a *Admin) DeleteTenant(ctx context.Context, actor Actor, id string) error {
	if err := a.checkStoredTenantChange(actor, id); err != nil {
		return err
	}
	if err := a.store.DeleteTenant(ctx, actor.Name, id); err != nil {
		return err
	}
	a.dir.Changed(ctx)
	return nil
}

// KeyInput is the body of a key creation.
type KeyInput struct {
	Name string `json:"name"`
	// Expires is when the key stops working; zero: never. It must lie in the future. A key made
	// by a credential that expires expires at the latest with it (by default at the same time).
	Expires time.Time `json:"expires"`
	// Tier caps the key's tier; empty: the tenant's tier, or the creating credential's when
	// that credential is itself capped. Never above the tenant's tier or the creator's.
	Tier string `json:"tier"`
	// ManageKeys lets the new key manage the tenant's keys in turn.
	ManageKeys bool `json:"manage_keys"`
}

// errNoKeyPermission refuses key management to a credential without the ManageKeys permission.
var errNoKeyPermission = fmt.Errorf("this credential may not manage keys (it needs the manage_keys permission, or the %q scope for a JWT): %w", ScopeManageKeys, ErrForbidden)

// CreateKey makes a key for tenant tenantID and returns it with the whole key string, which is
// never shown again. The admin may create any key; a tenant may create keys for itself only
// with a credential that has the ManageKeys permission, and only within that credential's
// scope: at or below its tier, expiring no later than it (ErrForbidden otherwise). A lowered or
// short-lived credential thus never mints a stronger one.
func (a *Admin) CreateKey(ctx context.Context, actor Actor, tenantID string, in KeyInput) (APIKey, string, error) {
	if err := requireTenant(actor, tenantID); err != nil {
		return APIKey{}, "", err
	}
	if !actor.Admin && !actor.Credential.ManageKeys {
		return APIKey{}, "", errNoKeyPermission
	}
	if a.dir.IsConfigTenant(tenantID) {
		return APIKey{}, "", fmt.Errorf("tenant %q: keys of config tenants live in the file: %w", tenantID, ErrReadOnly)
	}
	if err := checkText("name", in.Name); err != nil {
		return APIKey{}, "", err
	}
	if !in.Expires.IsZero() && !in.Expires.After(a.now()) {
		return APIKey{}, "", invalid("expires", "must lie in the future")
	}
	t, err := a.store.Tenant(ctx, tenantID)
	if err != nil {
		return APIKey{}, "", err
	}
	if in.Tier != "" {
		if _, ok := a.dir.Tier(in.Tier); !ok {
			return APIKey{}, "", invalid("tier", "names no declared tier")
		}
		if !a.dir.atOrBelow(in.Tier, t.Tier) {
			return APIKey{}, "", invalid("tier", "%s is above the tenant's tier %s", in.Tier, t.Tier)
		}
	}
	if !actor.Admin {
		if err := a.withinCredential(actor.Credential, &in); err != nil {
			return APIKey{}, "", err
		}
	}
	nk := NewKey{Name: in.Name, Expires: in.Expires, Tier: in.Tier, ManageKeys: in.ManageKeys}
	if !actor.Admin && looksLikeStoredKeyID(actor.Credential.KeyID) {
		nk.Parent = actor.Credential.KeyID
	}
	k, key, err := a.store.CreateKey(ctx, actor.Name, tenantID, nk)
	if err != nil {
		return APIKey{}, "", err
	}
	a.dir.Changed(ctx)
	return k, key, nil
}

// withinCredential bounds in by the scope of the credential creating it: the new key defaults
// to the credential's expiry and capped tier, and may not go beyond either.
func (a *Admin) withinCredential(c Principal, in *KeyInput) error {
	if !c.Expires.IsZero() {
		switch {
		case in.Expires.IsZero():
			in.Expires = c.Expires
		case in.Expires.After(c.Expires):
			return fmt.Errorf("expires: after the expiry of the credential creating the key: %w", ErrForbidden)
		}
	}
	switch {
	case in.Tier == "" && c.TierCapped:
		in.Tier = c.Tier
	case in.Tier != "" && !a.dir.atOrBelow(in.Tier, c.Tier):
		return fmt.Errorf("tier: %s is above the tier of the credential creating the key: %w", in.Tier, ErrForbidden)
	}
	return nil
}

// Keys lists a tenant's keys without their secrets (the admin, the viewer, or that tenant
// itself).
func (a *Admin) Keys(ctx context.Context, actor Actor, tenantID string) ([]APIKey, error) {
	if err := requireTenantRead(actor, tenantID); err != nil {
		return nil, err
	}
	if a.dir.IsConfigTenant(tenantID) {
		return []APIKey{}, nil
	}
	if _, err := a.store.Tenant(ctx, tenantID); err != nil {
		return nil, err
	}
	keys, err := a.store.Keys(ctx, tenantID)
	if keys == nil && err == nil {
		keys = []APIKey{}
	}
	return keys, err
}

// RevokeKey revokes a key at once on every replica. The admin may revoke any key; a tenant
// credential may revoke itself, and other keys of its tenant only with the ManageKeys
// permission and only those within its own scope (a key it could have created: at or below its
// tier, expiring no later than it); ErrForbidden otherwise.
func (a *Admin) RevokeKey(ctx context.Context, actor Actor, tenantID, keyID string) error {
	if err := requireTenant(actor, tenantID); err != nil {
		return err
	}
	if !actor.Admin && keyID != actor.Credential.KeyID {
		if !actor.Credential.ManageKeys {
			return errNoKeyPermission
		}
		if err := a.revocableBy(ctx, actor.Credential, tenantID, keyID); err != nil {
			return err
		}
	}
	if err := a.store.RevokeKey(ctx, actor.Name, tenantID, keyID); err != nil {
		return err
	}
	a.dir.Changed(ctx)
	return nil
}

// revocableBy checks that key keyID of tenantID lies within credential c's scope.
func (a *Admin) revocableBy(ctx context.Context, c Principal, tenantID, keyID string) error {
	k, err := a.store.Key(ctx, keyID)
	if err != nil {
		return err
	}
	if k.TenantID != tenantID {
		return fmt.Errorf("key %q: %w", keyID, ErrNotFound)
	}
	tier := k.Tier
	if tier == "" {
		t, err := a.store.Tenant(ctx, tenantID)
		if err != nil {
			return err
		}
		tier = t.Tier
	}
	if !a.dir.atOrBelow(tier, c.Tier) {
		return fmt.Errorf("key %q runs at a tier above this credential's: %w", keyID, ErrForbidden)
	}
	if !c.Expires.IsZero() && (k.Expires.IsZero() || k.Expires.After(c.Expires)) {
		return fmt.Errorf("key %q outlives this credential: %w", keyID, ErrForbidden)
	}
	return nil
}

// Tiers lists the declared tiers, highest first (any actor).
func (a *Admin) Tiers(Actor) []Tier { return a.dir.Tiers() }

// Record writes actor's action on a fleet object (a worker, a pin) to the audit log; only
// an admin acts on the fleet.
func (a *Admin) Record(ctx context.Context, actor Actor, action, object string, details any) error {
	if err := requireAdmin(actor); err != nil {
		return err
	}
	return a.store.Record(ctx, actor.Name, action, object, details)
}

// Audit returns a page of the audit log, newest first: everything for the admin and the viewer,
// the entries about its own tenant and keys for a tenant.
func (a *Admin) Audit(ctx context.Context, actor Actor, q AuditQuery) (AuditPage, error) {
	if !readsAll(actor) {
		if q.TenantID != "" && q.TenantID != actor.TenantID {
			return AuditPage{}, fmt.Errorf("tenant %q: %w", q.TenantID, ErrNotFound)
		}
		q.TenantID = actor.TenantID
	}
	return a.store.Audit(ctx, q)
}
