package gateway

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
)

// SGLang's bootstrap flow (routing.ProtocolSGLang), as its model gateway drives it: the call
// goes at once to its prefill worker and to its decode worker, both with bootstrap_host and
// bootstrap_port (the prefill worker's KV bootstrap server, routing.Worker.Bootstrap) and
// bootstrap_room (a random number naming this hand-off); the prefill engine computes the
// prompt's KV and the decode engine fetches it from the room, then decodes. The prefill
// worker's answer is read and dropped (its usage tells what its cache held); the decode worker's
// is the client's, relayed as any other (proxy). The two run together because the engines meet
// in the room: a prefill that fails ends the decode waiting for it (errPrefillFailed), a decode
// that fails or ends early ends its prefill (errDecodeEnded), and the call is placed again, on
// another prefill worker when the prefill was the one that failed.

// Causes that end one stage of a concurrent pair because of the other.
var (
	errPrefillFailed = errors.New("the prefill of the call failed")
	errDecodeEnded   = errors.New("the decode of the call ended before its prefill")
)

// concurrentPrefill is a prefill sent beside its decode. Its goroutine writes the fields before it
// closes done; they are read after.
type concurrentPrefill struct {
	done   chan struct{}
	cached int   // the cached tokens its worker reported, bounded by the call's scope
	err    error // why it did not answer 2xx; nil: it did
	// failed: the worker failed (connect error, 5xx, 429, silence): the next placement excludes
	// it. status and refusal are a 4xx answer's, the engine refusing the request itself.
	failed  bool
	status  int
	refusal []byte
	took    time.Duration
	// predicted is its worker's cost model's prediction for it when placed (predictedOK: it
	// could say), for an answer that came.
	predicted   routing.Prediction
	predictedOK bool
	// suspect is the status of a server error its worker answered with, its lease released
	// as suspect (suspect.go); "" otherwise.
	suspect string
}

// bootstrapStages is twoStages for SGLang's flow.
func (s *Server) bootstrapStages(c echo.Context, cl *call) (retry bool, err error) {
	pre, dec := cl.lease, cl.decode
	cl.decode = nil
	clientCtx := c.Request().Context()
	w := pre.Worker
	cl.worker, cl.prefillWorker, cl.prefilledOn = w.ID(), w.ID(), w
	host, port := w.Bootstrap()
	members := fmt.Appendf(nil, `"bootstrap_host":%s,"bootstrap_port":%d,"bootstrap_room":%d`, jsonString(host), port, rand.Uint64()>>1)
	body := rebuilt(s.forWorker(cl, pre, cl.upstreamBody(w.PriorityHandoff(), w.EngineModel(cl.model))),
		[]string{"stream", "stream_options"}, append([]byte(`"stream":false,`), members...))
	pre.PrefillWhole(cl.promptTokens)
	stageCtx, stop := context.WithCancelCause(clientCtx)
	defer stop(nil)
	p := &concurrentPrefill{done: make(chan struct{})}
	// The prefill's goroutine reads only these, never the call, which the decode changes.
	sendAs, in := &call{ep: cl.ep, attempts: cl.attempts}, c.Request().Header
	go func() {
		defer close(p.done)
		s.sendConcurrentPrefill(stageCtx, sendAs, pre, body, in, p)
		if p.err != nil {
			stop(errPrefillFailed)
		}
	}()

	cl.handoff, cl.decoding, cl.concurrent, cl.stageCtx = members, true, p, stageCtx
	cl.worker = dec.Worker.ID()
	c.Response().Header()[headerPrefillWorker] = []string{w.ID()}
	sent := s.now()
	retry, err = s.proxy(c, cl, dec)
	if err != nil || retry {
		stop(errDecodeEnded)
	}
	<-p.done
	cl.handoff, cl.decoding, cl.concurrent, cl.stageCtx = nil, false, nil, nil
	cl.prefillTime += p.took
	if p.err == nil {
		cl.prefillMeasured, cl.prefillPredicted, cl.prefillPredictedOK = p.took, p.predicted, p.predictedOK
	}
	if !errors.Is(p.err, errDecodeEnded) && clientCtx.Err() == nil {
		s.metrics.stage(cl.model, routing.StagePrefill, w.ID(), stageResult(p.err, p.err != nil, p.status != 0), p.took)
	}
	prefillEnded := errors.Is(err, errPrefillFailed)
	if !prefillEnded {
		s.metrics.stage(cl.model, routing.StageDecode, dec.Worker.ID(), stageResult(err, retry, false), s.now().Sub(sent))
	}
	if p.failed && (retry || prefillEnded) {
		cl.exclude(w.ID())
	}
	switch {
	case clientCtx.Err() != nil && err != nil:
		return false, errClientGone
	case !prefillEnded:
		return retry, err
	case p.status != 0 && !c.Response().Committed:
		// The engine refused the request itself: so would any other, and the client is told.
		h := c.Response().Header()
		h["Content-Type"] = jsonContentType
		h[headerWorker], h[headerRoute] = []string{w.ID()}, []string{string(pre.Route)}
		s.firstByte(cl)
		c.Response().WriteHeader(p.status)
		if _, err := c.Response().Write(p.refusal); err != nil {
			return false, errClientGone
		}
		return false, nil
	}
	s.log.Warn("prefill attempt failed", "worker", w.ID(), "model", cl.model, "err", p.err)
	if p.suspect != "" {
		return cl.suspected(w, p.suspect)
	}
	return true, p.err
}

