package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// dispatcher holds one queue per model and keeps each queue's capacity equal to what the model's
// workers can take now: it follows the pool's Changes (health, drain, learned limits, workers
// added or removed, other replicas' load), so there is one truth about capacity and no poll.
// Safe for concurrent use.
type dispatcher struct {
	cfg  queue.Config
	opts queue.Options
	pool *routing.Pool

	mu     sync.Mutex                // guards queues, caps and closed
	queues map[string]*queue.Queue   // by model
	caps   map[string]queue.Capacity // by model, as last set
	closed bool
}

func newDispatcher(cfg queue.Config, opts queue.Options, pool *routing.Pool) (*dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &dispatcher{cfg: cfg, opts: opts, pool: pool,
		queues: map[string]*queue.Queue{}, caps: map[string]queue.Capacity{}}
	d.refresh()
	return d, nil
}

// queueFor returns the model's queue, creating it on first use.
func (d *dispatcher) queueFor(model string) (*queue.Queue, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, &queue.Rejection{Reason: queue.Shutdown, RetryAfter: time.Second}
	}
	if q, ok := d.queues[model]; ok {
		return q, nil
	}
	return d.addQueueLocked(model, d.pool.Workers())
}

// addQueueLocked creates the queue of model with the capacity of workers. d.mu must be held.
func (d *dispatcher) addQueueLocked(model string, workers []routing.WorkerStatus) (*queue.Queue, error) {
	opts := d.opts
	opts.Model = model
	q, err := queue.New(d.cfg, opts)
	if err != nil {
		return nil, err
	}
	d.caps[model] = capacityOf(workers, model)
	q.SetCapacity(d.caps[model])
	d.queues[model] = q
	return q, nil
}

// hasCapacity reports whether the model's workers can take anything now.
func (d *dispatcher) hasCapacity(model string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.caps[model]
	return !ok || c.Requests > 0
}

// ready reports whether some model can be served now: what /readyz answers.
func (d *dispatcher) ready() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	for _, c := range d.caps {
		if c.Requests > 0 {
			return true
		}
	}
	return false
}

// refresh sets every queue's capacity from the pool's workers now, creating the queues of models
// that appeared. Cost: one copy of the workers' status and one pass per model.
func (d *dispatcher) refresh() {
	workers := d.pool.Workers()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, model := range d.pool.Models() {
		if _, ok := d.queues[model]; ok || d.closed {
			continue
		}
		if _, err := d.addQueueLocked(model, workers); err != nil {
			d.opts.Logger.Error("queue not created", "model", model, "err", err)
		}
	}
	for model, q := range d.queues {
		c := capacityOf(workers, model)
		if c != d.caps[model] {
			d.caps[model] = c
			q.SetCapacity(c)
		}
	}
}

// run follows the pool's changes until ctx ends. Its goroutine is the Server's (Run).
func (d *dispatcher) run(ctx context.Context) {
	for {
		changed := d.pool.Changes()
		d.refresh()
		select {
		case <-ctx.Done():
			return
		case <-changed:
		}
	}
}

// close ends every queue: queued requests leave with a Shutdown rejection (503).
func (d *dispatcher) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, q := range d.queues {
		q.Close()
	}
}

// capacityOf sums what model's healthy workers can take from this gateway: each worker's
// concurrency limit less the requests other replicas have on it as its /metrics last reported
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

