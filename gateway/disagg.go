package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
)

// A call to a disaggregated model (routing.Pool.Disaggregated) is served in two stages. With
// SGLang's bootstrap flow both go at once (bootstrap.go); with vLLM's KV-connector flow, as its
// toy_proxy_server.py drives it, the prefill stage sends the request
// to a prefill worker with kv_transfer_params {"do_remote_decode": true}, max_tokens 1 and no
// stream, and reads the kv_transfer_params of its answer (where the decode worker pulls the
// prompt's KV from); the decode stage sends the request as the client sent it, with those
// params, to a decode worker, and relays its answer as any other (proxy). The call waits in its
// queue once: the queue releases it with a lease on a worker of each stage (PickStages), so it
// never waits between its stages. A prefill that fails before answering goes to another prefill
// worker, and a decode that fails before its first byte goes back to the queue for a new pair,
// prefill again included (the engines hold the KV for one pull only), within
// Config.MaxAttempts; the client's cancellation ends whichever stage runs. Usage is the decode
// answer's (the prompt counted once), its cached tokens those the prefill worker found in its
// own cache: a decode engine counts the KV it pulled as cached.

// headerPrefillWorker names the worker that prefilled a disaggregated call.
const headerPrefillWorker = "X-Usher-Prefill-Worker"

// maxTransferParams bounds the kv_transfer_params of a prefill worker's answer that usher hands
// to the decode worker: NixlConnector's name a block per 16 tokens of the prompt.
const maxTransferParams = 1 << 20

// errNoTransfer is the cause of a prefill answer without kv_transfer_params: the worker has no
// KV connector, or not as a producer.
var errNoTransfer = errors.New("the prefill worker's answer has no kv_transfer_params (is its engine started with a KV connector?)")

// prefillTransferParams is what the prefill worker is sent: vLLM's toy proxy's, the fields it
// sets to null included.
var prefillTransferParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// planStages makes the call two-staged when its model is served disaggregated and the call is
// one answer to one prompt (a batch of prompts, n or best_of above 1, embeddings go whole, to a
// worker of role both): cl.route places its prefill, cl.decodeRoute its decode.
func (s *Server) planStages(cl *call) {
	proto, ok := s.pool.Disaggregated(cl.model)
	if !ok || cl.ep.embed || cl.prompts != 1 || cl.choices != 1 {
		return
	}
	cl.twoStage, cl.protocol = true, proto
	cl.decodeRoute = cl.route
	cl.decodeRoute.Stage = routing.StageDecode
	cl.route.Stage = routing.StagePrefill
	// The prefill holds its prompt and one output token.
	cl.route.Tokens = addTokens(cl.promptTokens, 1)
}

// staged reports whether the call was served in two stages: planned so (planStages), and not
// served whole on a decode worker instead (local).
func (cl *call) staged() bool { return cl.twoStage && !cl.local }

// exclude keeps worker out of the next placement of the stage the call is in (a call served
// locally is in its decode stage's pool).
func (cl *call) exclude(worker string) {
	if cl.decoding || cl.local {
		cl.decodeRoute.Exclude = append(cl.decodeRoute.Exclude, worker)
		return
	}
	cl.route.Exclude = append(cl.route.Exclude, worker)
}

// twoStages is proxy for a two-staged call: the prefill on cl.lease, then the decode on
// cl.decode, or the whole call on cl.lease when the pool placed it on a decode worker (local);
// retry as proxy's.
func (s *Server) twoStages(c echo.Context, cl *call) (retry bool, err error) {
	if cl.local {
		// Served whole where it is decoded (routing's StageLocal): nothing to hand off, and no
		// prefill worker of an earlier attempt named.
		cl.prefillWorker, cl.prefilledOn = "", nil
		c.Response().Header().Del(headerPrefillWorker)
		return s.proxy(c, cl, cl.lease)
	}
	if cl.protocol == routing.ProtocolSGLang {
		return s.bootstrapStages(c, cl)
	}
	pre, dec := cl.lease, cl.decode
	cl.decode = nil
	params, retry, err := s.prefillStage(c, cl, pre)
	if err != nil || params == nil {
		// Never sent: the slot goes back to whoever waits for it.
		dec.Release(routing.Outcome{})
		return retry, err
	}
	cl.handoff, cl.decoding = append([]byte(`"kv_transfer_params":`), params...), true
	defer func() { cl.handoff, cl.decoding = nil, false }()
	cl.worker = dec.Worker.ID()
	c.Response().Header()[headerPrefillWorker] = []string{cl.prefillWorker}
	sent := s.now()
	retry, err = s.proxy(c, cl, dec)
	s.metrics.stage(cl.model, routing.StageDecode, dec.Worker.ID(), stageResult(err, retry, false), s.now().Sub(sent))
	return retry, err
}

