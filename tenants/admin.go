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

// AdminConfig configures the bootstrap admin token (`admin:` in the file). Set one of the two;
// with neither, only tenants (acting on their own objects) can use the admin service.
type AdminConfig struct {
	// TokenSHA256 is the hex SHA-256 of the admin token (`usher keyhash` prints it).
	TokenSHA256 string `yaml:"token_sha256"`
	// Token is the admin token itself, for example from the environment (USHER_ADMIN_TOKEN). It
	// is hashed by NewAdmin and not kept.
	Token string `yaml:"token"`
}

func (c AdminConfig) validate() []error {
	var errs []error
	if c.TokenSHA256 != "" && !isHexHash(c.TokenSHA256) {
		errs = append(errs, errors.New("admin.token_sha256: must be 64 hex characters"))
	}
	if c.TokenSHA256 != "" && c.Token != "" {
		errs = append(errs, errors.New("admin.token: set either admin.token or admin.token_sha256, not both"))
	}
	if c.Token != "" && len(c.Token) < 24 {
		errs = append(errs, errors.New("admin.token: must be at least 24 characters"))
	}
	return errs
}

// Refusals of the admin service the gateway maps to HTTP: ErrForbidden 403, ErrInvalid 400,
// ErrNotFound 404, ErrConflict 409 (ErrReadOnly wraps it).
var (
	ErrForbidden = errors.New("forbidden")
	ErrInvalid   = errors.New("invalid input")
	ErrReadOnly  = fmt.Errorf("declared in the config file, read-only: %w", ErrConflict)
)

// Actor is who performs an admin action: the admin (token) or a tenant acting on its own objects
// with one of its credentials.
type Actor struct {
	// Name is what the audit log records: "admin", or "tenant:<id>/<key id>".
	Name string
	// Admin actors may do everything; tenant actors only read their tenant and manage its keys.
	Admin    bool
	TenantID string
}

// Admin is the admin service: tenants CRUD, suspend and resume, keys, tiers and the audit log.
// Every change is written to the audit log with its actor, in the same transaction, and made
// effective on every replica through Directory.Changed. The gateway's HTTP handlers call it.
// Safe for concurrent use.
type Admin struct {
	store     *Store
	dir       *Directory
	tokenHash [sha256.Size]byte
	hasToken  bool
	now       func() time.Time
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
	switch {
	case cfg.Token != "":
		a.tokenHash, a.hasToken = sha256.Sum256([]byte(cfg.Token)), true
	case cfg.TokenSHA256 != "":
		if _, err := hex.Decode(a.tokenHash[:], []byte(cfg.TokenSHA256)); err != nil {
			return nil, errors.New("admin.token_sha256: must be 64 hex characters")
		}
		a.hasToken = true
	}
	return a, nil
}

// AuthenticateActor returns the actor of credential: the admin for the admin token (constant-
// time comparison of hashes), else the tenant of a valid tenant credential. Failures wrap
// ErrUnauthenticated and never contain the credential.
func (a *Admin) AuthenticateActor(ctx context.Context, credential string) (Actor, error) {
	if err := checkShape(credential); err != nil {
		return Actor{}, err
	}
	h := sum256(credential)
	if a.hasToken && subtle.ConstantTimeCompare(h[:], a.tokenHash[:]) == 1 {
		return Actor{Name: "admin", Admin: true}, nil
	}
	p, err := a.dir.Authenticate(ctx, credential)
	if err != nil {
		return Actor{}, err
	}
	return Actor{Name: "tenant:" + p.TenantID + "/" + p.KeyID, TenantID: p.TenantID}, nil
}

func requireAdmin(actor Actor) error {
	if !actor.Admin {
		return fmt.Errorf("admin rights required: %w", ErrForbidden)
	}
	return nil
}

// requireTenant allows the admin and the tenant id itself. Another tenant gets ErrNotFound, so
// it cannot even learn whether the object exists.
func requireTenant(actor Actor, id string) error {
	if actor.Admin || actor.TenantID == id {
		return nil
	}
	return fmt.Errorf("tenant %q: %w", id, ErrNotFound)
}

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

// Tenants lists every tenant (the config file's first, then the store's) for the admin, and
// only its own for a tenant.
func (a *Admin) Tenants(ctx context.Context, actor Actor) ([]Tenant, error) {
	if !actor.Admin {
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

// Tenant returns one tenant.
func (a *Admin) Tenant(ctx context.Context, actor Actor, id string) (Tenant, error) {
	if err := requireTenant(actor, id); err != nil {
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
	// Expires is when the key stops working; zero: never. It must lie in the future.
	Expires time.Time `json:"expires"`
}

// CreateKey makes a key for tenant tenantID (the admin, or that tenant itself) and returns it
// with the whole key string. The key string is never shown again.
func (a *Admin) CreateKey(ctx context.Context, actor Actor, tenantID string, in KeyInput) (APIKey, string, error) {
	if err := requireTenant(actor, tenantID); err != nil {
		return APIKey{}, "", err
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
	k, key, err := a.store.CreateKey(ctx, actor.Name, tenantID, in.Name, in.Expires)
	if err != nil {
		return APIKey{}, "", err
	}
	a.dir.Changed(ctx)
	return k, key, nil
}

// Keys lists a tenant's keys without their secrets (the admin, or that tenant itself).
func (a *Admin) Keys(ctx context.Context, actor Actor, tenantID string) ([]APIKey, error) {
	if err := requireTenant(actor, tenantID); err != nil {
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

// RevokeKey revokes a key at once on every replica (the admin, or that tenant itself).
func (a *Admin) RevokeKey(ctx context.Context, actor Actor, tenantID, keyID string) error {
	if err := requireTenant(actor, tenantID); err != nil {
		return err
	}
	if err := a.store.RevokeKey(ctx, actor.Name, tenantID, keyID); err != nil {
		return err
	}
	a.dir.Changed(ctx)
	return nil
}

// Tiers lists the declared tiers, highest first (any actor).
func (a *Admin) Tiers(Actor) []Tier { return a.dir.Tiers() }

// Audit returns a page of the audit log, newest first: everything for the admin, the entries
// about its own tenant and keys for a tenant.
func (a *Admin) Audit(ctx context.Context, actor Actor, q AuditQuery) (AuditPage, error) {
	if !actor.Admin {
		if q.TenantID != "" && q.TenantID != actor.TenantID {
			return AuditPage{}, fmt.Errorf("tenant %q: %w", q.TenantID, ErrNotFound)
		}
		q.TenantID = actor.TenantID
	}
	return a.store.Audit(ctx, q)
}
