package gateway

import (
	"errors"
	"log/slog"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// settle is the last stage of every call, whatever happened before: it gives back what admit
// held (the queue's capacity, the tenant's limits and its budget reservation, charged with the
// tokens really served), judges the call against its latency objectives (objective.go), counts
// it in the usage ledger, answers err in OpenAI's shape when nothing was sent yet, and records
// the call in the metrics and the access log.
func (s *Server) settle(c echo.Context, cl *call, err error) error {
	end := s.now()
	// The ledger first (if the relay has not recorded it already): giving back the limits and
	// the budget may take round trips of their own.
	judged := s.closeBooks(cl, err, end)
	served := cl.usage.PromptTokens + cl.usage.CompletionTokens
	if cl.grant != nil {
		cl.grant.Done(queue.Usage{PromptTokens: cl.usage.PromptTokens, CompletionTokens: cl.usage.CompletionTokens})
	}
	if cl.hold != nil {
		cl.hold.Done(int64(served))
	}
	settleBudget(cl, int64(served), err)
	status := c.Response().Status
	switch {
	case errors.Is(err, errClientGone):
		status, err = statusClientClosed, nil
	case err != nil:
		status = ErrorFor(err).Status
		err = WriteError(c, err)
	}
	series := s.metrics.of(s.modelLabel(cl))
	series.requestsWith(status).Inc()
	s.metrics.attainment.count(cl, judged)
	if cl.classed {
		s.traffic.observe(cl.class, status, cl.ttft)
	}
	if cl.model != "" {
		total := end.Sub(cl.start)
		series.durationOf().Observe(total.Seconds())
		if cl.attempts > 0 {
			s.metrics.overhead.Observe(max(0, total-cl.queued-cl.atWorker).Seconds())
		}
		if cl.staged() && cl.decodeRest > 0 {
			s.metrics.observeParts(cl)
		}
	}
	if !s.log.Enabled(c.Request().Context(), slog.LevelInfo) {
		return err
	}
	engineTTFT, ttftPred, ttftPredOK := cl.measured.TTFT, cl.predicted.TTFT, cl.predictedOK
	if cl.staged() {
		engineTTFT, ttftPred, ttftPredOK = cl.stagedFirstToken()
	}
	s.log.Info("request",
		"id", headerValue(c.Response().Header(), headerRequestID),
		"tenant", cl.principal.TenantID, "model", cl.model, "class", cl.class.String(), "worker", cl.worker,
		"prefill_worker", cl.prefillWorker, "prefill_ms", msOrNil(cl.prefillTime),
		"decode_first_ms", msOrNil(cl.decodeFirst), "decode_ms", msOrNil(cl.decodeRest),
		"status", status, "attempts", cl.attempts, "preempted", cl.preempts, "prefill_pieces", cl.pieces, "ms", end.Sub(cl.start).Milliseconds(),
		"queued_ms", cl.queued.Milliseconds(), "ttft_ms", cl.ttft.Milliseconds(),
		"ttft_objective_ms", judged.objective.ttft.Milliseconds(), "tpot_objective_ms", judged.objective.tpot.Milliseconds(),
		"ttft_verdict", judged.ttft.String(), "tpot_verdict", judged.tpot.String(),
		"prompt_tokens", cl.usage.PromptTokens, "completion_tokens", cl.usage.CompletionTokens,
		"cached_tokens", cl.usage.cachedTokens(), "usage_estimated", cl.usage.estimated,
		"engine_ttft_ms", msOrNil(engineTTFT), "engine_tpot_ms", msOrNil(measuredTPOT(cl.measured)),
		"ttft_pred_ms", predictedMs(ttftPred, ttftPredOK),
		"tpot_pred_ms", predictedMs(cl.predicted.TPOT, cl.predictedOK && cl.predicted.TPOT > 0))
	return err
}

// closeBooks charges the call's prompt pieces, judges it against its objectives and records its
// usage in the ledger, once, and returns the verdicts. A relay calls it for an answer it serves
// once the answer's usage is known and before the answer's last bytes go to the client (a whole
// answer's bytes, a stream's [DONE]), so a replica killed after the client holds its answer has
// counted it (with Redis, Record returns once the count is there); settle calls it for every
// call, and for those it does the work.
func (s *Server) closeBooks(cl *call, err error, end time.Time) verdicts {
	if cl.booked {
		return cl.books
	}
	cl.booked = true
	s.chargePieces(cl)
	cl.books = s.judge(cl, err, end)
	s.teachPiece(cl, cl.books)
	s.teachPace(cl, cl.books)
	s.recordUsage(cl, err, cl.books)
	return cl.books
}

// unservedModel is the model label of a call whose model no worker serves: the client's string
// would let anyone create a series per request.
const unservedModel = "unserved"

// modelLabel is the call's model as the metrics label it: the model's name when a worker serves
// it (an admitted call's always is), else unservedModel. Cost: a map lookup.
func (s *Server) modelLabel(cl *call) string {
	if cl.classed || s.pool.Serves(cl.model) {
		return cl.model
	}
	return unservedModel
}

// The access log's cost-model fields set the worker's own times (engine_ttft_ms: from sending
// the answering attempt to its first event, as the cost model learns it; engine_tpot_ms: the
// rest of the answer per further output token) beside what the worker's cost model predicted
// for them when the attempt was placed (ttft_pred_ms, tpot_pred_ms), null where there is none.
// A two-staged call's TTFT fields are its prefill's and its decode's first event together (see
// stagedFirstToken); its TPOT fields are its decode worker's.

// msOrNil is d in milliseconds (to the µs), or nil for 0.
func msOrNil(d time.Duration) any {
	if d <= 0 {
		return nil
	}
	return float64(d.Microseconds()) / 1000
}

// predictedMs is a prediction d in milliseconds (to the µs), or nil when there is none.
func predictedMs(d time.Duration, ok bool) any {
	if !ok {
		return nil
	}
	return float64(d.Microseconds()) / 1000
}

// measuredTPOT is an answer's time per output token after the first; 0 when not measured.
func measuredTPOT(o routing.Outcome) time.Duration {
	if o.TTFT <= 0 || o.Answered <= o.TTFT || o.CompletionTokens < 2 {
		return 0
	}
	return (o.Answered - o.TTFT) / time.Duration(o.CompletionTokens-1)
}

// settleBudget ends the call's budget reservation: a call served, or one that was served
// something before it failed, is charged the tokens it was served in place of its estimate; any
// other (refused, timed out in the queue, failed before an answer, left before anything was
// served) gives back its request and its estimate.
func settleBudget(cl *call, served int64, err error) {
	if served > 0 || err == nil {
		cl.spend.Settle(served)
		return
	}
	cl.spend.Release()
}

// account records the usage of the call's answer and turns it into the routing outcome.
func (s *Server) account(cl *call, u usage) routing.Outcome {
	if cl.pieces > 0 && u.PromptTokensDetails != nil {
		// The engine found cached what usher's own pieces put there: the request's cache hit
		// is what it held before them.
		d := *u.PromptTokensDetails
		d.CachedTokens = min(d.CachedTokens, cl.cachedBeforePieces)
		u.PromptTokensDetails = &d
	}
	if cl.concurrent != nil {
		// The prefill runs beside the decode: its answer says what its cache held. It ends
		// by itself once the decode has its KV, or at its silence bound.
		<-cl.concurrent.done
		cl.prefillCached = cl.concurrent.cached
	}
	if cl.decoding && u.PromptTokensDetails != nil {
		// The decode engine counts the KV it pulled as cached: the call's cache hit is what
		// its prefill worker held.
		d := *u.PromptTokensDetails
		d.CachedTokens = min(d.CachedTokens, cl.prefillCached)
		u.PromptTokensDetails = &d
	}
	u = cl.ownCache(u)
	cl.usage = u
	series := s.metrics.of(cl.model)
	series.tokensOf(promptTokens).Add(float64(u.PromptTokens))
	series.tokensOf(completionTokens).Add(float64(u.CompletionTokens))
	series.tokensOf(cachedTokens).Add(float64(u.cachedTokens()))
	return routing.Outcome{PromptTokens: u.PromptTokens, CachedTokens: u.cachedTokens(), CacheReported: u.PromptTokensDetails != nil,
		CompletionTokens: u.CompletionTokens, UsageEstimated: u.estimated}
}

// estimatedUsage is what a stream that ended without its usage chunk (the client left, the
// worker cut it, the engine never sends usage) is charged: the prompt estimate, since the
// engine started answering, and one completion token per event relayed that carried output
// (carriesOutput), which is how OpenAI-compatible engines stream (one event per generated
// token). So a client that hangs up early is charged what it was served, not nothing.
func estimatedUsage(cl *call, events int) usage {
	return usage{PromptTokens: cl.promptTokens, CompletionTokens: events, TotalTokens: cl.promptTokens + events, estimated: true}
}