// prefillStage sends the call's prefill to its prefill worker and returns the kv_transfer_params
// of its answer. retry: it failed before the worker answered, and another prefill worker may
// take it (this one is excluded). An answer other than 2xx or 5xx (a 4xx: the engine refused
// the request) is the call's answer: it is relayed to the client, and params is nil.
func (s *Server) prefillStage(c echo.Context, cl *call, lease *routing.Lease) (params []byte, retry bool, err error) {
	clientCtx := c.Request().Context()
	w := lease.Worker
	cl.worker, cl.prefillWorker, cl.prefilledOn = w.ID(), w.ID(), w
	body := prefillBody(s.forWorker(cl, lease, cl.upstreamBody(w.PriorityHandoff(), w.EngineModel(cl.model))))
	// The prompt goes whole: no pieces in the prefill stage.
	lease.PrefillWhole(cl.promptTokens)
	if lease.YieldsPrefill() {
		_ = lease.AwaitInteractive(clientCtx)
	}
	ctx, cancel := context.WithTimeoutCause(clientCtx, wholeAnswerSilence(s.cfg, 1), errWorkerSilent)
	defer cancel()
	at := &attempt{lease: lease, now: s.now}
	sent := s.now()
	fail := func(out routing.Outcome, err error) ([]byte, bool, error) {
		if clientCtx.Err() != nil {
			// Not the worker's failure.
			lease.Release(routing.Outcome{})
			return nil, false, errClientGone
		}
		lease.Release(out)
		s.metrics.stage(cl.model, routing.StagePrefill, w.ID(), "failed", s.now().Sub(sent))
		s.log.Warn("prefill attempt failed", "worker", w.ID(), "model", cl.model, "err", err)
		if out.Failed || errors.As(err, new(*workerBusyError)) {
			cl.exclude(w.ID())
		}
		return nil, true, err
	}
	resp, err := s.send(ctx, w, cl, body, c.Request().Header, at)
	if err != nil {
		if context.Cause(ctx) == errWorkerSilent {
			err = errWorkerSilent
		}
		return fail(routing.Outcome{Failed: !at.reused || errors.Is(err, errWorkerSilent)}, err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return fail(routing.Outcome{}, &workerBusyError{worker: w.ID(), retryAfter: retryAfterOf(resp.Header, s.now())})
	case resp.StatusCode >= 500:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		if clientCtx.Err() != nil {
			return fail(routing.Outcome{}, errClientGone)
		}
		// The request's fault or the worker's: suspect.go.
		s.metrics.stage(cl.model, routing.StagePrefill, w.ID(), "failed", s.now().Sub(sent))
		retry, err := s.suspectAnswer(cl, lease, resp.Status)
		return nil, retry, err
	case resp.StatusCode != http.StatusOK:
		// The engine refused the request itself: so would any other, and the client is told.
		h := c.Response().Header()
		h[headerWorker], h[headerRoute] = []string{w.ID()}, []string{string(lease.Route)}
		out, err := s.relayAnswer(c, cl, resp, at)
		lease.Release(out)
		s.metrics.stage(cl.model, routing.StagePrefill, w.ID(), "refused", s.now().Sub(sent))
		return nil, false, err
	}
	data, err := readUpTo(resp.Body, 4096, s.cfg.MaxResponseBytes)
	if err != nil {
		if context.Cause(ctx) == errWorkerSilent {
			err = errWorkerSilent
		}
		return fail(routing.Outcome{Failed: true}, fmt.Errorf("%w: reading the prefill answer of worker %s: %v", errUpstreamAnswer, w.ID(), err))
	}
	params, err = transferParams(data)
	if err != nil {
		return fail(routing.Outcome{Failed: true}, fmt.Errorf("%w: worker %s: %v", errUpstreamAnswer, w.ID(), err))
	}
	// The prefill's one token came with its answer: its time is the prefill worker's TTFT, which
	// its cost model and learned limit learn from (and predictIdle predicts the call's by).
	took := s.now().Sub(sent)
	out := routing.Outcome{Answered: took, TTFT: took}
	cl.prefillCached = 0
	if u, ok := parseUsage(data); ok {
		out.PromptTokens, out.CachedTokens, out.CompletionTokens = u.PromptTokens, u.cachedTokens(), u.CompletionTokens
		out.CacheReported = u.PromptTokensDetails != nil
		if out.CacheReported {
			cl.prefillCached = lease.OwnCached(u.cachedTokens(), u.PromptTokens)
		}
	}
	lease.Release(out)
	cl.prefillTime += out.Answered
	cl.prefillMeasured = took
	cl.prefillPredicted, cl.prefillPredictedOK = lease.Predicted(out)
	s.metrics.stage(cl.model, routing.StagePrefill, w.ID(), "ok", out.Answered)
	return params, false, nil
}

// prefillBody is body, the call's body for its prefill worker, as the prefill stage of vLLM's
// flow sends it: without the members that ask for a stream or bound the output, and with
// max_tokens 1, no stream and kv_transfer_params asking the engine to hold the prompt's KV for a
// remote decode.
func prefillBody(body []byte) []byte {
	return rebuilt(body, []string{"stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict", "kv_transfer_params"},
		append([]byte(`"stream":false,"max_tokens":1,"kv_transfer_params":`), prefillTransferParams...))
}

// rebuilt is body, a JSON object, without its members drop and with members (JSON members
// without braces) at its end; body as it is when it cannot be read.
func rebuilt(body []byte, drop []string, members []byte) []byte {
	fields, err := objectFields(body, nil)
	if err != nil {
		return body
	}
	out := make([]byte, 0, len(body)+len(members)+2)
	out = append(out, '{')
	for _, f := range fields {
		if slices.Contains(drop, f.key) {
			continue
		}
		out = append(append(append(out, f.rawKey...), ':'), f.value...)
		out = append(out, ',')
	}
	out = append(out, members...)
	return append(out, '}')
}

// transferParams is the kv_transfer_params object of a prefill worker's whole answer, as its
// bytes.
func transferParams(answer []byte) ([]byte, error) {
	if !validJSON(answer) {
		return nil, errors.New("the prefill answer is not JSON")
	}
	fields, err := objectFields(answer, nil)
	if err != nil {
		return nil, fmt.Errorf("the prefill answer is not a JSON object: %v", err)
	}
	for _, f := range fields {
		if f.key != "kv_transfer_params" {
			continue
		}
		if len(f.value) == 0 || f.value[0] != '{' {
			break
		}
		if len(f.value) > maxTransferParams {
			return nil, fmt.Errorf("its kv_transfer_params exceed %d bytes", maxTransferParams)
		}
		var probe map[string]json.RawMessage
		if json.Unmarshal(f.value, &probe) != nil || len(probe) == 0 {
			break
		}
		return f.value, nil
	}
	return nil, errNoTransfer
}

// withMembers is b, a JSON object, with members (JSON members without braces) added at its end.
func withMembers(b, members []byte) []byte {
	end := bytes.LastIndexByte(b, '}')
	out := make([]byte, 0, len(b)+len(members)+1)
	out = append(out, b[:end]...)
	if len(bytes.TrimSpace(b[bytes.IndexByte(b, '{')+1:end])) > 0 {
		out = append(out, ',')
	}
	out = append(out, members...)
	return append(out, b[end:]...)
}

// Where a two-staged call's time went, as far as the gateway sees it (the access log's fields,
// and usher_disaggregated_part_seconds by part):
//
//	queue         queued_ms: from arrival to placement, the one wait (both stages are placed
//	              at once, PickStages), a preempted or retried call's later waits included
//	prefill       prefill_ms: from sending the prefill to its worker's answer, every attempt
//	decode_first  decode_first_ms: from sending the decode to its worker's first event, less
//	              the time of a prefill that ran beside it (SGLang's flow): the KV transfer,
//	              the decode engine's queue and its first step
//	decode        decode_ms: from that first event to the answer's end; for a whole answer,
//	              whose first bytes come with its end, from sending the decode (less a prefill
//	              beside it) to the end, and decode_first is not measured
//
// The parts add up to at most the call's whole time (ms); the rest is usher's own time and
// attempts that failed before a decode answered. decode_first is one part, not a transfer
// and a decode queue: the engines report neither the transfer's end nor their queue, and the
// decode worker's cost model cannot split them either, since what it predicts for a decode's
// first token is learnt from these very times, the transfer in them: subtracting it would
// leave the model's error, not the transfer. In SGLang's flow the decode engine may send its
// first token before its prefill worker answers (the prefill answers once its KV has gone):
// decode_first is then 0, not measured.

// decodeParts splits a decode attempt's time at its worker, o (TTFT: from sending to its first
// event, 0 for a whole answer; Answered: to its end, 0 when it did not end well), into the time
// to its first event and the rest, each less the part of a prefill that ran beside it (beside,
// SGLang's flow; nil for vLLM's, whose prefill ended before the decode was sent) and 0 when not
// measured. A prefill beside it whose end is not known yet leaves both unmeasured.
func decodeParts(o routing.Outcome, beside *concurrentPrefill) (first, rest time.Duration) {
	var overlap time.Duration
	if beside != nil {
		select {
		case <-beside.done:
			overlap = beside.took
		default:
			return 0, 0
		}
	}
	if o.Answered <= 0 {
		return 0, 0
	}
	if o.TTFT <= 0 {
		return 0, max(o.Answered-overlap, 0)
	}
	return max(o.TTFT-overlap, 0), max(o.Answered-o.TTFT, 0)
}

// stagedFirstToken is the time to a two-staged call's first token at its workers, as its answering
// attempt took it (measured: its prefill's time, then its decode's first event beyond that
// prefill; 0 when the decode's was not measured) and as the workers' models predicted it when
// the stages were placed (predicted: the prefill worker's cost model's TTFT plus the decode
// worker's hand-off; ok false when either could not say). The access log's engine_ttft_ms and
// ttft_pred_ms of a two-staged call are these, so that its prediction is of what the client
// waits for at the workers, the hand-off included.
func (cl *call) stagedFirstToken() (measured, predicted time.Duration, ok bool) {
	if cl.decodeFirst > 0 {
		measured = cl.prefillMeasured + cl.decodeFirst
	}
	if cl.prefillPredictedOK && cl.handoffPredictedOK {
		predicted, ok = cl.prefillPredicted.TTFT+cl.handoffPredicted, true
	}
	return measured, predicted, ok
}
