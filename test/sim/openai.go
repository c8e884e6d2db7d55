package sim

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// endpoint tells the two completion APIs apart.
type endpoint int

const (
	chatEndpoint endpoint = iota // /v1/chat/completions
	textEndpoint                 // /v1/completions
)

// completionRequest holds the fields of both completion APIs that the engine reads.
type completionRequest struct {
	Model               string          `json:"model"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// Priority is vLLM's scheduling priority: lower is served first under PolicyPriority.
	Priority int `json:"priority"`
	// CacheSalt is vLLM's cache_salt: in ModeKV it is mixed into the hash of the prompt's first
	// block, so a prompt hits only blocks computed under the same salt (none: the unsalted
	// ones). ModeSlots ignores it, as llama-server ignores fields it does not know.
	CacheSalt string `json:"cache_salt"`
	// KVTransferParams is vLLM's disaggregation field; BootstrapHost, BootstrapPort and
	// BootstrapRoom are SGLang's. Only RolePrefill and RoleDecode read them (planHandoff).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
	BootstrapHost    *string           `json:"bootstrap_host"`
	BootstrapPort    *int              `json:"bootstrap_port"`
	BootstrapRoom    *uint64           `json:"bootstrap_room"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type delta struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type choice struct {
	Index        int        `json:"index"`
	Message      *chatReply `json:"message,omitempty"`
	Delta        *delta     `json:"delta,omitempty"`
	Text         *string    `json:"text,omitempty"`
	Logprobs     *struct{}  `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

type chatReply struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type completionResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   *usage   `json:"usage,omitempty"`
	// KVTransferParams is a prefill worker's answer to a request asking for a remote decode.
	KVTransferParams *kvTransferAnswer `json:"kv_transfer_params,omitempty"`
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    string `json:"code"`
	} `json:"error"`
}

func errorJSON(typ, code, msg string) []byte {
	var b errorBody
	b.Error.Message, b.Error.Type, b.Error.Code = msg, typ, code
	data, _ := json.Marshal(b)
	return data
}

// writeError answers in OpenAI's error shape.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(errorJSON(typ, code, msg))
}

func (e *Engine) badRequest(w http.ResponseWriter, status int, code, msg string) {
	e.stats.badRequests.Add(1)
	writeError(w, status, "invalid_request_error", code, msg)
}

func (e *Engine) serveModels(w http.ResponseWriter) {
	type model struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		MaxModelLen int    `json:"max_model_len"`
	}
	body := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{{
		ID: e.cfg.Model, Object: "model", Created: e.now().Unix(), OwnedBy: "usher-sim", MaxModelLen: e.cfg.MaxModelLen,
	}}}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

// serveTokenize answers POST /tokenize as vLLM does ({"prompt": text}, llama-server's
// {"content": text}, or vLLM's chat form {"messages": [...], "add_generation_prompt": bool},
// rendered with the chat template the chat endpoint uses, so the ids are those whose blocks a
// chat request caches) with the engine's token ids: {"count", "max_model_len", "tokens"}.
func (e *Engine) serveTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Prompt              *string       `json:"prompt"`
		Content             *string       `json:"content"`
		Messages            []chatMessage `json:"messages"`
		AddGenerationPrompt *bool         `json:"add_generation_prompt"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes)).Decode(&req); err != nil {
		e.badRequest(w, http.StatusBadRequest, "invalid_json", "body must be a JSON object: "+err.Error())
		return
	}
	text := req.Prompt
	if text == nil {
		text = req.Content
	}
	if text == nil && len(req.Messages) > 0 {
		chat := renderChat(req.Messages)
		if req.AddGenerationPrompt != nil && !*req.AddGenerationPrompt {
			chat = strings.TrimSuffix(chat, chatGenerationPrompt)
		}
		text = &chat
	}
	if text == nil {
		e.badRequest(w, http.StatusBadRequest, "missing_prompt", "prompt (or content, or messages) is required")
		return
	}
	ids := tokenize(*text)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint64 `json:"tokens"`
	}{len(ids), e.cfg.MaxModelLen, ids})
}

