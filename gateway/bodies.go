package gateway

import (
	"errors"
	"sync"
)

// Request bodies are held in memory from the parse stage to the end of the call (the worker's
// body is built from them, and retries resend it). bodyBytes bounds what is held, per tenant and
// in all, so that slow uploads of large bodies from one key cannot take the gateway's memory:
// a body's bytes are reserved before they are read (all of them from Content-Length, else as
// the buffer grows) and given back when the call ends.

// Refusals of the body bound, mapped by the error table: the tenant's share is full (429), or
// every tenant's together is (503). Both carry Retry-After: bodies are given back as calls end.
var (
	errTenantBodyBytes = errors.New("your requests in progress hold as many body bytes as a tenant may; retry when some have finished")
	errBodyBytes       = errors.New("the gateway holds as many request body bytes as it may; retry shortly")
)

// bodyBytes counts the request-body bytes held, in all and per tenant. It is safe for concurrent
// use.
type bodyBytes struct {
	limit     int64 // bytes held in all at most
	perTenant int64 // bytes one tenant's calls hold at most

	mu      sync.Mutex // guards total and tenants
	total   int64
	tenants map[string]int64 // a tenant holding none has no entry
}

func newBodyBytes(limit, perTenant int64) *bodyBytes {
	return &bodyBytes{limit: limit, perTenant: perTenant, tenants: map[string]int64{}}
}

// bodyHold is the bytes one call holds. Its methods are for the call's goroutine; a nil hold
// holds nothing.
type bodyHold struct {
	b      *bodyBytes
	tenant string
	n      int64
}

// hold starts a call's hold for tenant, holding nothing yet.
func (b *bodyBytes) hold(tenant string) *bodyHold { return &bodyHold{b: b, tenant: tenant} }

// grow reserves n more bytes, or refuses (errTenantBodyBytes, errBodyBytes) and reserves none.
func (h *bodyHold) grow(n int64) error {
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.tenants[h.tenant]+n > b.perTenant:
		return errTenantBodyBytes
	case b.total+n > b.limit:
		return errBodyBytes
	}
	b.tenants[h.tenant] += n
	b.total += n
	h.n += n
	return nil
}

// release gives back every byte the hold reserved.
func (h *bodyHold) release() {
	if h == nil || h.n == 0 {
		return
	}
	b := h.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.tenants[h.tenant] -= h.n; b.tenants[h.tenant] == 0 {
		delete(b.tenants, h.tenant)
	}
	b.total -= h.n
	h.n = 0
}

// held returns the bytes held in all and by tenant.
func (b *bodyBytes) held(tenant string) (total, byTenant int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total, b.tenants[tenant]
}
