package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
)

// Headers the proxy adds to responses.
const (
	headerWorker = "X-Usher-Worker"
	headerRoute  = "X-Usher-Route"
)

// Header values the proxy sets, shared read-only by every request and response (net/http never
// writes into a header's values), so that setting them allocates nothing.
var (
	jsonContentType        = []string{"application/json"}
	eventStreamContentType = []string{"text/event-stream"}
	noCache                = []string{"no-cache"}
	bufferingOff           = []string{"no"}
	noValue                = []string{""}
)

// errWorkerSilent is the cause of an attempt cut off because its worker sent nothing for
// Config.UpstreamIdleTimeout.
var errWorkerSilent = errors.New("the worker sent nothing for too long")

// errClientGone marks a request whose client went away; nothing more can be sent to it.
var errClientGone = errors.New("client closed the request")

// statusClientClosed is what the metrics and the log record for a client that went away.
const statusClientClosed = 499

// proxy makes one attempt of the call on the lease's worker, relays the answer, and releases the
// lease with what the worker did. retry says the attempt failed before the worker answered and
// before anything reached the client, so dispatch may try again: a connect error or a 5xx marks
// the worker failed and excludes it from the next pick; a reused connection the worker had
// already closed (llama.cpp's server closes after every stream while announcing keep-alive) is
// not the worker's fault, and the next pick may choose it again. Once a worker's 2xx or 4xx
// answer is being relayed, the call is never sent again.
//
// A standard or batch call is preemptible until its answer begins (see preempt.go): its attempt
// then ends with errPreempted and the lease is released as a success.
func (s *Server) proxy(c echo.Context, cl *call, lease *routing.Lease) (retry bool, err error) {
	clientCtx := c.Request().Context()
	parent := clientCtx
	if cl.stageCtx != nil {
		// A decode beside its prefill (bootstrap.go): it ends when the prefill fails.
		parent = cl.stageCtx
	}
	ctx, cancel := context.WithCancelCause(parent)
	defer cancel(nil)
	watched := s.watch(cl, lease, cancel)
	defer watched.ended()
	preemptible := watched != nil
	preempted := func() bool { return context.Cause(ctx) == errPreempted && clientCtx.Err() == nil }
	w := lease.Worker
	cl.alias = newModelAlias(cl.model, w.EngineModel(cl.model))
	body := s.forWorker(cl, lease, cl.upstreamBody(w.PriorityHandoff(), w.EngineModel(cl.model)))
	if cl.handoff != nil {
		// The decode stage of a two-staged call: the engine pulls the prompt's KV where these
		// members say (disagg.go).
		body = withMembers(body, cl.handoff)
	}
	atWorker := s.now()
	defer func() { cl.atWorker += s.now().Sub(atWorker) }()
	s.prefillInPieces(ctx, cl, lease, body, c.Request().Header)
	if lease.YieldsPrefill() {
		// Its prompt (or last piece) goes into no engine step an interactive prompt is in.
		// When ctx ends the send below fails at once.
		_ = lease.AwaitInteractive(ctx)
	}
	// A whole answer is asked as a stream where usher must see its first token: on an engine
	// with fixed slots (a preemption must stop it within a token), or while the prompt holds
	// its worker's prefill budget for interactive requests. Elsewhere it is relayed as it
	// comes, and its prefill, which usher cannot see, counts as done once it is sent.
	assembled := false
	if !cl.stream && !cl.ep.embed && (preemptible && w.SlotEngine() || lease.YieldsPrefill()) {
		if streamed, ok := streamedBody(body); ok {
			body, assembled = streamed, true
		}
	}
	if !cl.stream && !assembled && !lease.YieldsPrefill() {
		lease.Prefilled()
	}
	// The silence bound counts from the request itself, not from its prompt's pieces. A stream
	// re-arms it at every line; a whole answer is silent until it is done, so it may be silent
	// for as long as its output may take to generate.
	silence := s.cfg.UpstreamIdleTimeout
	if !cl.stream && !assembled {
		silence = wholeAnswerSilence(s.cfg, cl.expected)
	}
	at := &attempt{lease: lease, watched: watched, now: s.now}
	at.quiet.arm(silence, cancel)
	defer at.quiet.stop()
	sent := s.now()
	resp, err := s.send(ctx, w, cl, body, c.Request().Header, at)
	reused := at.reused
	// The engine has prefilled the prompt by its first chunk; a whole answer's first bytes come
	// only with its end, so there the headers are as early as usher can know.
	if !cl.stream && !assembled {
		lease.Prefilled()
	}
	if err != nil && preempted() {
		lease.Release(routing.Outcome{})
		return false, errPreempted
	}
	if err == nil && resp.StatusCode == http.StatusTooManyRequests {
		// The worker is alive but full: another one may have room, and this one's breaker
		// has no reason to open.
		busy := &workerBusyError{worker: w.ID(), retryAfter: retryAfterOf(resp.Header, s.now())}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		lease.Release(routing.Outcome{})
		cl.exclude(w.ID())
		return true, busy
	}
	if err == nil && resp.StatusCode >= 500 {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if clientCtx.Err() == nil {
			return s.suspectAnswer(cl, lease, resp.Status)
		}
		err, reused = fmt.Errorf("worker %s answered %s", w.ID(), resp.Status), false
	}
	if err != nil {
		if clientCtx.Err() != nil {
			lease.Release(routing.Outcome{})
			return false, errClientGone
		}
		if cause := cl.stageEnded(); cause != nil {
			// Not this worker's failure: the call is placed again.
			lease.Release(routing.Outcome{})
			return true, cause
		}
		if context.Cause(ctx) == errWorkerSilent {
			err, reused = errWorkerSilent, false
		}
		lease.Release(routing.Outcome{Failed: !reused})
		s.log.Warn("worker attempt failed", "worker", w.ID(), "model", cl.model, "reused_connection", reused, "err", err)
		if !reused {
			cl.exclude(w.ID())
		}
		return true, err
	}
	h := c.Response().Header()
	v := []string{w.ID(), string(lease.Route)}
	h[headerWorker], h[headerRoute] = v[0:1:1], v[1:2:2]
	var out routing.Outcome
	switch {
	case cl.stream && resp.StatusCode == http.StatusOK:
		out, err = s.relayStream(c, cl, resp, sent, at)
	case assembled && resp.StatusCode == http.StatusOK && isEventStream(resp.Header):
		out, err = s.relayAssembled(c, cl, resp, sent, at)
	default:
		out, err = s.relayAnswer(c, cl, resp, at)
	}
	resp.Body.Close()
	if err != nil && !c.Response().Committed && preempted() {
		lease.Release(routing.Outcome{})
		return false, errPreempted
	}
	if cause := cl.stageEnded(); err != nil && !c.Response().Committed && clientCtx.Err() == nil && cause != nil {
		lease.Release(routing.Outcome{})
		return true, cause
	}
	if err == nil {
		out.Answered = s.now().Sub(sent)
		out.LongestGap, out.MedianGap = at.gaps.longest, at.gaps.median()
	}
	if cl.decoding {
		// Its first event beyond its prefill teaches the decode worker's hand-off model.
		cl.decodeFirst, cl.decodeRest = decodeParts(out, cl.concurrent)
		out.Handoff = cl.decodeFirst
	}
	lease.Release(out)
	cl.measured = out
	cl.predicted, cl.predictedOK = lease.Predicted(out)
	if cl.decoding {
		cl.handoffPredicted, cl.handoffPredictedOK = lease.PredictedHandoff(out.PromptTokens)
	}
	if err != nil && out.Failed && !c.Response().Committed && clientCtx.Err() == nil {
		// The worker broke off (it answered, then closed or went silent) before anything
		// reached the client: another worker may serve the call.
		s.log.Warn("worker attempt failed", "worker", w.ID(), "model", cl.model, "err", err)
		cl.exclude(w.ID())
		return true, err
	}
	return false, err
}