// parsePrompt reads a completions prompt: a string or an array of strings, of which the first
// is used.
func parsePrompt(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", errors.New("missing prompt")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
		return "", errors.New("prompt must be a string or a non-empty array of strings")
	}
	return list[0], nil
}

// serveCompletion answers one completion request: faults first, then a sequence through the
// scheduler, streamed or whole.
func (e *Engine) serveCompletion(w http.ResponseWriter, r *http.Request, kind endpoint) {
	e.stats.requests.Add(1)
	req, prompt, maxTokens, ok := e.parseCompletion(w, r, kind)
	if !ok {
		return
	}
	h, ok := e.planHandoff(w, &req, &maxTokens)
	if !ok {
		return
	}

	a := e.arrive(req.Priority, req.CacheSalt)
	if a.abort {
		panic(http.ErrAbortHandler)
	}
	if a.last {
		defer e.die()
	}
	ctx := r.Context()
	if a.latency > 0 {
		t := time.NewTimer(a.latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			e.stats.cancelled.Add(1)
			return
		case <-a.dead:
			t.Stop()
			panic(http.ErrAbortHandler)
		case <-e.stop:
			t.Stop()
			writeError(w, http.StatusServiceUnavailable, "server_error", "engine_closed", "the engine is shutting down")
			return
		}
	}
	if a.fail {
		e.stats.failed.Add(1)
		writeError(w, http.StatusInternalServerError, "server_error", "injected_fault", "injected error (--error-rate)")
		return
	}
	if a.hang {
		e.stats.hung.Add(1)
		select {
		case <-ctx.Done():
		case <-a.dead:
			panic(http.ErrAbortHandler)
		case <-e.stop:
			writeError(w, http.StatusServiceUnavailable, "server_error", "engine_closed", "the engine is shutting down")
		}
		return
	}

	rs := responseStream{
		e: e, w: w, kind: kind, promptLen: len(prompt), arrived: e.now(),
		created: e.now().Unix(),
		stream:  req.Stream,
		usage:   req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
	}
	if h.transferID != "" {
		rs.transfer = &kvTransferAnswer{DoRemotePrefill: true, RemoteEngineID: e.engineID, RemoteRequestID: h.transferID, TPSize: 1}
		if addr, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
			rs.transfer.RemoteHost, rs.transfer.RemotePort = addr.IP.String(), addr.Port
		}
	}
	remote := 0
	if h.pull != nil {
		rs.begin()
		var err error
		if remote, err = e.receive(ctx, h.pull, prompt, req.CacheSalt); err != nil {
			switch {
			case ctx.Err() != nil:
				e.stats.cancelled.Add(1)
			case errors.Is(err, errClosed):
				rs.fail(err)
			default:
				rs.refuseTransfer(h.pull, err)
			}
			return
		}
	}
	q, err := e.submit(prompt, maxTokens, req.Priority, req.CacheSalt, h.hold, remote)
	if err != nil {
		rs.fail(errClosed)
		return
	}
	rs.id = e.responseID(kind, q.arrival)
	rs.serve(r, q)
	if a.last {
		_ = http.NewResponseController(w).Flush()
	}
}