// dispatch is the stage after the queue released the call: pick its worker now (late binding)
// and proxy to it, trying again while nothing reached the client and the worker did not answer
// (proxy says when), on another worker, or on the same one when the failure was not the worker's.
func (s *Server) dispatch(c echo.Context, cl *call) error {
	ctx := c.Request().Context()
	var lastErr error
	for cl.attempts < s.cfg.MaxAttempts {
		lease, err := s.pick(ctx, cl)
		if errors.Is(err, errPreempted) {
			if err := s.requeue(c, cl, ""); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			if lastErr != nil && errors.Is(err, routing.ErrNoWorker) {
				break
			}
			if errors.Is(err, routing.ErrUnknownWorker) {
				return fmt.Errorf("%s %q: %w", headerTarget, cl.route.TargetWorker, errUnknownTarget)
			}
			return err
		}
		cl.attempts++
		if cl.attempts > 1 {
			s.metrics.retries.WithLabelValues(cl.model).Inc()
		}
		cl.worker = lease.Worker.ID()
		retry, err := s.proxy(c, cl, lease)
		if errors.Is(err, errPreempted) {
			// Not an attempt that failed.
			cl.attempts--
			if err := s.requeue(c, cl, cl.worker); err != nil {
				return err
			}
			continue
		}
		if !retry {
			return err
		}
		lastErr = err
	}
	if busy := (*workerBusyError)(nil); errors.As(lastErr, &busy) {
		return &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "workers_busy",
			Message: "every worker that serves this model is busy; retry later", RetryAfter: busy.retryAfter}
	}
	return fmt.Errorf("%w after %d attempts: %v", errUpstream, cl.attempts, lastErr)
}

// requeue puts a preempted call back in the queue, ahead of its tenant's later requests, and
// waits for its release: it gave its capacity to a higher class, at worker (its attempt there
// was cancelled) or before it had one ("").
func (s *Server) requeue(c echo.Context, cl *call, worker string) error {
	cl.preempts++
	stage := "sent"
	if worker == "" {
		stage = "waiting"
	}
	s.metrics.preempted.WithLabelValues(cl.model, cl.class.String(), stage).Inc()
	s.log.Info("preempted", "id", c.Response().Header().Get(echo.HeaderXRequestID),
		"tenant", cl.principal.TenantID, "model", cl.model, "class", cl.class.String(), "worker", worker)
	if err := s.await(c, cl, cl.grant.Requeue()); err != nil {
		cl.grant = nil
		return err
	}
	return nil
}

// pick chooses the call's worker. When the queue released the call but none of the workers it
// may use has room this instant (its target or pinned worker is full, an earlier attempt's
// worker is excluded and the others are full, or the room the queue counted over the whole pool
// is split between workers none of which holds the call's tokens), it waits for a slot to free
// or the pool to change rather than failing: until the call's deadline (then 504) or the client
// leaves; an interactive call first has a standard or batch attempt preempted (see preemption),
// as when it finds no room in the queue. It fails at once only when no worker it may use takes
// requests at all.
//
// A standard or batch call that waits here holds capacity the queue counted for it without
// using it yet, so it is the first a waiting interactive call preempts: it then returns
// errPreempted, and no engine work is lost.
func (s *Server) pick(ctx context.Context, cl *call) (*routing.Lease, error) {
	var timeout <-chan time.Time
	var released, changed <-chan struct{}
	var preempted <-chan struct{}
	for {
		lease, err := s.pool.Pick(ctx, &cl.route)
		if err == nil || !errors.Is(err, routing.ErrNoWorker) || !s.pool.CouldWait(&cl.route) {
			return lease, err
		}
		if released == nil {
			// Watching costs every release a broadcast, so only a call that waits watches; a
			// slot freed between the Pick above and now is caught by the Pick after.
			released, changed = s.pool.Released(), s.pool.Changes()
			switch {
			case cl.class == queue.Interactive && !s.cfg.DisablePreemption:
				s.preemption.preemptOne(cl.model, true)
			case cl.class != queue.Interactive && !s.cfg.DisablePreemption:
				wait, cancel := context.WithCancelCause(ctx)
				defer cancel(nil)
				v := s.preemption.addWaiting(cl.model, cancel)
				defer s.preemption.done(cl.model, v)
				preempted = wait.Done()
			}
			continue
		}
		if timeout == nil && !cl.deadline.IsZero() {
			t := time.NewTimer(cl.deadline.Sub(s.now()))
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-released:
		case <-changed:
		case <-preempted:
			if ctx.Err() == nil {
				return nil, errPreempted
			}
			return nil, errClientGone
		case <-timeout:
			return nil, queue.ErrDeadlineExceeded
		case <-ctx.Done():
			return nil, errClientGone
		}
		released, changed = s.pool.Released(), s.pool.Changes()
	}
}