// silenceBound cancels an attempt (with errWorkerSilent) once nothing was heard for d. Hearing
// costs one clock read and one atomic store (a stream hears at every line); its timer is re-armed
// only when it fires. It lives in its attempt, armed once; safe for concurrent use from then on.
type silenceBound struct {
	d       time.Duration
	start   time.Time
	last    atomic.Int64 // when something was last heard, as time since start
	stopped atomic.Bool
	cancel  context.CancelCauseFunc
	t       *time.Timer
}

// arm starts the bound.
func (b *silenceBound) arm(d time.Duration, cancel context.CancelCauseFunc) {
	b.d, b.start, b.cancel = d, time.Now(), cancel
	b.t = time.AfterFunc(d, b.check)
}

// heard restarts the bound; it returns when it heard, as time since the bound was armed.
func (b *silenceBound) heard() time.Duration {
	at := time.Since(b.start)
	b.last.Store(int64(at))
	return at
}

// stop ends the bound: past it, the attempt is cancelled only by a check already under way.
func (b *silenceBound) stop() {
	b.stopped.Store(true)
	b.t.Stop()
}

func (b *silenceBound) check() {
	if b.stopped.Load() {
		return
	}
	quiet := time.Since(b.start) - time.Duration(b.last.Load())
	if quiet < b.d {
		b.t.Reset(b.d - quiet)
		return
	}
	b.cancel(errWorkerSilent)
}