// parseCompletion reads and checks a completion request, answering 4xx itself when it is bad.
func (e *Engine) parseCompletion(w http.ResponseWriter, r *http.Request, kind endpoint) (req completionRequest, prompt []uint64, maxTokens int, ok bool) {
	r.Body = http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes)
	data, err := io.ReadAll(r.Body)
	if err != nil {
		if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
			e.badRequest(w, http.StatusRequestEntityTooLarge, "request_too_large",
				fmt.Sprintf("request body exceeds %d bytes", e.cfg.MaxBodyBytes))
			return req, nil, 0, false
		}
		e.badRequest(w, http.StatusBadRequest, "invalid_body", "reading the request body: "+err.Error())
		return req, nil, 0, false
	}
	if err := json.Unmarshal(data, &req); err != nil {
		e.badRequest(w, http.StatusBadRequest, "invalid_json", "the body is not valid JSON: "+err.Error())
		return req, nil, 0, false
	}
	if req.Model != "" && req.Model != e.cfg.Model {
		e.stats.badRequests.Add(1)
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("The model `%s` does not exist.", req.Model))
		return req, nil, 0, false
	}
	var text string
	if kind == chatEndpoint {
		if len(req.Messages) == 0 {
			e.badRequest(w, http.StatusBadRequest, "missing_messages", "messages must be a non-empty array")
			return req, nil, 0, false
		}
		text = renderChat(req.Messages)
	} else if text, err = parsePrompt(req.Prompt); err != nil {
		e.badRequest(w, http.StatusBadRequest, "invalid_prompt", err.Error())
		return req, nil, 0, false
	}
	prompt = tokenize(text)
	maxTokens = e.cfg.DefaultMaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = *req.MaxCompletionTokens
	} else if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if msg := e.checkLength(len(prompt), maxTokens); msg != "" {
		e.badRequest(w, http.StatusBadRequest, "context_length_exceeded", msg)
		return req, nil, 0, false
	}
	return req, prompt, maxTokens, true
}

// checkLength refuses, as the engine it stands for does, requests that cannot fit the context
// or the KV cache. maxTokens is the client's number, anything an int holds: it is compared with
// what the context leaves, never added to the prompt in int (a positive limit minus a
// non-negative promptLen cannot overflow), and the sum in a message is taken in uint64, where
// two non-negative ints are exact.
func (e *Engine) checkLength(promptLen, maxTokens int) string {
	requested := func() uint64 { return uint64(promptLen) + uint64(maxTokens) } // both >= 0: exact
	switch {
	case promptLen == 0:
		return "the prompt is empty"
	case maxTokens < 1:
		return fmt.Sprintf("max_tokens must be at least 1, got %d", maxTokens)
	case e.cfg.Mode == ModeSlots && promptLen >= e.cfg.slotTokens():
		return fmt.Sprintf("request (%d tokens) exceeds the available context size (%d tokens), try increasing it",
			promptLen, e.cfg.slotTokens())
	case e.cfg.Mode == ModeSlots && maxTokens > e.cfg.slotTokens()-promptLen:
		// llama-server would stop generating when the slot's context is full; the sim refuses,
		// so no request asks for more than it can get.
		return fmt.Sprintf("the request needs %d tokens (%d in the prompt, %d in the completion), more than the slot's context of %d tokens",
			requested(), promptLen, maxTokens, e.cfg.slotTokens())
	case maxTokens > e.cfg.MaxModelLen-promptLen:
		return fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			e.cfg.MaxModelLen, requested(), promptLen, maxTokens)
	case maxTokens > e.cfg.requestTokens()-promptLen:
		return fmt.Sprintf("the request needs %d tokens of KV cache, more than the engine's %d",
			requested(), e.cfg.requestTokens())
	}
	return ""
}

func (e *Engine) responseID(kind endpoint, n uint64) string {
	if kind == chatEndpoint {
		return "chatcmpl-sim-" + strconv.FormatUint(n, 10)
	}
	return "cmpl-sim-" + strconv.FormatUint(n, 10)
}

// responseStream writes one sequence's output to its client.
type responseStream struct {
	e         *Engine
	w         http.ResponseWriter
	kind      endpoint
	id        string
	created   int64
	promptLen int
	stream    bool
	usage     bool
	arrived   time.Time // when the request came: CancelPoll's checks are counted from it
	// transfer, when not nil, is the kv_transfer_params of a whole answer whose KV is held for
	// a decode worker; the held block ids are filled in when it finishes.
	transfer *kvTransferAnswer

	started   bool // headers sent
	generated int
	text      strings.Builder // whole answer when not streaming
	line      []byte
}

