// Package gateway is usher's HTTP edge: the data plane, where the domain packages meet for each
// request.
//
// It owns the Echo server: the OpenAI-compatible data plane (/v1/chat/completions,
// /v1/completions, /v1/embeddings, /v1/models), the operations endpoints (/healthz, /readyz, /metrics), the
// streaming proxy to the workers, and the mapping of every error to an HTTP status in OpenAI's
// error shape (errors.go), which the admin plane uses too. It joins tenants (who is calling),
// routing (which worker serves) and, where configured, queue (when the request may go) for each
// request; those packages know nothing of HTTP or of each other. The admin plane (package
// adminui) is mounted at /admin through Deps.Admin; gateway never imports it.
//
// An inference request is one call value that goes through four stages, one file each, in the
// order it lives: admit.go, dispatch.go, proxy.go, settle.go (after parse.go); call.go tells
// the way top to bottom. The OpenAI edge's details have their own files: embeddings.go,
// models.go, service_tier.go, alias.go (a model an engine knows by another name).
package gateway