// wholeAnswerTokenSilence is how long a worker computing a whole answer may stay silent for each
// output token the call may cost, beyond Config.UpstreamIdleTimeout: two tokens a second, slower
// than any engine serving in earnest.
const wholeAnswerTokenSilence = 500 * time.Millisecond

// wholeAnswerSilence bounds how long a worker may take to begin a whole answer of up to output
// tokens: the idle bound plus wholeAnswerTokenSilence a token, at most the header bound.
func wholeAnswerSilence(cfg Config, output int) time.Duration {
	ceiling := max(cfg.UpstreamHeaderTimeout, cfg.UpstreamIdleTimeout)
	if output <= 0 || int64(output) >= int64(ceiling/wholeAnswerTokenSilence) {
		return ceiling
	}
	return min(cfg.UpstreamIdleTimeout+time.Duration(output)*wholeAnswerTokenSilence, ceiling)
}

// workerBusyError is a worker's 429: it had no room. The call goes to another worker; when none
// is left, the client gets the 429 with the worker's Retry-After.
type workerBusyError struct {
	worker     string
	retryAfter time.Duration
}

func (e *workerBusyError) Error() string { return fmt.Sprintf("worker %s is busy (429)", e.worker) }

// retryAfterOf reads a Retry-After header (seconds or an HTTP date) as a duration from now, at
// least a second and at most a minute; a second when it is absent or unreadable.
func retryAfterOf(h http.Header, now time.Time) time.Duration {
	v := h.Get("Retry-After")
	d := time.Second
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		d = time.Duration(min(max(secs, 1), 60)) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		d = at.Sub(now)
	}
	return min(max(d, time.Second), time.Minute)
}

