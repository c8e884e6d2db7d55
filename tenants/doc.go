// Package tenants knows who is calling and what they may do: tenants and their SLA tiers, API
// keys (declared in the config file or kept in the SQL store), JWT verification, rate limits and
// the audit log.
//
// The gateway calls an Authenticator with the credential from `Authorization: Bearer <credential>`
// and gets a Principal (tenant and tier) or an error wrapping ErrUnauthenticated. Credentials are
// secrets: no error, log line or metric label of this package ever contains one.
//
// The package imports no other package of the project; migrations come in as an fs.FS.
package tenants
