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

// dispatcher holds one queue per model, the one place a call waits: the queue releases a call
// only once routing has placed it on a worker (see placer), so the queue's order is the order
// of service. It keeps each queue's capacity equal to what the model's workers can take now and
// has the queue place its calls again whenever room may have appeared: it follows the pool's
// Changes (health, drain, learned limits, workers added or removed, other replicas' load) and is
// told of each slot freed on a worker (Pool.OnRoom), so there is one truth about capacity and no
// poll. Safe for concurrent use.
type dispatcher struct {
	cfg  queue.Config
	opts queue.Options
	pool *routing.Pool

	mu     sync.Mutex                // guards queues, caps, shared and closed
	queues map[string]*queue.Queue   // by model
	caps   map[string]queue.Capacity // by model, as last set
	// shared says, by model, that caps holds this replica's shares of a fleet's split of the
	// model's healthy workers, which may all be 0 for a moment (see capacityOf).
	shared map[string]bool
	closed bool
}

func newDispatcher(cfg queue.Config, opts queue.Options, pool *routing.Pool) (*dispatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d := &dispatcher{cfg: cfg, opts: opts, pool: pool,
		queues: map[string]*queue.Queue{}, caps: map[string]queue.Capacity{}, shared: map[string]bool{}}
	d.refresh()
	pool.OnRoom(d.room)
	return d, nil
}

// room has the model's queue place its calls again: a slot freed on one of its workers.
func (d *dispatcher) room(model string) {
	d.mu.Lock()
	q := d.queues[model]
	d.mu.Unlock()
	if q != nil {
		q.Retry()
	}
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
	d.caps[model], d.shared[model] = capacityOf(workers, model, d.disaggregated(model))
	q.SetReserveOutside(d.shared[model] && d.pool.FleetReserve())
	q.SetCapacity(d.caps[model])
	d.queues[model] = q
	return q, nil
}

// hasCapacity reports whether the model's workers can take anything now: with a fleet's split
// of the workers (see capacityOf), whether any may, whatever this replica's share is now.
func (d *dispatcher) hasCapacity(model string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, ok := d.caps[model]
	return !ok || c.Requests > 0 || d.shared[model]
}

// ready reports whether some model can be served now: what /readyz answers.
func (d *dispatcher) ready() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return false
	}
	for model, c := range d.caps {
		if c.Requests > 0 || d.shared[model] {
			return true
		}
	}
	return false
}

// refresh sets every queue's capacity from the pool's workers now, creating the queues of models
// that appeared, and has each queue place its calls again (a change may give room on a worker
// without changing the sum, such as a circuit closing). Cost: one copy of the workers' status
// and one pass per model.
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
		c, shared := capacityOf(workers, model, d.disaggregated(model))
		d.shared[model] = shared
		// The fleet keeps the interactive reserve of the workers it splits (their shares
		// exclude it), the queue none of its own.
		q.SetReserveOutside(shared && d.pool.FleetReserve())
		if c != d.caps[model] {
			d.caps[model] = c
			q.SetCapacity(c)
		} else {
			q.Retry()
		}
	}
}