// send makes one attempt at worker w. The request carries the client's context, so a client that
// goes away cancels it at once. It is marked replayable (an Idempotency-Key header with no value,
// which net/http does not send), so the transport itself resends it on a fresh connection when a
// reused one turns out closed before any answer. It records in at.reused whether the attempt went
// out on a reused connection.
func (s *Server) send(ctx context.Context, w *routing.Worker, cl *call, body []byte, in http.Header, at *attempt) (*http.Response, error) {
	at.trace.GotConn = at.gotConn
	out, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &at.trace), http.MethodPost, "", nil)
	if err != nil {
		return nil, err
	}
	// The body's reader lives in the attempt; net/http sees through the NopCloser to a
	// bytes.Reader, which it writes in the same write as the headers (another reader would
	// cost a write of its own). The transport's replays read the bytes afresh.
	at.body.Reset(body)
	out.Body, out.ContentLength = io.NopCloser(&at.body), int64(len(body))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	// The worker's URL is parsed once, when it joins the pool; the request takes a copy rather
	// than formatting and parsing it again for every request.
	u := out.URL
	*u = *w.URL()
	u.Path, u.RawPath = singleJoin(u.Path, cl.ep.path), ""
	out.Host = u.Host
	// Canonical keys and values shared read-only, as in setRequestID.
	h := out.Header
	h["Content-Type"] = jsonContentType
	// The worker's own key, never the client's credential.
	w.Authorize(h)
	h[headerRequestID] = engineRequestID(in, cl.attempts)
	h["Idempotency-Key"] = nil
	// No User-Agent line: net/http would format its own into every request, and no engine
	// reads it.
	h["User-Agent"] = noValue
	if a := headerValue(in, "Accept"); a != "" {
		h["Accept"] = []string{a}
	}
	return s.transport.RoundTrip(out)
}

// engineRequestID is the X-Request-Id a worker is sent for a request whose headers are in (see
// setRequestID), at its attempt-th attempt: a retry's id differs from its earlier attempts', which
// an engine may still hold while it aborts them.
func engineRequestID(in http.Header, attempt int) []string {
	id := in[headerEngineRequestID]
	if len(id) == 0 {
		id = in[headerRequestID]
	}
	switch {
	case len(id) == 0:
		return noValue
	case attempt > 1:
		return []string{id[0] + "-" + strconv.Itoa(attempt)}
	}
	return id[:1:1]
}

func singleJoin(base, path string) string {
	if len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	return base + path
}

// relayAnswer copies a whole (non-streamed, or error) answer to the client and reads its usage.
// The answer begins (at.answering) once it is read whole, before any of it is sent.
func (s *Server) relayAnswer(c echo.Context, cl *call, resp *http.Response, at *attempt) (routing.Outcome, error) {
	limit := s.cfg.MaxResponseBytes
	data, err := readUpTo(resp.Body, min(max(resp.ContentLength, 512), limit)+1, limit)
	if err == nil {
		// The answer is whole: it goes to the client even if a preemption chose it a moment ago.
		at.answering()
	}
	if err != nil {
		if c.Request().Context().Err() != nil {
			return routing.Outcome{}, errClientGone
		}
		return routing.Outcome{Failed: true}, fmt.Errorf("%w: reading the answer of worker %s: %v", errUpstreamAnswer, cl.worker, err)
	}
	if int64(len(data)) > limit {
		return routing.Outcome{}, fmt.Errorf("%w: it exceeds %d bytes", errUpstreamAnswer, limit)
	}
	s.firstByte(cl)
	var out routing.Outcome
	var head []byte // what goes before data (see rewriteAnswer)
	if resp.StatusCode == http.StatusOK {
		if u, ok := parseUsage(data); ok {
			out = s.account(cl, u)
			data = cl.withOwnCache(data)
		}
		head, data = cl.rewriteAnswer(data)
	}
	// What c.Blob does, with the worker's Content-Type value shared (net/http reads header keys
	// canonical) rather than canonicalized and copied.
	h := c.Response().Header()
	if headerValue(h, "Content-Type") == "" {
		if ct := resp.Header["Content-Type"]; len(ct) > 0 && ct[0] != "" {
			h["Content-Type"] = ct[:1:1]
		} else {
			h["Content-Type"] = jsonContentType
		}
	}
	if resp.StatusCode == http.StatusOK {
		s.closeBooks(cl, nil, s.now())
	}
	c.Response().WriteHeader(resp.StatusCode)
	if len(head) > 0 {
		if _, err := c.Response().Write(head); err != nil {
			return out, errClientGone
		}
	}
	if _, err := c.Response().Write(data); err != nil {
		return out, errClientGone
	}
	return out, nil
}

