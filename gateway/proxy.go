package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Headers usher reads from clients and adds to responses.
const (
	headerWorker     = "X-Usher-Worker"
	headerRoute      = "X-Usher-Route"
	headerSessionID  = "X-Session-ID"
	headerRoutingKey = "X-Usher-Routing-Key"
	headerTarget     = "X-Usher-Target-Worker"
)

// errClientGone marks a request whose client went away; nothing more can be sent to it.
var errClientGone = errors.New("client closed the request")

// statusClientClosed is what the metrics and the log record for a client that went away.
const statusClientClosed = 499

// inference serves one OpenAI inference endpoint: authenticate (middleware), read and check
// the body, pick a worker, proxy, account.
func (s *Server) inference(ep endpoint) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := s.now()
		x := &exchange{start: start}
		err := s.serveInference(c, ep, x)
		status := c.Response().Status
		switch {
		case errors.Is(err, errClientGone):
			status = statusClientClosed
			err = nil
		case err != nil:
			status = ErrorFor(err).Status
			err = WriteError(c, err)
		}
		s.metrics.requests.WithLabelValues(x.model, strconv.Itoa(status)).Inc()
		if x.classed {
			s.traffic.observe(x.class, status, x.ttft)
		}
		if x.model != "" {
			s.metrics.duration.WithLabelValues(x.model).Observe(s.now().Sub(start).Seconds())
		}
		if !s.log.Enabled(c.Request().Context(), slog.LevelInfo) {
			return err
		}
		s.log.Info("request",
			"id", c.Response().Header().Get(echo.HeaderXRequestID),
			"tenant", principalOf(c).TenantID, "model", x.model, "worker", x.worker,
			"status", status, "attempts", x.attempts, "ms", s.now().Sub(start).Milliseconds(),
			"prompt_tokens", x.usage.PromptTokens, "completion_tokens", x.usage.CompletionTokens,
			"cached_tokens", x.usage.cachedTokens())
		return err
	}
}

// exchange is what one request learned on its way, for metrics and the access log.
type exchange struct {
	start    time.Time
	model    string
	worker   string
	attempts int
	usage    usage
	class    queue.Class
	classed  bool          // class is resolved: the request reached admission
	ttft     time.Duration // time to the first byte sent; 0 if none was
}

func (s *Server) serveInference(c echo.Context, ep endpoint, x *exchange) error {
	body, err := s.readBody(c)
	if err != nil {
		return err
	}
	req, err := parseInferenceRequest(body, ep)
	if err != nil {
		return err
	}
	if !s.pool.Serves(req.Model) {
		return fmt.Errorf("the model %q does not exist: %w", req.Model, routing.ErrUnknownModel)
	}
	x.model = req.Model
	p := principalOf(c)
	if p.TierSpec == nil {
		p.TierSpec = fallbackTier
	}
	tier := p.TierSpec
	if !tier.AllowsModel(req.Model) {
		return fmt.Errorf("model %q: %w", req.Model, tenants.ErrModelNotAllowed)
	}
	target := c.Request().Header.Get(headerTarget)
	if target != "" && !tier.MayTargetWorker {
		return errTargetNotAllowed
	}
	upstream, err := req.forUpstream(body)
	if err != nil {
		return BadRequest("", "request body cannot be forwarded: %v", err)
	}
	promptTokens := estimateTokens(req.prompt)
	expected := s.cfg.DefaultMaxTokens
	if tier.ExpectedOutputTokens > 0 {
		expected = int(tier.ExpectedOutputTokens)
	}
	maxOut := req.maxOutputTokens(expected)
	limit, err := s.admitLimits(c, p, tenants.Demand{Model: req.Model, PromptTokens: int64(promptTokens), MaxOutputTokens: int64(maxOut)})
	if err != nil {
		return err
	}
	if limit != nil {
		defer func() { limit.Done(int64(x.usage.PromptTokens + x.usage.CompletionTokens)) }()
	}
	grant, err := s.admit(c, tier, req, promptTokens, maxOut, x)
	if err != nil {
		return err
	}
	defer func() {
		grant.Done(queue.Usage{PromptTokens: x.usage.PromptTokens, CompletionTokens: x.usage.CompletionTokens})
	}()
	x.class = grant.Class
	h := c.Request().Header
	rr := &routing.Request{
		Model:        req.Model,
		Tenant:       p.TenantID,
		SessionID:    h.Get(headerSessionID),
		RoutingKey:   h.Get(headerRoutingKey),
		TargetWorker: target,
		Prompt:       req.prompt,
		PromptTokens: promptTokens,
		Tokens:       promptTokens + maxOut,
	}
	return s.forward(c, ep, req, rr, upstream, x)
}