// run follows the pool's changes and, with a fleet, shares the queues' fair share (shareFairness)
// and the workers' limits (shareWorkers), whose goroutines it starts and waits for, until ctx
// ends. Its goroutine is the Server's (Run).
func (d *dispatcher) run(ctx context.Context) {
	var sharing sync.WaitGroup
	defer sharing.Wait()
	if d.opts.FairShare != nil {
		sharing.Go(func() { d.shareFairness(ctx) })
	}
	if d.pool.SharesWorkers() {
		sharing.Go(func() { d.shareWorkers(ctx) })
	}
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

// disaggregated reports whether model is served disaggregated now.
func (d *dispatcher) disaggregated(model string) bool {
	_, ok := d.pool.Disaggregated(model)
	return ok
}

// capacityOf sums what model's healthy workers can take from this gateway, and says whether some
// are split among the fleet's replicas. For a model served disaggregated (disaggregated) it sums
// its workers of role decode and both only: a call holds its decode worker for its whole answer and
// its prefill worker only for its prefill, so the decode pool bounds the calls in flight, and a
// full prefill pool makes the placement wait (routing.ErrNoRoom). A worker split by the fleet
// (WorkerStatus.Shared) counts this replica's share of it, which may be 0 while other replicas need
// the worker more (requests then wait here, in order, for the next exchange to give room), and the
// room it holds of the fleet's interactive reserve, which routing gives interactive requests only;
// or its requests in flight there when more (a share lowered under them), so that they do not hide
// another worker's room from the queue: the placer tests each worker's own. Any other counts its
// concurrency limit less the requests other replicas have on it as its /metrics last reported
// (WorkerStatus.OthersInFlight), but at least one, so that every replica keeps a slot on every
// healthy worker and a worker the others fill makes requests wait here, in order, instead of in
// the worker's own queue. Token budgets are not reduced: they bound what one request may hold, and
// a fleet-wide reading must not turn a request away as too large.
func capacityOf(workers []routing.WorkerStatus, model string, disaggregated bool) (c queue.Capacity, shared bool) {
	for _, w := range workers {
		if disaggregated && w.Role == routing.RolePrefill {
			continue
		}
		if w.State == routing.StateHealthy && slices.Contains(w.Models, model) {
			if w.Shared {
				c.Requests += int(max(w.Share+w.Reserve, w.InFlight))
				shared = true
			} else {
				c.Requests += int(max(1, w.MaxConcurrency-w.OthersInFlight))
			}
			c.Tokens += int(w.MaxTokensInFlight)
		}
	}
	return c, shared
}

// placer is a call's Placer in its model's queue: routing picks the call's worker (late binding)
// at the moment the queue would release the call, so the call leaves the queue with its lease.
// A two-staged call's (decode not nil) is placed on a worker of each stage at once.
type placer struct {
	ctx    context.Context // the client's
	pool   *routing.Pool
	route  *routing.Request
	decode *routing.Request
}

// prepare does the routing policies' I/O for the call's placements (routing.Pool.Prepare).
func (s *Server) prepare(c echo.Context, cl *call) {
	s.pool.Prepare(c.Request().Context(), &cl.route)
	if cl.twoStage {
		s.pool.Prepare(c.Request().Context(), &cl.decodeRoute)
	}
}

// Place picks the call's worker. It finds no room (queue.ErrNoRoom) while every worker the call
// may use is full, so the call waits in the queue, in its order, until one has room, its
// deadline passes (504) or the client leaves; it fails for good when no worker it may use takes
// requests (503) or its target worker does not exist (400).
func (p placer) Place(waiting int) (queue.Placement, error) {
	var lease, decode *routing.Lease
	var err error
	p.route.Waiting = waiting
	if p.decode != nil {
		p.decode.Waiting = waiting
		lease, decode, err = p.pool.PickStages(p.ctx, p.route, p.decode)
	} else {
		lease, err = p.pool.Pick(p.ctx, p.route)
	}
	switch {
	case err == nil:
		return placement{lease, decode}, nil
	case errors.Is(err, routing.ErrNoRoom):
		return nil, fmt.Errorf("%w: %w", queue.ErrNoRoom, err)
	case errors.Is(err, routing.ErrUnknownWorker):
		return nil, fmt.Errorf("%s %q: %w", headerTarget, p.route.TargetWorker, errUnknownTarget)
	}
	return nil, err
}

// placement is a call's lease, as the queue hands it over with the grant, and a two-staged
// call's decode lease (nil for others).
type placement struct {
	*routing.Lease
	decode *routing.Lease
}

// Undo releases the leases unused: the client left as the call was released.
func (p placement) Undo() {
	p.Release(routing.Outcome{})
	if p.decode != nil {
		p.decode.Release(routing.Outcome{})
	}
}

// dispatch is the stage after the queue released the call on its worker (cl.lease): proxy to it,
// and while nothing reached the client and the worker did not answer (proxy says when), place
// the call again through the queue, on another worker or on the same one when the failure was
// not the worker's. A call preempted for an interactive one waits in the queue again too.
func (s *Server) dispatch(c echo.Context, cl *call) error {
	var lastErr error
	for {
		cl.attempts++
		if cl.attempts > 1 {
			s.metrics.retries.WithLabelValues(cl.model).Inc()
		}
		cl.worker, cl.behindLower = cl.lease.Worker.ID(), cl.lease.BehindLowerPrefill()
		var retry bool
		var err error
		if cl.twoStage {
			retry, err = s.twoStages(c, cl)
		} else {
			retry, err = s.proxy(c, cl, cl.lease)
		}
		switch {
		case errors.Is(err, errPreempted):
			// Not an attempt that failed.
			cl.attempts--
			err = s.requeue(c, cl, cl.worker)
		case !retry:
			if err == nil && c.Response().Status < http.StatusBadRequest {
				s.confirmFailures(cl)
			}
			return err
		case cl.attempts >= s.cfg.MaxAttempts:
			return s.attemptsFailed(cl, err)
		default:
			lastErr = err
			// Prepared again with the failed worker excluded: a pin to it moves now, before
			// the call waits, not under the queue's lock.
			s.prepare(c, cl)
			err = s.await(c, cl, cl.grant.Requeue())
			if err != nil {
				cl.grant = nil
			}
			if errors.Is(err, routing.ErrNoWorker) {
				// No other worker may take it.
				return s.attemptsFailed(cl, lastErr)
			}
		}
		if err != nil {
			return err
		}
	}
}

// attemptsFailed is the error of a call whose last attempt failed with err and that is not tried
// again.
func (s *Server) attemptsFailed(cl *call, err error) error {
	if busy := (*workerBusyError)(nil); errors.As(err, &busy) {
		return &APIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "workers_busy",
			Message: "every worker that serves this model is busy; retry later", RetryAfter: busy.retryAfter}
	}
	return fmt.Errorf("%w after %d attempts: %v", errUpstream, cl.attempts, err)
}

// requeue puts a call preempted at worker back in the queue, ahead of its tenant's later
// requests, and waits for its release: it gave its capacity to a higher class.
func (s *Server) requeue(c echo.Context, cl *call, worker string) error {
	cl.preempts++
	s.metrics.preempted.WithLabelValues(cl.model, cl.class.String(), "sent").Inc()
	s.log.Info("preempted", "id", headerValue(c.Response().Header(), headerRequestID),
		"tenant", cl.principal.TenantID, "model", cl.model, "class", cl.class.String(), "worker", worker)
	if err := s.await(c, cl, cl.grant.Requeue()); err != nil {
		cl.grant = nil
		return err
	}
	return nil
}