// readUpTo reads r to its end, or to its first max+1 bytes when it is longer, into a buffer of
// first bytes that grows as it needs (io.ReadAll with a limit, without a LimitReader); the end
// of r is not an error.
func readUpTo(r io.Reader, first, max int64) ([]byte, error) {
	buf := make([]byte, 0, first)
	for int64(len(buf)) <= max {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, 512)
		}
		n, err := r.Read(buf[len(buf):int(min(int64(cap(buf)), max+1))])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// firstByte records the call's time to first byte, once.
func (s *Server) firstByte(cl *call) {
	if cl.ttft != 0 {
		return
	}
	cl.ttft = s.now().Sub(cl.start)
	s.metrics.of(cl.model).ttftOf(cl.class).Observe(cl.ttft.Seconds())
}

// relayStream passes the worker's server-sent events to the client one by one, flushing each as
// it arrives. The usage chunk the gateway asked for on the client's behalf is read and dropped.
// When the stream ends without usage (the client left, the worker cut it), the answer's events
// are counted instead (see estimatedUsage). sent is when the request went to the worker: the
// worker's time to first event feeds its learned limit. The client's response begins with the
// worker's first bytes (at.answering then), so until the engine has prefilled the prompt the
// call may still be preempted.
//
// The attempt hears every line from the worker (the silence bound, Config.UpstreamIdleTimeout)
// and its first token at the first event that carries data.
func (s *Server) relayStream(c echo.Context, cl *call, resp *http.Response, sent time.Time, at *attempt) (routing.Outcome, error) {
	w := c.Response()
	started := false
	start := func() bool {
		if started {
			return true
		}
		if !at.answering() {
			return false
		}
		started = true
		h := w.Header()
		h["Content-Type"] = eventStreamContentType
		h["Cache-Control"] = noCache
		h["X-Accel-Buffering"] = bufferingOff
		w.WriteHeader(http.StatusOK)
		return true
	}

	var out routing.Outcome
	gotUsage, events := false, 0
	finish := func(err error) (routing.Outcome, error) {
		if !gotUsage && events > 0 {
			counted := s.account(cl, estimatedUsage(cl, events))
			counted.Failed, counted.TTFT = out.Failed, out.TTFT
			out = counted
		}
		return out, err
	}
	lines := newLineReader(resp.Body, int(s.cfg.MaxResponseBytes))
	defer lines.release()
	skipBlank, done := false, false
	for {
		buffered := lines.r.Buffered()
		line, err := lines.next()
		if len(line) > buffered || err != nil {
			// Bytes that were not here before: the worker was heard (a clock read).
			at.heard()
		}
		if len(line) > 0 {
			payload, isData := eventData(line)
			blank := !isData && len(bytes.TrimSpace(line)) == 0
			switch {
			case skipBlank && blank:
				skipBlank = false
				continue
			case isData && bytes.Equal(payload, []byte("[DONE]")):
				done = true
				if !gotUsage && events > 0 {
					// An engine that sends no usage: the estimate is the count, taken now so
					// that it too is recorded before the client holds the whole answer.
					out, _ = finish(nil)
					gotUsage = true
				}
				if gotUsage {
					// Counted before the client holds the whole answer (see closeBooks); a
					// stream not flushed yet reaches the client with its [DONE].
					s.firstByte(cl)
					s.closeBooks(cl, nil, s.now())
				}
			case isData:
				if out.TTFT == 0 {
					out.TTFT = s.now().Sub(sent)
					at.firstToken()
				}
				if u, ok := parseUsage(payload); ok {
					gotUsage = true
					ttft := out.TTFT
					out = s.account(cl, u)
					out.TTFT = ttft
					if !cl.clientWantsUsage && isUsageOnlyChunk(payload) {
						skipBlank = true
						continue
					}
					line = cl.withOwnCache(line)
				} else if carriesOutput(payload) {
					events++
				}
			}
			if !start() {
				return out, errPreempted
			}
			if isData && cl.alias != nil {
				line = cl.alias.publicEvent(line)
			}
			if _, werr := w.Write(line); werr != nil {
				return finish(errClientGone)
			}
			// An event ends with a blank line. It is flushed at once unless the next bytes
			// from the worker are already here: then they go out in the same write, without
			// waiting for anything, as a buffering-off proxy does. The first byte's time is
			// read before the flush that sends it: once the client holds it, anything (its
			// next request) may happen before this goroutine reads the clock again.
			if blank && lines.r.Buffered() == 0 {
				s.firstByte(cl)
				w.Flush()
			}
		}
		if err == nil {
			continue
		}
		if !started {
			if c.Request().Context().Err() != nil {
				return out, errClientGone
			}
			if !done {
				// Nothing reached the client: the call may go to another worker.
				out.Failed = true
				return finish(fmt.Errorf("%w: the stream of worker %s ended before its first event: %v", errUpstreamAnswer, cl.worker, err))
			}
			if !start() {
				return out, errPreempted
			}
		}
		w.Flush()
		if done {
			// [DONE] went out: the answer is complete, whether the worker then closes the stream
			// or the client hangs up first.
			return finish(nil)
		}
		if c.Request().Context().Err() != nil {
			return finish(errClientGone)
		}
		// The stream broke before [DONE]: the status is sent already, so tell the client in
		// the stream itself, as OpenAI does.
		out.Failed = true
		msg := fmt.Sprintf("the worker's stream ended early: %v", err)
		switch {
		case errors.Is(err, io.EOF):
			msg = "the worker's stream ended before [DONE]"
		case context.Cause(c.Request().Context()) == nil && errors.Is(context.Cause(resp.Request.Context()), errWorkerSilent):
			msg = fmt.Sprintf("the worker sent nothing for %v", s.cfg.UpstreamIdleTimeout)
		}
		_, _ = fmt.Fprintf(w, "data: {\"error\":{\"message\":%q,\"type\":\"server_error\",\"code\":\"upstream_error\"}}\n\n", msg)
		w.Flush()
		return finish(nil)
	}
}