// readBody reads the request body within the configured bound.
func (s *Server) readBody(c echo.Context) ([]byte, error) {
	r := c.Request()
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, TooLarge(s.cfg.MaxBodyBytes)
	}
	buf := bytes.NewBuffer(make([]byte, 0, max(r.ContentLength, 512)+1))
	_, err := buf.ReadFrom(http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes))
	body := buf.Bytes()
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, TooLarge(s.cfg.MaxBodyBytes)
	case r.Context().Err() != nil:
		return nil, errClientGone
	case err != nil:
		return nil, BadRequest("", "reading the request body: %v", err)
	}
	return body, nil
}

// forward sends the request to a worker, trying another one while nothing has reached the
// client (connect error, 5xx), and relays the answer. Once a worker's 2xx or 4xx answer is
// being relayed, the request is never sent again.
func (s *Server) forward(c echo.Context, ep endpoint, req *inferenceRequest, rr *routing.Request, body []byte, x *exchange) error {
	ctx := c.Request().Context()
	var lastErr error
	for x.attempts < s.cfg.MaxAttempts {
		lease, err := s.pool.Pick(ctx, rr)
		if err != nil {
			if lastErr != nil && errors.Is(err, routing.ErrNoWorker) {
				break
			}
			if errors.Is(err, routing.ErrUnknownWorker) {
				return fmt.Errorf("%s %q: %w", headerTarget, rr.TargetWorker, errUnknownTarget)
			}
			return err
		}
		x.attempts++
		if x.attempts > 1 {
			s.metrics.retries.WithLabelValues(req.Model).Inc()
		}
		w := lease.Worker
		x.worker = w.ID()
		resp, err := s.send(ctx, w, ep, s.bodyFor(w, body, x.class), c.Request().Header)
		if err == nil && resp.StatusCode >= 500 {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			err = fmt.Errorf("worker %s answered %s", w.ID(), resp.Status)
		}
		if err != nil {
			if ctx.Err() != nil {
				lease.Release(routing.Outcome{})
				return errClientGone
			}
			lease.Release(routing.Outcome{Failed: true})
			s.log.Warn("worker attempt failed", "worker", w.ID(), "model", req.Model, "err", err)
			rr.Exclude = append(rr.Exclude, w.ID())
			lastErr = err
			continue
		}
		outcome, err := s.relay(c, req, lease, resp, x)
		resp.Body.Close()
		lease.Release(outcome)
		return err
	}
	return fmt.Errorf("%w after %d attempts: %v", errUpstream, x.attempts, lastErr)
}

// bodyFor returns the body for worker w: for a worker that schedules by priority (vLLM's
// `priority` field, lower first), the request's class is handed down, replacing any priority
// the client set, so a client cannot raise its own.
func (s *Server) bodyFor(w *routing.Worker, body []byte, class queue.Class) []byte {
	if !w.PriorityHandoff() {
		return body
	}
	out, err := withField(body, "priority", strconv.Itoa(int(class)))
	if err != nil {
		return body
	}
	return out
}

// send makes one attempt at worker w. The request carries the client's context, so a client
// that goes away cancels it at once.
func (s *Server) send(ctx context.Context, w *routing.Worker, ep endpoint, body []byte, in http.Header) (*http.Response, error) {
	u := *w.URL()
	u.Path, u.RawPath = singleJoin(u.Path, ep.path), ""
	// The worker's URL is parsed once, when it joins the pool; the request takes a copy rather
	// than formatting and parsing it again for every request.
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, "", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.URL, out.Host = &u, u.Host
	out.Header.Set("Content-Type", "application/json")
	out.Header.Set(echo.HeaderXRequestID, in.Get(echo.HeaderXRequestID))
	if a := in.Get("Accept"); a != "" {
		out.Header.Set("Accept", a)
	}
	return s.client.Do(out)
}

func singleJoin(base, path string) string {
	if len(base) > 0 && base[len(base)-1] == '/' {
		base = base[:len(base)-1]
	}
	return base + path
}