// serve relays the sequence's tokens until it ends or the client goes away. A stream's headers
// go out at once, before the request is even admitted, as vLLM's do.
func (rs *responseStream) serve(r *http.Request, q *sequence) {
	rs.begin()
	var buf []int32
	for {
		select {
		case <-q.out.notify:
		case <-r.Context().Done():
			if !rs.stream {
				rs.e.noticeLate(rs.arrived)
			}
			rs.e.cancel(q)
			return
		}
		toks, done, finish, err := q.out.take(buf[:0])
		buf = toks
		if err != nil {
			rs.fail(err)
			return
		}
		for i, tok := range toks {
			reason := ""
			if done && i == len(toks)-1 {
				reason = finish
			}
			rs.token(vocabulary[tok], reason)
		}
		if rs.stream && len(toks) > 0 {
			_ = http.NewResponseController(rs.w).Flush()
		}
		if done {
			rs.finish(q, finish)
			return
		}
	}
}

// begin sends a stream's headers, once; a whole answer's wait for its end.
func (rs *responseStream) begin() {
	if !rs.stream || rs.started {
		return
	}
	h := rs.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	if rs.e.cfg.CloseAfterStream {
		h.Set("Keep-Alive", "timeout=5, max=100") // what llama-server announces
	}
	rs.w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(rs.w).Flush()
	rs.started = true
}