// eventData is the data of a server-sent event's line (isData: a `data:` line), trimmed.
func eventData(line []byte) (payload []byte, isData bool) {
	payload, isData = bytes.CutPrefix(line, []byte("data:"))
	if !isData {
		return nil, false
	}
	return bytes.TrimSpace(payload), true
}

// lineReader reads lines (with their newline) of at most max bytes: a line is valid until the
// next call. A line that fits its 32 KiB buffer is returned from the buffer itself; a longer
// one is gathered in buf.
type lineReader struct {
	r   *bufio.Reader
	buf []byte
	max int
}

// lineReaders holds the readers of relays that ended, for the next ones: a stream relayed costs
// no buffer of its own.
var lineReaders = sync.Pool{New: func() any { return &lineReader{r: bufio.NewReaderSize(nil, 32<<10)} }}

// maxPooledLine bounds the gathering buffer a lineReader keeps when it goes back to the pool.
const maxPooledLine = 64 << 10

// newLineReader reads lines of r; release must be called once the lines are no longer used.
func newLineReader(r io.Reader, max int) *lineReader {
	l := lineReaders.Get().(*lineReader)
	l.r.Reset(r)
	l.max = max
	return l
}

// release gives the reader back; l must not be used after.
func (l *lineReader) release() {
	l.r.Reset(nil)
	if cap(l.buf) > maxPooledLine {
		l.buf = nil
	}
	lineReaders.Put(l)
}

var errLineTooLong = errors.New("event line too long")

func (l *lineReader) next() ([]byte, error) {
	frag, err := l.r.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		if len(frag) > l.max {
			return nil, errLineTooLong
		}
		return frag, err
	}
	l.buf = append(l.buf[:0], frag...)
	for {
		frag, err := l.r.ReadSlice('\n')
		l.buf = append(l.buf, frag...)
		if len(l.buf) > l.max {
			return nil, errLineTooLong
		}
		if err != bufio.ErrBufferFull {
			return l.buf, err
		}
	}
}
