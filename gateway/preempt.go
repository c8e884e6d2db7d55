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
	taken    bool // chosen: its attempt is being cancelled
	decoding bool // its engine is generating tokens: it notices a cancel at its next one
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

// preemptOne cancels a preemptible attempt of model, if there is one, for an interactive call
// the queue could not release at once (no capacity, or no room on a worker it may use): the
// newest attempt whose engine is generating tokens, which stops at its next token; else the
// newest attempt (the one that has cost the engine the least so far). An engine notices a cancel
// during prefill only when the prefill ends: llama.cpp takes half a second for a 500-token
// prompt on a CPU core. The cancelled call gives its lease and grant back and waits in the queue
// again, behind the interactive call.
func (p *preemption) preemptOne(model string) bool {
	p.mu.Lock()
	list := p.running[model]
	i := newest(list, func(v *victim) bool { return v.decoding })
	if i < 0 {
		i = len(list) - 1
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

// watch registers an attempt of cl that cancel ends, if cl is preemptible: a standard or batch
// call, with preemption on. nil otherwise; the methods of a nil *watched do what an attempt
// nobody may preempt needs. The attempt's end must be reported (watched.ended).
func (s *Server) watch(cl *call, cancel context.CancelCauseFunc) *watched {
	if cl.class == queue.Interactive || s.cfg.DisablePreemption {
		return nil
	}
	a := &watched{p: &s.preemption, model: cl.model, v: victim{cancel: cancel}}
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
}

// streamGaps measures an answer's longest gap (routing.Outcome.LongestGap): the longest time
// between two hearings of the worker after its first event. The zero value is ready.
type streamGaps struct {
	last, longest time.Duration // the last hearing's time, the longest gap so far
	decoding      bool          // the first event came
}

// heard records a hearing at at (time since a fixed start, non-decreasing).
func (g *streamGaps) heard(at time.Duration) {
	if g.decoding {
		g.longest = max(g.longest, at-g.last)
	}
	g.last = at
}

// gotConn is the attempt's httptrace.ClientTrace.GotConn.
func (a *attempt) gotConn(info httptrace.GotConnInfo) { a.reused = info.Reused }

// heard reports bytes from the worker.
func (a *attempt) heard() { a.gaps.heard(a.quiet.heard()) }

// firstToken reports the first event that carries the answer's data.
func (a *attempt) firstToken() {
	a.gaps.decoding = true
	a.lease.Prefilled()
	a.watched.decoding()
}

// answering reports that the answer begins to reach the client; false: the attempt was
// preempted and its answer must not begin.
func (a *attempt) answering() bool { return a.watched.answering() }
