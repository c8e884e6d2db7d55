package gateway

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Headers of admission.
const (
	headerPriority   = "X-Usher-Priority"    // a class the client asks for: interactive, standard, batch
	headerDeadlineMs = "X-Usher-Deadline-Ms" // the client's time budget in milliseconds
	headerClass      = "X-Usher-Class"       // the class the request was served in
	headerQueueMs    = "X-Usher-Queue-Ms"    // the time the request waited in usher's queue
)

// maxDeadline bounds X-Usher-Deadline-Ms.
const maxDeadline = 24 * time.Hour

// fallbackTier applies to principals without a tier (an authenticator that resolves none).
var fallbackTier = &tenants.Tier{
	Name: "fallback", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
	Weight: 1, Models: []string{"*"},
}

// admission holds one queue per model and keeps each queue's capacity equal to what the
// model's healthy workers can hold in flight. Safe for concurrent use.
type admission struct {
	cfg  queue.Config
	opts queue.Options
	pool *routing.Pool

	mu     sync.Mutex                // guards queues, caps and closed
	queues map[string]*queue.Queue   // by model
	caps   map[string]queue.Capacity // by model, as last set
	closed bool
}

func newAdmission(cfg queue.Config, opts queue.Options, pool *routing.Pool) (*admission, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &admission{cfg: cfg, opts: opts, pool: pool,
		queues: map[string]*queue.Queue{}, caps: map[string]queue.Capacity{}}
	a.refresh()
	return a, nil
}

// queueFor returns the model's queue, creating it on first use.
func (a *admission) queueFor(model string) (*queue.Queue, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return nil, &queue.Rejection{Reason: queue.Shutdown, RetryAfter: time.Second}
	}
	if q, ok := a.queues[model]; ok {
		return q, nil
	}
	return a.addQueueLocked(model, a.pool.Workers())
}

// addQueueLocked creates the queue of model with the capacity of workers. a.mu must be held.
func (a *admission) addQueueLocked(model string, workers []routing.WorkerStatus) (*queue.Queue, error) {
	opts := a.opts
	opts.Model = model
	q, err := queue.New(a.cfg, opts)
	if err != nil {
		return nil, err
	}
	a.caps[model] = capacityOf(workers, model)
	q.SetCapacity(a.caps[model])
	a.queues[model] = q
	return q, nil
}

// hasCapacity reports whether the model had a healthy worker at the last refresh.
func (a *admission) hasCapacity(model string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.caps[model]
	return !ok || c.Requests > 0
}

// refresh sets every queue's capacity from the pool's workers now. Cost: one copy of the
// workers' status and one pass per model.
func (a *admission) refresh() {
	workers := a.pool.Workers()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, model := range a.pool.Models() {
		if _, ok := a.queues[model]; ok || a.closed {
			continue
		}
		if _, err := a.addQueueLocked(model, workers); err != nil {
			a.opts.Logger.Error("queue not created", "model", model, "err", err)
		}
	}
	for model, q := range a.queues {
		c := capacityOf(workers, model)
		if c != a.caps[model] {
			a.caps[model] = c
			q.SetCapacity(c)
		}
	}
}

// run refreshes capacities every interval until ctx ends.
func (a *admission) run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.refresh()
		}
	}
}

// close ends every queue: queued requests leave with a Shutdown rejection (503).
func (a *admission) close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	for _, q := range a.queues {
		q.Close()
	}
}

// capacityOf sums what model's healthy workers can take from this gateway: each worker's
// concurrency less the requests other replicas have on it as its /metrics last reported
// (WorkerStatus.OthersInFlight), but at least one, so that every replica keeps a slot on every
// healthy worker and a worker the others fill makes requests wait here, in order, instead of in
// the worker's own queue. Token budgets are not reduced: they bound what one request may hold,
// and a fleet-wide reading must not turn a request away as too large.
func capacityOf(workers []routing.WorkerStatus, model string) queue.Capacity {
	var c queue.Capacity
	for _, w := range workers {
		if w.State == routing.StateHealthy && slices.Contains(w.Models, model) {
			c.Requests += int(max(1, w.MaxConcurrency-w.OthersInFlight))
			c.Tokens += int(w.MaxTokensInFlight)
		}
	}
	return c
}

// ticketRequest is what admission decides for one request.
type ticketRequest struct {
	class    string
	deadline time.Time
}

// admit queues the request and waits until it may be sent now; it records the request's class
// in x. The caller must call Grant.Done exactly once when the request has ended.
func (s *Server) admit(c echo.Context, tier *tenants.Tier, req *inferenceRequest, promptTokens, maxOut int, x *exchange) (*queue.Grant, error) {
	h := c.Request().Header
	tr, err := s.classAndDeadline(tier, h, req.ServiceTier)
	if err != nil {
		return nil, err
	}
	x.class, _ = queue.ParseClass(tr.class)
	x.classed = true
	if !s.admission.hasCapacity(req.Model) {
		return nil, fmt.Errorf("model %q: %w", req.Model, routing.ErrNoWorker)
	}
	q, err := s.admission.queueFor(req.Model)
	if err != nil {
		return nil, err
	}
	ticket, err := q.Enqueue(queue.Request{
		Tenant:       principalOf(c).TenantID,
		Class:        x.class,
		Weight:       tier.Weight,
		PromptTokens: promptTokens,
		MaxTokens:    maxOut,
		Deadline:     tr.deadline,
		MaxQueued:    int(tier.MaxQueued),
	})
	if err != nil {
		return nil, err
	}
	grant, err := ticket.Wait(c.Request().Context())
	if err != nil {
		if c.Request().Context().Err() != nil {
			return nil, errClientGone
		}
		return nil, err
	}
	rh := c.Response().Header()
	rh.Set(headerClass, grant.Class.String())
	rh.Set(headerQueueMs, strconv.FormatInt(grant.Waited.Milliseconds(), 10))
	return grant, nil
}

// classAndDeadline resolves the request's class (the tier's default, lowered but never raised
// by X-Usher-Priority or OpenAI's service_tier) and its deadline (X-Usher-Deadline-Ms, else the
// tier's default for the class).
func (s *Server) classAndDeadline(tier *tenants.Tier, h http.Header, serviceTier string) (ticketRequest, error) {
	requested := ""
	switch serviceTier {
	case "flex":
		requested = tenants.ClassBatch
	case "priority":
		requested = tenants.ClassInteractive
	case "", "auto", "default":
	default:
		return ticketRequest{}, BadRequest("service_tier", "'service_tier' must be one of auto, default, flex, priority")
	}
	if p := h.Get(headerPriority); p != "" {
		if _, err := queue.ParseClass(p); err != nil {
			return ticketRequest{}, BadRequest("", "%s must be one of interactive, standard, batch", headerPriority)
		}
		requested = p
	}
	tr := ticketRequest{class: tier.Class(requested)}
	budget := tier.Deadline(tr.class)
	if v := h.Get(headerDeadlineMs); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > maxDeadline {
			return ticketRequest{}, BadRequest("", "%s must be a positive number of milliseconds up to %d", headerDeadlineMs, maxDeadline.Milliseconds())
		}
		budget = time.Duration(ms) * time.Millisecond
	}
	if budget > 0 {
		tr.deadline = s.now().Add(budget)
	}
	return tr, nil
}
