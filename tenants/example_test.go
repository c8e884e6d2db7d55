package tenants_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/usherllm/usher/tenants"
)

// Example shows how the gateway wires the package: config, store and migrations, directory
// (the Authenticator) with its refresh loop, limiter, admin service, then one request.
func Example() {
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	dir, _ := os.MkdirTemp("", "usher-example")
	defer os.RemoveAll(dir)

	cfg := tenants.Config{
		Tiers:   []tenants.Tier{{Name: "pro", RequestsPerMinute: 600, TokensPerMinute: 100_000}},
		Tenants: []tenants.TenantSpec{{ID: "demo", Keys: []tenants.KeySpec{{Name: "main", SHA256: tenants.HashKey("sk-demo")}}}},
	}
	cfg.Database.URL = "sqlite:" + filepath.Join(dir, "usher.db")
	cfg.Admin.Token = "admin-token-of-at-least-24-chars"
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		fmt.Println(err)
		return
	}

	// In cmd/usher the migrations are migrations.FS.
	store, err := tenants.Open(ctx, cfg.Database.URL, os.DirFS("../migrations"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	if err := store.MigrateUp(ctx); err != nil {
		fmt.Println(err)
		return
	}
	jwtVerifier, err := tenants.NewJWTVerifier(cfg.JWT, nil) // nil: no JWT keys configured
	if err != nil {
		fmt.Println(err)
		return
	}
	directory, err := tenants.NewDirectory(ctx, cfg, store, tenants.DirectoryOptions{JWT: jwtVerifier})
	if err != nil {
		fmt.Println(err)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { directory.Run(ctx) })
	defer func() { stop(); wg.Wait() }() // Run writes the last last-used batch, then returns

	limiter := tenants.NewLimiter(cfg.Limits, tenants.LimiterOptions{})
	admin, _ := tenants.NewAdmin(cfg.Admin, store, directory, nil)

	// Admin API: create a tenant and a key.
	actor, _ := admin.AuthenticateActor(ctx, "admin-token-of-at-least-24-chars")
	admin.CreateTenant(ctx, actor, tenants.TenantInput{ID: "acme", Name: "Acme"})
	_, key, _ := admin.CreateKey(ctx, actor, "acme", tenants.KeyInput{Name: "ci"})

	// Data plane: authenticate, admit, serve, reconcile.
	credential, _ := tenants.BearerCredential("Bearer " + key)
	p, err := directory.Authenticate(ctx, credential)
	if err != nil { // errors.Is(err, tenants.ErrUnauthenticated): 401
		fmt.Println(err)
		return
	}
	adm, err := limiter.Admit(ctx, p, tenants.Demand{Model: "llama", PromptTokens: 20, MaxOutputTokens: 100})
	var limited *tenants.LimitError
	switch {
	case errors.Is(err, tenants.ErrModelNotAllowed): // 403
	case errors.As(err, &limited): // 429, Retry-After: limited.RetryAfter, headers: limited.Quota
	}
	fmt.Println(p.TenantID, p.Tier, p.TierSpec.Class(""), adm.Quota.RemainingRequests) // x-ratelimit-remaining-requests
	adm.Done(75)                                                                       // real prompt + completion tokens

	_, err = directory.Authenticate(ctx, "sk-wrong")
	fmt.Println(err)
	// Output:
	// acme pro standard 599
	// unknown credential: unauthenticated
}