// stageEnded is why the other stage of a concurrent pair ended the call's current attempt; nil
// when it did not (or the call is not such a pair).
func (cl *call) stageEnded() error {
	if cl.stageCtx == nil || cl.stageCtx.Err() == nil {
		return nil
	}
	return context.Cause(cl.stageCtx)
}

// stageResult is the result label of a stage that ended with err: failed when it may be tried
// again (retry), refused when the engine refused the request itself (a 4xx), preempted,
// cancelled (the client left), else ok (its answer was relayed, whole or cut).
func stageResult(err error, retry, refused bool) string {
	switch {
	case refused:
		return "refused"
	case retry:
		return "failed"
	case errors.Is(err, errPreempted):
		return "preempted"
	case errors.Is(err, errClientGone):
		return "cancelled"
	}
	return "ok"
}

// sendConcurrentPrefill sends a prefill of SGLang's flow to its worker, reads its answer and
// releases its lease, and writes what came of it into p. It runs on its own goroutine and
// touches nothing the decode's goroutine uses: sendAs is a call of its own (endpoint and
// attempt), in the client's headers, only read.
func (s *Server) sendConcurrentPrefill(ctx context.Context, sendAs *call, lease *routing.Lease, body []byte, in http.Header, p *concurrentPrefill) {
	w := lease.Worker
	ctx, cancel := context.WithTimeoutCause(ctx, wholeAnswerSilence(s.cfg, 1), errWorkerSilent)
	defer cancel()
	at := &attempt{lease: lease, now: s.now}
	sent := s.now()
	defer func() { p.took = s.now().Sub(sent) }()
	failed := func(err error, workerFailed bool) {
		if cause := context.Cause(ctx); cause != nil && cause != errWorkerSilent {
			// Ended for the decode's sake or the client's: not the worker's doing.
			lease.Release(routing.Outcome{})
			p.err = cause
			return
		}
		if context.Cause(ctx) == errWorkerSilent {
			err, workerFailed = errWorkerSilent, true
		}
		lease.Release(routing.Outcome{Failed: workerFailed})
		p.err, p.failed = err, true
	}
	resp, err := s.send(ctx, w, sendAs, body, in, at)
	if err != nil {
		failed(err, !at.reused)
		return
	}
	defer resp.Body.Close()
	data, err := readUpTo(resp.Body, 4096, s.cfg.MaxResponseBytes)
	switch {
	case err != nil:
		failed(fmt.Errorf("%w: reading the prefill answer of worker %s: %v", errUpstreamAnswer, w.ID(), err), true)
	case resp.StatusCode == http.StatusTooManyRequests:
		failed(&workerBusyError{worker: w.ID(), retryAfter: retryAfterOf(resp.Header, s.now())}, false)
	case resp.StatusCode >= 500 && context.Cause(ctx) == nil:
		// The request's fault or the worker's: suspect.go; the decode's goroutine records it.
		lease.Release(routing.Outcome{Suspect: true})
		p.err, p.failed, p.suspect = fmt.Errorf("worker %s answered %s", w.ID(), resp.Status), true, resp.Status
	case resp.StatusCode >= 500:
		failed(fmt.Errorf("worker %s answered %s", w.ID(), resp.Status), true)
	case resp.StatusCode != http.StatusOK:
		lease.Release(routing.Outcome{})
		p.status, p.refusal = resp.StatusCode, data
		p.err = fmt.Errorf("prefill worker %s refused the request: %s", w.ID(), resp.Status)
	default:
		// Its one token came with its answer: the prefill worker's TTFT (see prefillStage).
		took := s.now().Sub(sent)
		out := routing.Outcome{Answered: took, TTFT: took}
		if u, ok := parseUsage(data); ok {
			out.PromptTokens, out.CachedTokens, out.CompletionTokens = u.PromptTokens, u.cachedTokens(), u.CompletionTokens
			out.CacheReported = u.PromptTokensDetails != nil
			if out.CacheReported {
				p.cached = lease.OwnCached(u.cachedTokens(), u.PromptTokens)
			}
		}
		lease.Release(out)
		p.predicted, p.predictedOK = lease.Predicted(out)
	}
}
