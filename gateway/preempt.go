package gateway

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptrace"
	"slices"
	"sync"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// Preemption, one of the protections of interactive traffic (docs/protection.md): an interactive
// call that finds no room at once takes the capacity of a standard or batch call whose answer has
// not begun to reach its client. The preempted call's attempt is cancelled (the engine's work on
// it so far is lost), its lease and grant go back, and it waits in the queue again, ahead of its
// tenant's later requests (Server.requeue). Server.Config.DisablePreemption turns it off.
//
// It follows each standard or batch attempt through the events the proxy reports on the
// attempt (see attempt): sent (preemptible from then), its first token (its engine is decoding,
// so a cancel stops it at the next token), its answer beginning to reach the client (no longer
// preemptible), its end.

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

// victim is one preemptible attempt.
type victim struct {
	cancel   context.CancelCauseFunc
	worker   *routing.Worker // where it runs
	tokens   int64           // what it counts in the worker's tokens in flight
	taken    bool            // chosen: its attempt is being cancelled
	decoding bool            // its engine is generating tokens: it notices a cancel at its next one
}

// add registers v, an attempt of model; done must be called when its answer begins or it ends.
func (p *preemption) add(model string, v *victim) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running == nil {
		p.running = map[string][]*victim{}
	}
	p.running[model] = append(p.running[model], v)
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

// maxPreempted bounds the attempts one interactive call may cancel: room one request's worth
// short on a worker (its share of the fleet's split lowered by one request, a long batch prompt in
// its tokens) takes one to three lower-class attempts; a worker further short (its learned limit
// halved) is overloaded, and cancelling more would lose their engine's work for one call.
const maxPreempted = 4

// preemptFor cancels, for an interactive call the queue could not release at once (no room on a
// worker it may use), the fewest preemptible attempts of model that make room for it on one
// worker, short as short says (Pool.Shortfalls): on each worker, the attempts whose engine is
// generating tokens first (they stop at their next token), newest first (they have cost their
// engine the least so far), until the requests and tokens they hold cover what the worker lacks;
// of the workers where at most maxPreempted do, the one that takes the fewest. An engine notices
// a cancel during prefill only when the prefill ends: llama.cpp takes half a second for a
// 500-token prompt on a CPU core. Cancelled calls give their leases and grants back and wait in
// the queue again, behind the interactive call. It cancels nothing where a worker has room
// already, or where none can be made so: room freed elsewhere would not take the call. It
// returns the worker where it cancelled some, for the call to hold (Worker.HoldForInteractive),
// or nil.
func (p *preemption) preemptFor(model string, short []routing.Shortfall) *routing.Worker {
	p.mu.Lock()
	list := p.running[model]
	var chosen []int
	var at *routing.Worker
	for _, s := range short {
		if s.Requests <= 0 && s.Tokens <= 0 {
			p.mu.Unlock()
			return nil
		}
		if c := cover(list, s); c != nil && (chosen == nil || len(c) < len(chosen)) {
			chosen, at = c, s.Worker
		}
	}
	victims := make([]*victim, len(chosen))
	for k, i := range chosen {
		victims[k] = list[i]
		list[i].taken = true
	}
	if len(victims) > 0 {
		p.running[model] = slices.DeleteFunc(list, func(v *victim) bool { return v.taken })
	}
	p.mu.Unlock()
	for _, v := range victims {
		v.cancel(errPreempted)
	}
	return at
}

// cover is the indexes in list of the attempts on s's worker whose end makes the room s lacks,
// in preemptFor's order of preference, at most maxPreempted of them; nil if they cannot.
func cover(list []*victim, s routing.Shortfall) []int {
	var out []int
	var requests, tokens int64
	fits := func() bool {
		return requests >= s.Requests && (tokens >= s.Tokens || requests >= s.InFlight)
	}
	for _, decoding := range []bool{true, false} {
		for i := len(list) - 1; i >= 0 && len(out) < maxPreempted && !fits(); i-- {
			if v := list[i]; v.worker == s.Worker && v.decoding == decoding {
				out = append(out, i)
				requests, tokens = requests+1, tokens+v.tokens
			}
		}
	}
	if !fits() {
		return nil
	}
	return out
}

// maxRoomCalls bounds the calls to the fleet one interactive call makes for room (callForRoom):
// a loan another replica made for it may be taken by another replica's interactive call first.
const maxRoomCalls = 3

// callForRoom, for an interactive call the queue could not release at once, that found no room
// in the fleet's interactive reserve and nothing of this replica's own to preempt on the workers
// of short (Server.shortfalls), calls the fleet's other replicas for room (routing.Pool.
// CallForRoom): one that can end a standard or batch attempt of its own on one of those workers
// lends the fleet's reserve that room and ends the attempt (lendForFleet), and tells of the
// loan, which the call then takes (TakeReserve; the queue places it once the pool tells of the
// change). It returns once the call took room, was released, or its client left, or after
// maxRoomCalls calls; without a fleet that carries calls it returns at once. The call then
// waits in the queue as before.
func (s *Server) callForRoom(ctx context.Context, cl *call, ticket *queue.Ticket, short []routing.Shortfall) {
	for range maxRoomCalls {
		lent := s.pool.LoanMade()
		if !s.pool.CallForRoom(ctx, cl.model, short) {
			return
		}
		select {
		case <-ticket.Ready():
			return
		case <-ctx.Done():
			return
		case <-lent:
			if s.pool.TakeReserve(ctx, &cl.route) {
				return
			}
		}
		short = s.shortfalls(cl)
	}
}

