package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Response headers the gateway sets and the report reads.
const (
	headerWorker   = "X-Usher-Worker"
	headerRoute    = "X-Usher-Route"
	headerClass    = "X-Usher-Class"
	headerQueueMs  = "X-Usher-Queue-Ms"
	headerPriority = "X-Usher-Priority"
	headerDeadline = "X-Usher-Deadline-Ms"
	headerSession  = "X-Session-ID"
)

// Codes recorded for failures that have no OpenAI error code.
const (
	codeTransport  = "transport_error"
	codeTimeout    = "timeout"
	codeCanceled   = "canceled"
	codeIncomplete = "incomplete_stream"
	codeBadStream  = "bad_stream"
)

// result is what one arrival came to.
type result struct {
	tenant  int
	dropped bool          // refused locally by MaxInflight, never sent
	sentAt  time.Duration // from the start of the run
	ok      bool
	status  int    // HTTP status, 0 when none arrived
	code    string // OpenAI error code (or type), or one of the code* values
	// chunks are the arrival times of content chunks, from send.
	chunks       []time.Duration
	e2e          time.Duration
	promptTokens int
	cachedTokens int
	outputTokens int // from usage, else the number of content chunks
	worker       string
	route        string
	class        string // X-Usher-Class, else the class asked for
	queueMs      float64
	hasQueueMs   bool
	deadline     time.Duration // from send; 0 when none was sent
	whole        bool          // the server answered in one JSON body, not a stream
}

