package routing

import "context"

// Prepared is what Pool.Prepare found for a request: the I/O its model's policy needs before it
// picks, done once before the request waits, so that its picks do none. kv_aware keeps the
// prompt's token ids (asked of a worker's /tokenize once per request: a later Prepare keeps
// them); sticky_session and manual keep the request's pin, made or moved when its worker was not
// fit. Its fields are the policies' own: a caller keeps the value on the Request and reads
// nothing of it. The zero value is a request not prepared: a pick routes it as though the
// policy's I/O had failed (see Pool.Pick).
type Prepared struct {
	// tokenized: kv_aware asked for the prompt's token ids; tokens holds them (nil: the ask
	// failed).
	tokenized bool
	tokens    []uint64
	// pin is what sticky_session's or manual's lookup found of the request's key; nil: the
	// request has no key.
	pin *pinLookup
}

// preparer is implemented by policies that need I/O for a request before they can pick for it
// (kv_aware's /tokenize, the pin store of sticky_session and manual). prepare returns r.Prepared
// with what it found for r added; it modifies neither r nor its Request.
type preparer interface {
	prepare(ctx context.Context, r choice, workers []*Worker) Prepared
}

// Prepare does the I/O r's model's policy needs before it picks (kv_aware asks a worker's
// /tokenize for the prompt's token ids; sticky_session and manual look the request's pin up, and
// make or move it when it has no fit worker) and keeps what it found in r.Prepared, the one field
// of r it sets. The gateway calls it before r waits in its queue, whose lock r's picks are made
// under, and again before a retry (a pin to the failed worker moves; token ids already asked are
// kept). Pick itself does none of this I/O: a request it gets unprepared routes as though the
// I/O had failed (see Pick), so a caller prepares every request whose model's policy may need it.
// It costs what the policy documents; nothing for most. Do not call it during a Pick of r.
func (p *Pool) Prepare(ctx context.Context, r *Request) {
	ms := p.snap.Load().models[r.Model]
	if ms != nil {
		ms = ms.stageSet(r.Stage)
	}
	if ms == nil {
		return
	}
	if pr, ok := ms.policy.(preparer); ok {
		// Before the wait, no protection of the picks to come is known: none applies.
		r.Prepared = pr.prepare(ctx, choice{Request: r, Prepared: r.Prepared}, ms.workers)
	}
}