// lendForFleet answers another replica's call for room for an interactive call of model on one
// of workers (routing.Pool.WatchRoomCalls): where a standard or batch attempt of this replica's
// runs on one of them, preemptible as preemptFor would choose it (one whose engine is
// generating tokens first, on the first such worker in the call's order), it lends the fleet's
// interactive reserve of that worker one request (routing.Pool.LendReserve: the store lends for
// one call once, however many replicas hear it) and then ends that attempt, which waits in the
// queue again. An attempt that ended meanwhile left the room free already.
func (s *Server) lendForFleet(model string, workers []*routing.Worker) {
	w := s.preemption.victimOn(model, workers)
	if w == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), roomCallTimeout)
	defer cancel()
	if s.pool.LendReserve(ctx, w) {
		s.preemption.preemptOne(model, w)
	}
}

// roomCallTimeout bounds the round trips of one answer to a call for room.
const roomCallTimeout = time.Second

// victimOn is the first of workers where a preemptible attempt of model runs, preferring one
// whose engine is generating tokens (it stops at its next token); nil if none does.
func (p *preemption) victimOn(model string, workers []*routing.Worker) *routing.Worker {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.running[model]
	for _, decoding := range []bool{true, false} {
		for _, w := range workers {
			if slices.ContainsFunc(list, func(v *victim) bool { return v.worker == w && v.decoding == decoding }) {
				return w
			}
		}
	}
	return nil
}

// preemptOne cancels one preemptible attempt of model on w, in preemptFor's order of preference,
// and reports whether there was one.
func (p *preemption) preemptOne(model string, w *routing.Worker) bool {
	p.mu.Lock()
	list := p.running[model]
	chosen := cover(list, routing.Shortfall{Worker: w, Requests: 1, InFlight: 1})
	if len(chosen) == 0 {
		p.mu.Unlock()
		return false
	}
	v := list[chosen[0]]
	v.taken = true
	p.running[model] = slices.Delete(list, chosen[0], chosen[0]+1)
	p.mu.Unlock()
	v.cancel(errPreempted)
	return true
}

// watch registers an attempt of cl that cancel ends, if cl is preemptible: a standard or batch
// call, with preemption on. nil otherwise; the methods of a nil *watched do what an attempt
// nobody may preempt needs. The attempt's end must be reported (watched.ended).
func (s *Server) watch(cl *call, lease *routing.Lease, cancel context.CancelCauseFunc) *watched {
	if cl.class == queue.Interactive || s.cfg.DisablePreemption {
		return nil
	}
	a := &watched{p: &s.preemption, model: cl.model,
		v: victim{cancel: cancel, worker: lease.Worker, tokens: lease.Tokens()}}
	s.preemption.add(cl.model, &a.v)
	return a
}

// watched is one attempt preemption may cancel.
type watched struct {
	p     *preemption
	model string
	v     victim
}

// decoding reports the attempt's first token: its engine is generating tokens.
func (a *watched) decoding() {
	if a != nil {
		a.p.decoding(&a.v)
	}
}

// answering reports that the attempt's answer begins to reach the client: from now on it cannot
// be preempted. False when a preemption chose it already: its answer must not begin.
func (a *watched) answering() bool {
	return a == nil || a.p.done(a.model, &a.v)
}

// ended reports the attempt's end (safe after answering).
func (a *watched) ended() { a.answering() }

// attempt is one attempt of a call on its lease's worker, as the relays report its events: a
// line heard from the worker (the silence bound), the first token (the engine prefilled the
// prompt: the lease's prefill ends, and preemption knows it is decoding), the answer beginning
// to reach the client.
type attempt struct {
	lease   *routing.Lease
	quiet   silenceBound
	watched *watched // nil: not preemptible
	// trace learns whether the attempt went out on a reused connection (reused): a reused
	// connection the worker had closed is not the worker's fault.
	trace  httptrace.ClientTrace
	reused bool
	body   bytes.Reader // what the worker is sent
	gaps   streamGaps   // read and written by the goroutine that reads the answer only
	// now is the gateway's clock (Server.now), which the gaps are read on as the answer's
	// other times are. Required.
	now func() time.Time
}

// gotConn is the attempt's httptrace.ClientTrace.GotConn.
func (a *attempt) gotConn(info httptrace.GotConnInfo) { a.reused = info.Reused }

// heard reports bytes from the worker.
func (a *attempt) heard() {
	a.quiet.heard()
	a.gaps.heard(a.now())
	if a.lease != nil {
		a.lease.Heard()
	}
}

// firstToken reports the first event that carries the answer's data.
func (a *attempt) firstToken() {
	a.gaps.decoding = true
	a.lease.Prefilled()
	a.watched.decoding()
}

// answering reports that the answer begins to reach the client; false: the attempt was
// preempted and its answer must not begin.
func (a *attempt) answering() bool { return a.watched.answering() }
