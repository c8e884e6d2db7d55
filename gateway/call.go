package gateway

import (
	"context"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The data plane is one straight pipeline. A request to /v1/chat/completions, /v1/completions or
// /v1/embeddings becomes one call value and goes through four stages, each in its own file, in the order a
// request lives:
//
//	parse    (parse.go)    read the body once, decode it once into the call, build the body the
//	                       worker gets from exactly what was decoded
//	admit    (admit.go)    the model and the tier, the tenant's limits, the class and deadline,
//	                       then the model's queue, the one wait: the queue releases the request
//	                       once routing placed it on a worker (late binding, in the queue's order)
//	dispatch (dispatch.go) the queue per model and its placement; an attempt that failed or was
//	                       preempted goes back through the queue to be placed again
//	proxy    (proxy.go)    the upstream I/O and the SSE relay; an attempt that fails before the
//	                       worker answered is tried again; a long lower-class prompt may go
//	                       first in pieces (prefill.go)
//	settle   (settle.go)   the usage to the queue's fair share and the tenant's limits, metrics,
//	                       the access log, and the error answer when nothing was sent yet
//
// errors.go maps every error of every stage to what the client is told.

// call is one inference request on its way through the stages. The handler's goroutine owns it;
// each stage fills in what it decides. While it waits in the queue, the queue's placement (see
// placer) reads and writes route under the queue's lock, on whichever goroutine releases it.
type call struct {
	ep    endpoint
	start time.Time

	// parse
	body             *bodyHold // the body's bytes held in the body bound until the call ends
	model            string
	stream           bool
	clientWantsUsage bool   // stream_options.include_usage as the client sent it
	serviceTier      string // OpenAI's service_tier
	maxOutput        int    // the largest output limit the body sets; -1: none (boundOutput sets it)
	choices          int    // answers generated for each prompt: n, or best_of if larger
	prompts          int    // prompts: a completions batch's count, else 1
	prompt           string // the text the worker prefills, for routing
	messages         []byte // chat: the messages array as sent (JSON), for routing
	promptTokens     int    // its estimate, every prompt of a batch counted
	upstream         []byte // the body for the worker, without a handed-down priority
	modelSpan        [2]int // where the model's JSON string is in upstream, to give an alias

	// admit
	principal tenants.Principal // the caller, as authenticate resolved it
	tier      *tenants.Tier
	expected  int // output tokens the call may cost, all prompts and choices (boundOutput)
	class     queue.Class
	classed   bool // class is resolved: the request reached the queue
	deadline  time.Time
	hold      *tenants.Hold  // the tenant's limits held for this call; nil: none
	spend     *tenants.Spend // the call's reservation in its tenant's budgets, ended by settle; nil: none
	grant     *queue.Grant   // the queue's capacity held for this call
	placer    placer         // the call's Placer in its queue, kept here so that it costs no allocation
	queued    time.Duration  // time waited in the queue, preemptions included
	// askedTTFT and askedTPOT are the objectives the client's headers ask for (objective.go);
	// 0: none asked.
	askedTTFT, askedTPOT time.Duration
	// rejectMiss: the client asked to be refused rather than served past its TTFT objective
	// (objective_admit.go); objectiveDeadline: the queue deadline is that objective's slack.
	rejectMiss, objectiveDeadline bool

	// dispatch and proxy
	route  routing.Request // a two-staged call's prefill stage (disagg.go)
	lease  *routing.Lease  // the current attempt's, whose cache scope bounds what the client is told (cache_salt.go)
	worker string
	// behindLower: the current attempt was placed while its worker had a lower-class prompt in
	// prefill (routing.Lease.BehindLowerPrefill), a step the call may wait for at the engine.
	behindLower bool
	alias       *modelAlias // the worker calls the model by another name; nil: it does not
	attempts    int
	// suspects are the workers that answered an attempt with a server error (at most
	// server.max_attempts): counted against their circuit breakers only once another worker
	// serves the call (see confirmFailures).
	suspects []*routing.Worker
	// booked says closeBooks ran (pieces charged, objectives judged, usage recorded), and books
	// holds its verdicts.
	booked   bool
	books    verdicts
	preempts int // times an attempt was cancelled for an interactive call and requeued
	usage    usage
	ttft     time.Duration // time to the first byte sent to the client; 0 if none was
	atWorker time.Duration // time from sending to a worker to the end of its answer, all attempts
	// measured is the answering attempt's outcome at its worker (routing.Outcome: TTFT from
	// sending to the first event, Answered to the end), and predicted what that worker's cost
	// model predicted for it when the attempt was placed (predictedOK: it could say).
	measured    routing.Outcome
	predicted   routing.Prediction
	predictedOK bool

	// A call to a disaggregated model (disagg.go). protocol: it goes in two stages, route
	// placing its prefill and decodeRoute its decode, by this hand-off ("": whole); decode is
	// the decode stage's lease while the prefill runs. decoding: the decode stage runs, with
	// handoff, the members that tell the decode engine where the prompt's KV is (JSON members
	// without braces). prefillWorker is the worker that last prefilled it (prefilledOn, whose
	// cost model predicts the call's first token: see predictIdle), prefillCached the
	// cached tokens that worker reported (bounded by the call's scope), prefillTime the time of
	// its prefill stages. concurrent, while the decode stage runs beside its prefill (SGLang's
	// flow), is the prefill's end, which the decode's usage waits for; stageCtx ends when that
	// prefill failed (errPrefillFailed), and the decode attempt with it.
	// local: the attempt placed last serves the call whole on a decode worker, prefilled there
	// (routing.StageLocal), as any whole call: no prefill stage, no hand-off.
	protocol      routing.Protocol
	twoStage      bool
	local         bool
	decoding      bool
	decodeRoute   routing.Request
	decode        *routing.Lease
	handoff       []byte
	prefillWorker string
	prefilledOn   *routing.Worker
	prefillCached int
	prefillTime   time.Duration
	concurrent    *concurrentPrefill
	stageCtx      context.Context
	// decodeFirst and decodeRest are the last relayed decode attempt's time to its first event
	// beyond its prefill and from there to its end (see decodeParts); 0: not measured.
	decodeFirst, decodeRest time.Duration
	// The parts of a two-staged call's first token at its workers (see stagedFirstToken): the
	// answering prefill's time and its worker's prediction for it when placed, and what the
	// decode worker's hand-off model predicted for the decode when placed (routing's
	// PredictedHandoff); each OK says the model could say.
	prefillMeasured                        time.Duration
	prefillPredicted                       routing.Prediction
	handoffPredicted                       time.Duration
	prefillPredictedOK, handoffPredictedOK bool

	// pieces is how many leading pieces of the prompt the current attempt sent first (see
	// prefill.go); cachedBeforePieces what the engine held of the prompt before the first.
	pieces             int
	cachedBeforePieces int
	// piecesComputed sums, over every attempt, the prompt tokens the engine computed for the
	// pieces (each piece's prompt tokens less those it found cached): charged even when the
	// request itself is refused (chargePieces).
	piecesComputed int
}

func newCall(ep endpoint, start time.Time) *call {
	return &call{ep: ep, start: start, maxOutput: -1, choices: 1, prompts: 1}
}

// inference serves one OpenAI inference endpoint: the stages in order, then settle.
func (s *Server) inference(ep endpoint) authenticated {
	return func(c echo.Context, p tenants.Principal) error {
		cl := newCall(ep, s.now())
		cl.principal = p
		defer func() { cl.body.release() }() // parse sets cl.body
		err := s.parse(c, cl)
		if err == nil {
			err = s.admit(c, cl)
		}
		if err == nil {
			err = s.dispatch(c, cl)
		}
		return s.settle(c, cl, err)
	}
}