// relay copies the worker's answer to the client and reports what the worker did.
func (s *Server) relay(c echo.Context, req *inferenceRequest, lease *routing.Lease, resp *http.Response, x *exchange) (routing.Outcome, error) {
	h := c.Response().Header()
	h.Set(headerWorker, lease.Worker.ID())
	h.Set(headerRoute, string(lease.Route))
	if req.Stream && resp.StatusCode == http.StatusOK {
		return s.relayStream(c, req, resp, x)
	}
	buf := bytes.NewBuffer(make([]byte, 0, min(max(resp.ContentLength, 512), s.cfg.MaxResponseBytes)+1))
	_, err := buf.ReadFrom(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
	data := buf.Bytes()
	if err != nil {
		if c.Request().Context().Err() != nil {
			return routing.Outcome{}, errClientGone
		}
		return routing.Outcome{Failed: true}, fmt.Errorf("%w: reading the answer of worker %s: %v", errUpstreamAnswer, lease.Worker.ID(), err)
	}
	if int64(len(data)) > s.cfg.MaxResponseBytes {
		return routing.Outcome{}, fmt.Errorf("%w: it exceeds %d bytes", errUpstreamAnswer, s.cfg.MaxResponseBytes)
	}
	ct := resp.Header.Get("Content-Type")
	if ct == "" {
		ct = echo.MIMEApplicationJSON
	}
	x.ttft = s.now().Sub(x.start)
	s.metrics.ttft.WithLabelValues(req.Model, x.class.String()).Observe(x.ttft.Seconds())
	var out routing.Outcome
	if u, ok := parseUsage(data); ok && resp.StatusCode == http.StatusOK {
		out = s.account(req.Model, u, x)
	}
	if err := c.Blob(resp.StatusCode, ct, data); err != nil {
		return out, errClientGone
	}
	return out, nil
}

// relayStream passes the worker's server-sent events to the client one by one, flushing each as
// it arrives. The usage chunk the gateway asked for on the client's behalf is read and dropped.
func (s *Server) relayStream(c echo.Context, req *inferenceRequest, resp *http.Response, x *exchange) (routing.Outcome, error) {
	w := c.Response()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	w.Flush()

	var out routing.Outcome
	lines := newLineReader(resp.Body, int(s.cfg.MaxResponseBytes))
	first, skipBlank, done := true, false, false
	for {
		line, err := lines.next()
		if len(line) > 0 {
			payload, isData := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
			payload = bytes.TrimSpace(payload)
			switch {
			case skipBlank && len(bytes.TrimSpace(line)) == 0:
				skipBlank = false
				continue
			case isData && bytes.Equal(payload, []byte("[DONE]")):
				done = true
			case isData:
				if u, ok := parseUsage(payload); ok {
					out = s.account(req.Model, u, x)
					if !req.clientWantsUsage && isUsageOnlyChunk(payload) {
						skipBlank = true
						continue
					}
				}
			}
			if _, werr := w.Write(line); werr != nil {
				return out, errClientGone
			}
			// An event ends with a blank line. It is flushed at once unless the next bytes
			// from the worker are already here: then they go out in the same write, without
			// waiting for anything, as a buffering-off proxy does.
			if len(bytes.TrimSpace(line)) == 0 && lines.r.Buffered() == 0 {
				w.Flush()
				if first {
					first = false
					x.ttft = s.now().Sub(x.start)
					s.metrics.ttft.WithLabelValues(req.Model, x.class.String()).Observe(x.ttft.Seconds())
				}
			}
		}
		if err == nil {
			continue
		}
		w.Flush()
		if done {
			// [DONE] went out: the answer is complete, whether the worker then closes the stream
			// or the client hangs up first.
			return out, nil
		}
		if c.Request().Context().Err() != nil {
			return out, errClientGone
		}
		// The stream broke before [DONE]: the status is sent already, so tell the client in
		// the stream itself, as OpenAI does.
		out.Failed = true
		msg := fmt.Sprintf("the worker's stream ended early: %v", err)
		if errors.Is(err, io.EOF) {
			msg = "the worker's stream ended before [DONE]"
		}
		_, _ = fmt.Fprintf(w, "data: {\"error\":{\"message\":%q,\"type\":\"server_error\",\"code\":\"upstream_error\"}}\n\n", msg)
		w.Flush()
		return out, nil
	}
}

// account records a worker's reported usage and turns it into the routing outcome.
func (s *Server) account(model string, u usage, x *exchange) routing.Outcome {
	x.usage = u
	s.metrics.tokens.WithLabelValues(model, "prompt").Add(float64(u.PromptTokens))
	s.metrics.tokens.WithLabelValues(model, "completion").Add(float64(u.CompletionTokens))
	s.metrics.tokens.WithLabelValues(model, "cached").Add(float64(u.cachedTokens()))
	return routing.Outcome{PromptTokens: u.PromptTokens, CachedTokens: u.cachedTokens(), CompletionTokens: u.CompletionTokens}
}

// lineReader reads lines (with their newline) of at most max bytes, reusing one buffer: a
// line is valid until the next call.
type lineReader struct {
	r   *bufio.Reader
	buf []byte
	max int
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 32<<10), max: max}
}

var errLineTooLong = errors.New("event line too long")

func (l *lineReader) next() ([]byte, error) {
	l.buf = l.buf[:0]
	for {
		frag, err := l.r.ReadSlice('\n')
		l.buf = append(l.buf, frag...)
		if len(l.buf) > l.max {
			return nil, errLineTooLong
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return l.buf, err
		}
	}
}
