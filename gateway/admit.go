package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Headers of the admit stage.
const (
	headerPriority   = "X-Usher-Priority"    // a class the client asks for: interactive, standard, batch
	headerDeadlineMs = "X-Usher-Deadline-Ms" // how long the request may wait in usher's queue, in milliseconds
	headerClass      = "X-Usher-Class"       // the class the request was served in
	headerQueueMs    = "X-Usher-Queue-Ms"    // the time the request waited in usher's queue
	headerSessionID  = "X-Session-ID"
	// canonicalSessionID is headerSessionID as net/http stores it.
	canonicalSessionID = "X-Session-Id"
	headerRoutingKey   = "X-Usher-Routing-Key"
	headerTarget       = "X-Usher-Target-Worker"
)

// maxRoutingKey bounds X-Session-ID and X-Usher-Routing-Key: each becomes a pin in Redis and a
// row of the console's Sessions page, so a tenant must not be able to make them large.
const maxRoutingKey = 256

// validRoutingKey reports whether a session id or routing key is within maxRoutingKey printable
// ASCII characters (empty: none given).
func validRoutingKey(s string) bool {
	if len(s) > maxRoutingKey {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// maxDeadline bounds X-Usher-Deadline-Ms.
const maxDeadline = 24 * time.Hour

// fallbackTier applies to principals without a tier (an authenticator that resolves none).
var fallbackTier = &tenants.Tier{
	Name: "fallback", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
	Weight: 1, Models: []string{"*"},
}

// Limits is the tiers' rate limiter as the gateway uses it; *tenants.Limiter implements it.
type Limits interface {
	// Admit reserves a request slot, a concurrency slot and the token estimate, or refuses
	// (tenants.ErrModelNotAllowed, tenants.ErrPromptTooLong, *tenants.LimitError).
	Admit(ctx context.Context, p tenants.Principal, d tenants.Demand) (*tenants.Hold, error)
}

// admit decides whether and when the call may go: the model and the tier, the class and the
// deadline, the tenant's limits, then the model's queue, where it waits until released. What it
// holds (cl.hold, cl.grant) settle gives back.
func (s *Server) admit(c echo.Context, cl *call) error {
	if !s.pool.Serves(cl.model) {
		return fmt.Errorf("the model %q does not exist: %w", cl.model, routing.ErrUnknownModel)
	}
	if cl.principal.TierSpec == nil {
		cl.principal.TierSpec = fallbackTier
	}
	cl.tier = cl.principal.TierSpec
	if !cl.tier.AllowsModel(cl.model) {
		return fmt.Errorf("model %q: %w", cl.model, tenants.ErrModelNotAllowed)
	}
	h := c.Request().Header
	target := headerValue(h, headerTarget)
	if target != "" && !cl.tier.MayTargetWorker {
		return errTargetNotAllowed
	}
	fallback := s.cfg.DefaultMaxTokens
	if cl.tier.ExpectedOutputTokens > 0 {
		fallback = int(min(cl.tier.ExpectedOutputTokens, maxOutputTokens))
	}
	cl.boundOutput(fallback)
	if err := s.classAndDeadline(cl, h); err != nil {
		return err
	}
	if err := cl.askedObjectives(h); err != nil {
		return err
	}
	if err := cl.askedMissPolicy(h); err != nil {
		return err
	}
	if err := s.reserveBudget(c, cl); err != nil {
		return err
	}
	if err := s.holdLimits(c, cl); err != nil {
		return err
	}
	session, key := headerValue(h, canonicalSessionID), headerValue(h, headerRoutingKey)
	if !validRoutingKey(session) {
		return BadRequest("", "%s must be at most %d printable ASCII characters", headerSessionID, maxRoutingKey)
	}
	if !validRoutingKey(key) {
		return BadRequest("", "%s must be at most %d printable ASCII characters", headerRoutingKey, maxRoutingKey)
	}
	cl.route = routing.Request{
		Model:        cl.model,
		Tenant:       cl.principal.TenantID,
		Tier:         cl.tier.Name,
		SessionID:    session,
		RoutingKey:   key,
		TargetWorker: target,
		Prompt:       cl.prompt,
		Messages:     cl.messages,
		PromptTokens: cl.promptTokens,
		Tokens:       addTokens(cl.promptTokens, cl.expected),
		Interactive:  cl.class == queue.Interactive,
	}
	s.planStages(cl)
	return s.wait(c, cl)
}

// classAndDeadline resolves the call's class (the tier's default, lowered but never raised by
// X-Usher-Priority or OpenAI's service_tier) and its deadline (X-Usher-Deadline-Ms, else the
// tier's default for the class): the time by which it must leave usher's queue.
func (s *Server) classAndDeadline(cl *call, h http.Header) error {
	requested, ok := requestedClass(cl.serviceTier)
	if !ok {
		return BadRequest("service_tier", "'service_tier' must be one of auto, default, flex, scale, priority")
	}
	if p := headerValue(h, headerPriority); p != "" {
		if _, err := queue.ParseClass(p); err != nil {
			return BadRequest("", "%s must be one of interactive, standard, batch", headerPriority)
		}
		requested = p
	}
	name := cl.tier.Class(requested)
	class, err := queue.ParseClass(name)
	if err != nil {
		return fmt.Errorf("tier %q: %w", cl.tier.Name, err)
	}
	cl.class, cl.classed = class, true
	budget := cl.tier.Deadline(name)
	if v := headerValue(h, headerDeadlineMs); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || ms > maxDeadline.Milliseconds() {
			return BadRequest("", "%s must be a positive number of milliseconds up to %d", headerDeadlineMs, maxDeadline.Milliseconds())
		}
		budget = time.Duration(ms) * time.Millisecond
	}
	if budget > 0 {
		cl.deadline = s.now().Add(budget)
	}
	return nil
}

// reserveBudget holds the call in its tenant's budgets: one request and its estimate (prompt
// plus the output it may produce, as the queue counts it), so concurrent calls cannot pass a cap
// between admission and settlement; settle charges what was served in its place.
func (s *Server) reserveBudget(c echo.Context, cl *call) error {
	if s.budgets == nil {
		return nil
	}
	spend, err := s.budgets.Reserve(c.Request().Context(), cl.principal, int64(addTokens(cl.promptTokens, cl.expected)))
	cl.spend = spend
	return err
}

// holdLimits applies the tenant's limits; settle releases the hold with the tokens really used.
// The quota goes out in OpenAI's x-ratelimit-* headers, on a refusal too.
func (s *Server) holdLimits(c echo.Context, cl *call) error {
	if s.limits == nil {
		return nil
	}
	hold, err := s.limits.Admit(c.Request().Context(), cl.principal, tenants.Demand{Model: cl.model,
		PromptTokens: int64(cl.promptTokens), MaxOutputTokens: int64(cl.expected)})
	var le *tenants.LimitError
	if errors.As(err, &le) {
		setQuotaHeaders(c.Response().Header(), le.Quota)
		return err
	}
	if err != nil {
		return err
	}
	setQuotaHeaders(c.Response().Header(), hold.Quota)
	cl.hold = hold
	return nil
}

// setQuotaHeaders sets OpenAI's x-ratelimit-{limit,remaining,reset}-{requests,tokens} headers
// from q; a limit of 0 (unlimited) leaves its three headers out.
func setQuotaHeaders(h http.Header, q tenants.Quota) {
	if q.LimitRequests > 0 {
		h.Set("x-ratelimit-limit-requests", strconv.FormatInt(q.LimitRequests, 10))
		h.Set("x-ratelimit-remaining-requests", strconv.FormatInt(q.RemainingRequests, 10))
		h.Set("x-ratelimit-reset-requests", resetString(q.ResetRequests))
	}
	if q.LimitTokens > 0 {
		h.Set("x-ratelimit-limit-tokens", strconv.FormatInt(q.LimitTokens, 10))
		h.Set("x-ratelimit-remaining-tokens", strconv.FormatInt(q.RemainingTokens, 10))
		h.Set("x-ratelimit-reset-tokens", resetString(q.ResetTokens))
	}
}

// resetString formats d as OpenAI does ("20ms", "1s", "6m0s").
func resetString(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// wait queues the call in its model's queue and blocks until it is released (cl.grant) on its
// worker (cl.lease), its deadline passes, the client goes away or the gateway stops admitting.
func (s *Server) wait(c echo.Context, cl *call) error {
	if !s.dispatcher.hasCapacity(cl.model) {
		return fmt.Errorf("model %q: %w", cl.model, routing.ErrNoWorker)
	}
	q, err := s.dispatcher.queueFor(cl.model)
	if err != nil {
		return err
	}
	// The routing policy's I/O, if any, now: the placer picks under the queue's lock.
	s.prepare(c, cl)
	if err := s.holdToObjective(cl); err != nil {
		return err
	}
	cl.placer = placer{ctx: c.Request().Context(), pool: s.pool, route: &cl.route}
	if cl.twoStage {
		cl.placer.decode = &cl.decodeRoute
	}
	ticket, err := q.Enqueue(queue.Request{
		Tenant:       cl.principal.TenantID,
		Class:        cl.class,
		Weight:       cl.tier.Weight,
		PromptTokens: cl.promptTokens,
		MaxTokens:    cl.expected,
		Deadline:     cl.deadline,
		Due:          s.due(cl),
		MaxQueued:    int(cl.tier.MaxQueued),
		Placer:       &cl.placer,
	})
	if err != nil {
		return cl.objectiveMissed(err)
	}
	if cl.class == queue.Interactive {
		select {
		case <-ticket.Ready():
		default:
			// No room for an interactive call: in a fleet, room taken for it from the fleet's
			// interactive reserve (one round trip; the queue places it there once the pool
			// tells of the change); else standard or batch calls whose answers have not begun
			// give it their room on a worker, which nothing but interactive calls take until
			// this one is placed; else, in a fleet, another replica's (callForRoom).
			if !s.pool.TakeReserve(c.Request().Context(), &cl.route) && !s.cfg.DisablePreemption {
				short := s.shortfalls(cl)
				if w := s.preemption.preemptFor(cl.model, short); w != nil {
					defer w.HoldForInteractive()()
				} else {
					s.callForRoom(c.Request().Context(), cl, ticket, short)
				}
			}
		}
	}
	return s.await(c, cl, ticket)
}

// await blocks until ticket is released (cl.grant) on its worker (cl.lease), its deadline
// passes, the client goes away or the gateway stops admitting.
func (s *Server) await(c echo.Context, cl *call, ticket *queue.Ticket) error {
	ctx := c.Request().Context()
	grant, err := ticket.Wait(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return errClientGone
		}
		return cl.objectiveMissed(err)
	}
	cl.grant = grant
	pl := grant.Placement.(placement)
	cl.lease, cl.decode = pl.Lease, pl.decode
	// A two-staged call placed with no decode lease is served whole on a decode worker.
	cl.local = cl.twoStage && pl.decode == nil
	cl.queued += grant.Waited
	rh := c.Response().Header()
	rh[headerClass] = classHeader[grant.Class]
	rh[headerServiceTier] = serviceTierHeader[grant.Class]
	rh[headerQueueMs] = queueMsHeader(cl.queued)
	return nil
}

// queueMsHeaders hold the X-Usher-Queue-Ms values of waits under 100 ms, most calls' on a fleet
// with room, shared read-only as classHeader.
var queueMsHeaders = func() (v [100][]string) {
	for ms := range v {
		v[ms] = []string{strconv.Itoa(ms)}
	}
	return v
}()

// queueMsHeader is the X-Usher-Queue-Ms value of a wait of d.
func queueMsHeader(d time.Duration) []string {
	if ms := d.Milliseconds(); ms >= 0 && ms < int64(len(queueMsHeaders)) {
		return queueMsHeaders[ms]
	}
	return []string{strconv.FormatInt(d.Milliseconds(), 10)}
}

// shortfalls is what the workers the call may use lack for it now (routing.Pool.Shortfalls), for
// preemption to make it room: for a two-staged call, those of its decode stage's pool while no
// worker there has room (the pool whose leases last the whole answer, which the queue's capacity
// counts, and where a short interactive prompt is served whole), else its prefill stage's. (The
// prefill stage's alone let a staged interactive call that waited for a decode worker preempt
// nothing: the lower-class attempts it could end run on the decode pool.)
func (s *Server) shortfalls(cl *call) []routing.Shortfall {
	if cl.twoStage {
		short := s.pool.Shortfalls(&cl.decodeRoute)
		if !slices.ContainsFunc(short, func(f routing.Shortfall) bool { return f.Requests == 0 && f.Tokens == 0 }) {
			return short
		}
	}
	return s.pool.Shortfalls(&cl.route)
}
