// Package tenants knows who is calling and what they may do: tenants and their SLA tiers, API
// keys (declared in the config file or kept in the SQL store), JWT verification, rate limits,
// the admin service and the audit log.
//
// The parts, by file:
//   - config.go, tier.go: Config (embedded inline in usher's YAML file) and the SLA tiers.
//   - store.go, key.go: the SQL Store (SQLite or PostgreSQL, goose migrations handed in as an
//     fs.FS) with tenants, keys `usk_<id>_<secret>` and the audit log.
//   - directory.go: Directory, the Authenticator the gateway calls. It holds config tenants,
//     stored tenants and keys in memory (no SQL on the request path for a known credential) and
//     keeps them fresh, reloading only what the store's changes log says changed.
//   - jwt.go, jwks.go: JWTVerifier, plugged into the Directory; the keys of a JWKS URL, cached
//     and rotated by kid (the HTTP fetch is handed in: JWKSFetcher).
//   - limits.go, limits.lua, arith.go: Limiter, rate, token and concurrency limits per tenant
//     and tier (a credential below its tenant's tier counts against both), local or shared
//     through Redis (requests in flight hold leases that expire on their own); the Quota it
//     reports is plain numbers, which the gateway turns into headers. Client numbers are added
//     with saturation, never wrapping.
//   - admin.go: Admin, the admin service behind the gateway's /admin/api/v1 handlers. Keys are
//     minted only within the creating credential's tier (Tier.Within: a tier that grants
//     nothing more), expiry and permission, and remember the key that minted them.
//     admin_metering.go: its usage and budget calls (a tenant reads only its own).
//   - usage.go, ledger.go, usage_store.go: the usage ledger. Ledger records every request's usage
//     in memory and writes it in batches (through Redis when present, folded into SQL by one
//     replica at a time); the store keeps it per tenant, key, model, class and hour, rolled up
//     into days.
//   - budget.go, budget_store.go: Budgets, tokens and requests per tenant (and key) per UTC day
//     and month, from the tier or set through the admin API, counted in Redis or per replica:
//     each request reserves its estimate at admission and settles what it was served.
//   - static.go: Static, the config-keys-only Authenticator of the first gateway.
//
// Credentials are secrets: no error, log line or metric label of this package contains one.
// Every credential failure wraps ErrUnauthenticated.
//
// The package imports no other package of the project, and not net/http.
package tenants