// ttft is the time to the first content chunk; false when none came.
func (r *result) ttft() (time.Duration, bool) {
	if len(r.chunks) == 0 {
		return 0, false
	}
	return r.chunks[0], true
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type requestBody struct {
	Model         string         `json:"model"`
	Messages      []message      `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type apiError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

// code is the error's code as text (string or number), else its type.
func (e *apiError) code() string {
	var s string
	if err := json.Unmarshal(e.Code, &s); err == nil && s != "" {
		return s
	}
	if c := string(bytes.TrimSpace(e.Code)); c != "" && c != "null" && c != `""` {
		return c
	}
	return e.Type
}

// chunk is one server-sent event of a completion stream, or a whole non-streamed response.
type chunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *usage    `json:"usage"`
	Error *apiError `json:"error"`
}

func (c *chunk) hasContent() bool {
	for _, ch := range c.Choices {
		if ch.Text != "" || ch.Delta.Content != "" || ch.Delta.ReasoningContent != "" || ch.Message.Content != "" {
			return true
		}
	}
	return false
}

func (c *chunk) finished() bool {
	for _, ch := range c.Choices {
		if ch.FinishReason != nil && *ch.FinishReason != "" {
			return true
		}
	}
	return false
}

// sender sends one request and measures its stream. Safe for concurrent use.
type sender struct {
	client    *http.Client
	endpoint  string // full URL
	chat      bool
	model     string
	ignoreEOS bool
	timeout   time.Duration
	now       func() time.Time
	// replicas are more full URLs; with them, each request goes to one of endpoint and these
	// as spread says (Config.ReplicaSpread; turn counts the requests sent).
	replicas []string
	spread   string
	turn     atomic.Uint64
}

// target returns the URL of the next request, of the run's tenant-th tenant: one of endpoint and
// the replicas, as s.spread says.
func (s *sender) target(tenant int) string {
	if len(s.replicas) == 0 {
		return s.endpoint
	}
	urls := uint64(len(s.replicas) + 1)
	var n uint64
	switch s.spread {
	case SpreadPinned:
		n = uint64(max(tenant, 0)) % urls
	case SpreadSkewed:
		// Every other request to endpoint, the others round robin over the replicas.
		if t := s.turn.Add(1) - 1; t%2 == 1 {
			n = 1 + (t/2)%(urls-1)
		}
	default:
		n = (s.turn.Add(1) - 1) % urls
	}
	if n == 0 {
		return s.endpoint
	}
	return s.replicas[n-1]
}

// send performs a and returns what came of it; sentAt is filled in by the caller.
func (s *sender) send(ctx context.Context, a arrival, t Tenant) result {
	res := result{tenant: a.tenant, class: t.Class}
	body := requestBody{
		Model:     s.model,
		MaxTokens: a.item.MaxTokens,
		Stream:    !t.Whole,
		IgnoreEOS: s.ignoreEOS,
	}
	if body.Stream {
		body.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if s.chat {
		if a.item.System != "" {
			body.Messages = append(body.Messages, message{Role: "system", Content: a.item.System})
		}
		body.Messages = append(body.Messages, message{Role: "user", Content: a.item.Prompt})
	} else {
		body.Prompt = a.item.Prompt
		if a.item.System != "" {
			body.Prompt = a.item.System + " " + a.item.Prompt
		}
	}
	payload, err := json.Marshal(body)
	if err != nil {
		res.code = codeTransport
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.target(a.tenant), bytes.NewReader(payload))
	if err != nil {
		res.code = codeTransport
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if t.Key != "" {
		req.Header.Set("Authorization", "Bearer "+t.Key)
	}
	if t.Class != "" {
		req.Header.Set(headerPriority, t.Class)
	}
	if t.DeadlineMs > 0 {
		req.Header.Set(headerDeadline, strconv.Itoa(t.DeadlineMs))
		res.deadline = time.Duration(t.DeadlineMs) * time.Millisecond
	}
	if a.item.Session != "" {
		req.Header.Set(headerSession, a.item.Session)
	}

	start := s.now()
	resp, err := s.client.Do(req)
	if err != nil {
		res.e2e = s.now().Sub(start)
		res.code = failureCode(ctx, err)
		return res
	}
	defer resp.Body.Close()
	res.status = resp.StatusCode
	res.worker = resp.Header.Get(headerWorker)
	res.route = resp.Header.Get(headerRoute)
	if c := resp.Header.Get(headerClass); c != "" {
		res.class = c
	}
	if q := resp.Header.Get(headerQueueMs); q != "" {
		if v, err := strconv.ParseFloat(q, 64); err == nil {
			res.queueMs, res.hasQueueMs = v, true
		}
	}
	if resp.StatusCode != http.StatusOK {
		res.code = errorCode(resp.Body)
		res.e2e = s.now().Sub(start)
		return res
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		s.readWhole(ctx, resp.Body, start, &res)
	} else {
		s.readStream(ctx, resp.Body, start, &res)
	}
	res.e2e = s.now().Sub(start)
	return res
}

// readStream reads server-sent events up to [DONE], timing each content chunk.
func (s *sender) readStream(ctx context.Context, body io.Reader, start time.Time, res *result) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64*1024), 8<<20)
	var u *usage
	done, finished := false, false
	for !done && sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			done = true
			break
		}
		at := s.now().Sub(start)
		var c chunk
		if err := json.Unmarshal(data, &c); err != nil {
			res.code = codeBadStream
			return
		}
		if c.Error != nil {
			res.code = c.Error.code()
			return
		}
		if c.hasContent() {
			res.chunks = append(res.chunks, at)
		}
		finished = finished || c.finished()
		if c.Usage != nil {
			u = c.Usage
		}
	}
	if err := sc.Err(); err != nil {
		res.code = failureCode(ctx, err)
		return
	}
	if !done && !finished {
		res.code = codeIncomplete
		return
	}
	res.finish(u)
}

// readWhole accepts a server that ignored stream: true and answered in one JSON body; its time
// to first token is its whole latency.
func (s *sender) readWhole(ctx context.Context, body io.Reader, start time.Time, res *result) {
	var c chunk
	if err := json.NewDecoder(body).Decode(&c); err != nil {
		res.code = failureCode(ctx, err)
		if res.code == codeTransport {
			res.code = codeBadStream
		}
		return
	}
	if c.Error != nil {
		res.code = c.Error.code()
		return
	}
	if c.hasContent() {
		res.chunks = append(res.chunks, s.now().Sub(start))
	}
	res.whole = true
	res.finish(c.Usage)
}

func (r *result) finish(u *usage) {
	r.ok = true
	r.outputTokens = len(r.chunks)
	if u == nil {
		return
	}
	r.promptTokens = u.PromptTokens
	if u.CompletionTokens > 0 {
		r.outputTokens = u.CompletionTokens
	}
	if u.PromptTokensDetails != nil {
		r.cachedTokens = u.PromptTokensDetails.CachedTokens
	}
}

// errorCode reads an OpenAI error body; "" when the body is not one.
func errorCode(body io.Reader) string {
	var e struct {
		Error *apiError `json:"error"`
	}
	if err := json.NewDecoder(io.LimitReader(body, 64<<10)).Decode(&e); err != nil || e.Error == nil {
		return ""
	}
	return e.Error.code()
}

// failureCode names a transport failure.
func failureCode(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		return codeTimeout
	case ctx.Err() != nil:
		return codeCanceled
	case errors.As(err, &ne) && ne.Timeout():
		return codeTimeout
	}
	return codeTransport
}