// errPreempted is the cause of a lower-class call's attempt cancelled so that a waiting
// interactive call can have its capacity.
var errPreempted = errors.New("preempted for a higher-class request")

// preemption keeps, per model, the attempts of standard and batch calls whose answer has not begun
// to reach their client, in the order they started: the calls a waiting interactive call may
// take capacity from. Cancelling one loses only the engine's work on it so far; the call waits in
// the queue again and is sent anew. Safe for concurrent use.
type preemption struct {
	mu      sync.Mutex // guards running and every victim's taken
	running map[string][]*victim
}

// victim is one preemptible attempt, or a call waiting for a worker.
type victim struct {
	cancel   context.CancelCauseFunc
	taken    bool // chosen: its attempt is being cancelled
	decoding bool // its engine is generating tokens: it notices a cancel at its next one
	waiting  bool // not sent yet: it holds capacity and no engine has done any work for it
}

// add registers an attempt of model; done must be called when its answer begins or it ends.
func (p *preemption) add(model string, cancel context.CancelCauseFunc) *victim {
	return p.register(model, &victim{cancel: cancel})
}

// addWaiting registers a call of model that waits for a worker; done must be called when it
// stops waiting.
func (p *preemption) addWaiting(model string, cancel context.CancelCauseFunc) *victim {
	return p.register(model, &victim{cancel: cancel, waiting: true})
}

func (p *preemption) register(model string, v *victim) *victim {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running == nil {
		p.running = map[string][]*victim{}
	}
	p.running[model] = append(p.running[model], v)
	return v
}

// done takes v off the list; it reports false if v was already chosen for preemption.
func (p *preemption) done(model string, v *victim) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if v.taken {
		return false
	}
	list := p.running[model]
	if i := slices.Index(list, v); i >= 0 {
		p.running[model] = slices.Delete(list, i, i+1)
	}
	return true
}

// decoding marks v's engine as generating its tokens (the first chunk of a stream came).
func (p *preemption) decoding(v *victim) {
	p.mu.Lock()
	v.decoding = true
	p.mu.Unlock()
}

// preemptOne cancels a preemptible call of model, if there is one, for an interactive call that
// lacks capacity in the queue (forRoom false) or room on a worker (forRoom true). The first
// choice is the newest call waiting for a worker, which costs nothing, but holds only queue
// capacity, so not for room. Then the newest attempt whose engine is generating tokens, which
// stops at its next token; else the newest attempt (the one that has cost the engine the least
// so far). An engine notices a cancel during prefill only when the prefill ends: llama.cpp takes
// half a second for a 500-token prompt on a CPU core.
func (p *preemption) preemptOne(model string, forRoom bool) bool {
	p.mu.Lock()
	list := p.running[model]
	i := -1
	if !forRoom {
		i = newest(list, func(v *victim) bool { return v.waiting })
	}
	if i < 0 {
		i = newest(list, func(v *victim) bool { return v.decoding })
	}
	if i < 0 {
		i = newest(list, func(v *victim) bool { return !v.waiting })
	}
	if i < 0 {
		p.mu.Unlock()
		return false
	}
	v := list[i]
	p.running[model] = slices.Delete(list, i, i+1)
	v.taken = true
	p.mu.Unlock()
	v.cancel(errPreempted)
	return true
}

// newest is the index of the last victim of list that is, or -1.
func newest(list []*victim, is func(*victim) bool) int {
	for i := len(list) - 1; i >= 0; i-- {
		if is(list[i]) {
			return i
		}
	}
	return -1
}
