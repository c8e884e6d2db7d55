// Package gateway is usher's HTTP edge and the one place where the domain packages meet.
//
// It owns the Echo server: the OpenAI-compatible data plane (/v1/chat/completions,
// /v1/completions, /v1/models), the operations endpoints (/healthz, /readyz, /metrics), the
// streaming proxy to the workers, and the mapping of every error to an HTTP status in OpenAI's
// error shape (errors.go). It joins tenants (who is calling), routing (which worker serves) and,
// where configured, queue (when the request may go) for each request; those packages know
// nothing of HTTP or of each other.
package gateway