func (rs *responseStream) object() string {
	switch {
	case rs.kind == textEndpoint:
		return "text_completion"
	case rs.stream:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

// token writes one generated token: a chunk when streaming, else into the whole answer.
func (rs *responseStream) token(word, finish string) {
	piece := word
	if rs.generated > 0 {
		piece = " " + word
	}
	rs.generated++
	if !rs.stream {
		rs.text.WriteString(piece)
		return
	}
	c := choice{}
	if finish != "" {
		c.FinishReason = &finish
	}
	if rs.kind == chatEndpoint {
		c.Delta = &delta{Content: piece}
		if rs.generated == 1 {
			c.Delta.Role = "assistant"
		}
	} else {
		c.Text = &piece
	}
	rs.event(completionResponse{ID: rs.id, Object: rs.object(), Created: rs.created, Model: rs.e.cfg.Model, Choices: []choice{c}})
}

func (rs *responseStream) event(v any) {
	data, _ := json.Marshal(v)
	rs.line = append(append(append(rs.line[:0], "data: "...), data...), "\n\n"...)
	_, _ = rs.w.Write(rs.line)
}

func (rs *responseStream) usageOf(q *sequence) *usage {
	q.out.mu.Lock()
	cached := q.out.cached
	q.out.mu.Unlock()
	u := &usage{PromptTokens: rs.promptLen, CompletionTokens: rs.generated, TotalTokens: rs.promptLen + rs.generated}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

// finish ends a sequence that ran to its end.
func (rs *responseStream) finish(q *sequence, reason string) {
	u := rs.usageOf(q)
	if rs.stream {
		if rs.usage {
			rs.event(completionResponse{ID: rs.id, Object: rs.object(), Created: rs.created, Model: rs.e.cfg.Model, Choices: []choice{}, Usage: u})
		}
		_, _ = io.WriteString(rs.w, "data: [DONE]\n\n")
		_ = http.NewResponseController(rs.w).Flush()
		if rs.e.cfg.CloseAfterStream {
			closeAfterStream(rs.w)
		}
		return
	}
	c := choice{FinishReason: &reason}
	text := rs.text.String()
	if rs.kind == chatEndpoint {
		c.Message = &chatReply{Role: "assistant", Content: text}
	} else {
		c.Text = &text
	}
	resp := completionResponse{ID: rs.id, Object: rs.object(), Created: rs.created, Model: rs.e.cfg.Model, Choices: []choice{c}, Usage: u}
	if rs.transfer != nil {
		rs.transfer.RemoteBlockIDs = q.out.heldBlocks()
		resp.KVTransferParams = rs.transfer
	}
	data, _ := json.Marshal(resp)
	rs.w.Header().Set("Content-Type", "application/json")
	rs.w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	_, _ = rs.w.Write(data)
}

// closeAfterStream ends a complete streamed answer's connection as llama-server does: the
// chunked body's last chunk goes out and the connection closes, although the response
// announced keep-alive, so a client that pooled the connection finds it dead when it reuses it.
// On a connection that cannot be hijacked (HTTP/2) the answer ends normally.
func closeAfterStream(w http.ResponseWriter) {
	conn, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	_, _ = buf.WriteString("0\r\n\r\n")
	_ = buf.Flush()
	_ = conn.Close()
}

// fail ends a sequence the engine gave up on: a dead engine drops the connection, a closed one
// answers 503 or, mid-stream, sends an error event and ends the stream as vLLM does.
func (rs *responseStream) fail(err error) {
	if errors.Is(err, errDead) {
		panic(http.ErrAbortHandler)
	}
	if !rs.started {
		writeError(rs.w, http.StatusServiceUnavailable, "server_error", "engine_closed", "the engine is shutting down")
		return
	}
	rs.line = append(append(append(rs.line[:0], "data: "...), errorJSON("server_error", "engine_closed", "the engine is shutting down")...), "\n\n"...)
	_, _ = rs.w.Write(rs.line)
	_, _ = io.WriteString(rs.w, "data: [DONE]\n\n")
	_ = http.NewResponseController(rs.w).Flush()
}

// authorized reports whether r may be served: every /v1 request carries the engine's API key
// when it has one.
func (e *Engine) authorized(r *http.Request) bool {
	if e.cfg.APIKey == "" || !strings.HasPrefix(r.URL.Path, "/v1/") {
		return true
	}
	got := []byte(r.Header.Get("Authorization"))
	return subtle.ConstantTimeCompare(got, []byte("Bearer "+e.cfg.APIKey)) == 1
}

// embeddingDims is the length of the sim's embedding vectors.
const embeddingDims = 8

// serveEmbeddings answers /v1/embeddings for the engine's model at once, outside the batch
// scheduler (an embedding is one forward pass with no decode): one vector per input, derived from
// its tokens so equal inputs embed alike, and the tokens as usage.
func (e *Engine) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	e.stats.requests.Add(1)
	var req struct {
		Model string          `json:"model"`
		Input json.RawMessage `json:"input"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, e.cfg.MaxBodyBytes)).Decode(&req); err != nil {
		e.badRequest(w, http.StatusBadRequest, "invalid_request", "invalid JSON body: "+err.Error())
		return
	}
	if req.Model != "" && req.Model != e.cfg.Model {
		writeError(w, http.StatusNotFound, "invalid_request_error", "model_not_found",
			"the model "+req.Model+" does not exist (this engine serves "+e.cfg.Model+")")
		return
	}
	// A failed decode may leave a partial value: each shape decodes into a fresh one.
	var texts []string
	var ids [][]uint64
	var one string
	var list []string
	var batch [][]uint64
	var flat []uint64
	switch {
	case json.Unmarshal(req.Input, &one) == nil:
		texts = []string{one}
	case json.Unmarshal(req.Input, &list) == nil:
		texts = list
	case json.Unmarshal(req.Input, &batch) == nil:
		ids = batch
	case json.Unmarshal(req.Input, &flat) == nil:
		ids = [][]uint64{flat}
	default:
		e.badRequest(w, http.StatusBadRequest, "invalid_request", "input must be a string, strings or token ids")
		return
	}
	for _, t := range texts {
		ids = append(ids, tokenize(t))
	}
	type embedding struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float64 `json:"embedding"`
	}
	data := make([]embedding, len(ids))
	tokens := 0
	for i, toks := range ids {
		vec := make([]float64, embeddingDims)
		for j, id := range toks {
			vec[(uint64(j)+id)%embeddingDims] += float64(id%1000) / 1000
		}
		data[i] = embedding{Object: "embedding", Index: i, Embedding: vec}
		tokens += len(toks)
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data, "model": e.cfg.Model,
		"usage": map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}})
}
