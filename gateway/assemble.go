package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
)

// A preemptible (standard or batch) call that wants a whole answer from an engine with fixed
// slots (llama.cpp's server, Worker.SlotEngine) is asked of it as a stream, and usher assembles
// the whole answer itself (assembler). A preempted call is cancelled by closing its connection,
// which llama.cpp's server notices for a whole answer only about once a second, so the cancelled
// answer kept its slot and the interactive call it was cancelled for waited behind it inside the
// engine; a stream it writes token by token, and stops within a token. The stream also shows
// when the engine has prefilled the prompt (its first chunk). Engines that batch continuously
// (vLLM, SGLang) notice a closed connection at their next step either way, so their whole
// answers are relayed as they come. Only requests whose answer the stream carries entirely are
// asked so (streamedBody); any other goes as it came.

// streamableKeys are the top-level request members whose whole answer a stream carries exactly:
// one choice of plain text, no log-probabilities, no tool calls. A request with any other member
// is sent as it came.
var streamableKeys = map[string]bool{
	"model": true, "messages": true, "prompt": true, "suffix": true,
	"max_tokens": true, "max_completion_tokens": true, "n_predict": true, "n": true,
	"temperature": true, "top_p": true, "top_k": true, "min_p": true, "typical_p": true,
	"stop": true, "seed": true, "presence_penalty": true, "frequency_penalty": true,
	"repeat_penalty": true, "repeat_last_n": true, "logit_bias": true, "ignore_eos": true,
	"user": true, "metadata": true, "store": true, "service_tier": true, "priority": true, "cache_salt": true,
	"stream": true, "stream_options": true, "cache_prompt": true, "response_format": true,
	"grammar": true, "json_schema": true, "chat_template_kwargs": true, "reasoning_effort": true,
}

// streamedBody rewrites body, a whole-answer request built by buildUpstream and upstreamBody, to
// ask for a stream with its usage. ok is false when the stream would not carry the whole answer
// (see streamableKeys; `n` other than 1); body is then to be sent as it is.
func streamedBody(body []byte) (streamed []byte, ok bool) {
	fields, err := objectFields(body, nil)
	if err != nil {
		return nil, false
	}
	out := make([]byte, 0, len(body)+48)
	out = append(out, '{')
	for _, f := range fields {
		if !streamableKeys[f.key] || (f.key == "n" && !isNull(f.value) && string(f.value) != "1") ||
			(f.key == "prompt" && !onePrompt(f.value)) {
			return nil, false
		}
		if f.key == "stream" || f.key == "stream_options" {
			continue
		}
		out = append(append(append(out, f.rawKey...), ':'), f.value...)
		out = append(out, ',')
	}
	out = append(out, `"stream":true,"stream_options":{"include_usage":true}}`...)
	return out, true
}

// onePrompt reports whether a completion's prompt is one prompt, whose answer is one choice: a
// string, a list of token ids, or a list of one prompt. A list of several prompts is answered
// with a choice each.
func onePrompt(raw []byte) bool {
	list, err := elementsOf(raw)
	if err != nil {
		return true // a string
	}
	n := 0
	for list.next() {
		if n++; n > 1 && (list.value[0] == '"' || list.value[0] == '[') {
			return false
		}
	}
	return list.err == nil
}

// errAssembly is the cause of a stream that could not be assembled into a whole answer;
// errAnswerTooLarge of one whose chunks exceed the bound on a whole answer.
var (
	errAssembly       = errors.New("the worker's stream is not an answer usher can assemble")
	errAnswerTooLarge = errors.New("the answer exceeds the bound on a whole answer")
)

// assembler builds the whole answer of /v1/chat/completions or /v1/completions from the chunks
// of its stream, as the engine would have sent it whole: the chunks' top-level members (the
// last chunk's value of each; usage and the engine's own members such as llama.cpp's timings
// included), object "chat.completion" or "text_completion", and one choice whose text members
// are the deltas' strings joined, other delta members the last value sent, and finish_reason
// the last one given. It holds at most limit bytes of chunks.
//
// Cost: one pass over each chunk's bytes, nothing decoded: a string delta is joined as the JSON
// it came as (two escaped string bodies joined are the escaped body of the joined strings), and
// a member is copied only when its value changed. The answer is checked to be valid JSON once,
// at its end (answer), not chunk by chunk.
type assembler struct {
	chat   bool
	limit  int
	size   int
	top    []member // in first-seen order
	role   []byte   // the raw JSON string of the delta's role; nil: none given
	parts  []member // the choice's members
	finish []byte
	events int // chunks that carried output
	chunks int // chunks added
}

// member is one member of the answer or of its choice: its key as a JSON string (canonicalKey)
// and its raw value, or, for a joined text member (text), the joined body of a JSON string
// without its quotes. chunk is the number of the chunk that last set it.
type member struct {
	key   []byte
	value []byte
	text  bool
	chunk int
}

func newAssembler(chat bool, limit int) *assembler {
	return &assembler{chat: chat, limit: limit}
}

// add takes one chunk's payload (the data of one event, [DONE] excluded); it keeps copies of
// what it needs, so payload may be reused afterwards. A chunk that is not a JSON object,
// carries an error or another choice than index 0 ends the assembly.
func (a *assembler) add(payload []byte) error {
	a.size += len(payload)
	if a.size > a.limit {
		return fmt.Errorf("%w (%d bytes)", errAnswerTooLarge, a.limit)
	}
	m, err := membersOf(payload)
	if err != nil {
		return fmt.Errorf("%w: a chunk: %v", errAssembly, err)
	}
	a.chunks++
	output := false
	for m.next() {
		k, v := canonicalKey(m.key), m.value
		switch {
		case keyIs(k, "error"):
			if !isNull(v) {
				return fmt.Errorf("%w: the worker sent an error: %s", errAssembly, truncate(v, 512))
			}
		case keyIs(k, "object"):
		case keyIs(k, "choices"):
			if output, err = a.addChoices(v); err != nil {
				return err
			}
		default:
			if err := a.set(&a.top, k, v); err != nil {
				return err
			}
		}
	}
	if m.err != nil {
		return fmt.Errorf("%w: a chunk: %v", errAssembly, m.err)
	}
	if output {
		a.events++
	}
	return nil
}

// addChoices takes a chunk's choices, a list holding at most choice 0. output reports whether
// it carried generated output (see carriesOutput).
func (a *assembler) addChoices(v []byte) (output bool, err error) {
	if isNull(v) {
		return false, nil
	}
	list, err := elementsOf(v)
	if err != nil {
		return false, fmt.Errorf("%w: choices: %v", errAssembly, err)
	}
	for list.next() {
		c, err := membersOf(list.value)
		if err != nil {
			return false, fmt.Errorf("%w: a choice: %v", errAssembly, err)
		}
		for c.next() {
			k, v := canonicalKey(c.key), c.value
			switch {
			case keyIs(k, "index"):
				if string(v) != "0" {
					return false, fmt.Errorf("%w: a chunk carries choice %s", errAssembly, truncate(v, 32))
				}
			case keyIs(k, "finish_reason"):
				if !isNull(v) {
					a.finish = append(a.finish[:0], v...)
				}
			// A chat choice carries a delta, a completion's its text; the other is ignored,
			// so no member of the answer's choice can appear twice.
			case keyIs(k, "text") && !a.chat:
				if err := a.join(k, v); err != nil {
					return false, err
				}
				output = output || len(v) > 2
			case keyIs(k, "delta") && a.chat:
				out, err := a.addDelta(v)
				if err != nil {
					return false, err
				}
				output = output || out
			}
		}
		if c.err != nil {
			return false, fmt.Errorf("%w: a choice: %v", errAssembly, c.err)
		}
	}
	if list.err != nil {
		return false, fmt.Errorf("%w: choices: %v", errAssembly, list.err)
	}
	return output, nil
}

// addDelta takes a chat choice's delta: its role, its string members joined, its other members'
// last values.
func (a *assembler) addDelta(v []byte) (output bool, err error) {
	if isNull(v) {
		return false, nil
	}
	d, err := membersOf(v)
	if err != nil {
		return false, fmt.Errorf("%w: a delta: %v", errAssembly, err)
	}
	for d.next() {
		k, v := canonicalKey(d.key), d.value
		switch {
		case keyIs(k, "role"):
			if len(v) > 0 && v[0] == '"' {
				a.role = append(a.role[:0], v...)
			}
		case isNull(v):
		case v[0] == '"':
			if err := a.join(k, v); err != nil {
				return false, err
			}
			output = output || len(v) > 2 && (keyIs(k, "content") || keyIs(k, "reasoning_content"))
		default:
			if err := a.set(&a.parts, k, v); err != nil {
				return false, err
			}
			output = output || keyIs(k, "tool_calls")
		}
	}
	if d.err != nil {
		return false, fmt.Errorf("%w: a delta: %v", errAssembly, d.err)
	}
	return output, nil
}

// set sets a copy of v as k's value in list, in place if k is there (copying only when the value
// changed), else at the end. A key given twice in one chunk, or that holds joined text, is
// refused.
func (a *assembler) set(list *[]member, k, v []byte) error {
	m, err := a.find(list, k, false)
	if err != nil {
		return err
	}
	if !bytes.Equal(m.value, v) {
		m.value = append(m.value[:0], v...)
	}
	return nil
}

// join appends the JSON string raw (quotes included) to the text member k.
func (a *assembler) join(k, raw []byte) error {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return fmt.Errorf("%w: %s is not a string", errAssembly, k)
	}
	m, err := a.find(&a.parts, k, true)
	if err != nil {
		return err
	}
	m.value = append(m.value, raw[1:len(raw)-1]...)
	return nil
}

// find returns k's member of list, added at the end when k is new, marked as set by this chunk.
func (a *assembler) find(list *[]member, k []byte, text bool) (*member, error) {
	for i := range *list {
		m := &(*list)[i]
		if !bytes.Equal(m.key, k) {
			continue
		}
		switch {
		case m.chunk == a.chunks:
			return nil, fmt.Errorf("%w: the key %s appears twice", errAssembly, k)
		case m.text != text:
			return nil, fmt.Errorf("%w: %s is both text and another value", errAssembly, k)
		}
		m.chunk = a.chunks
		return m, nil
	}
	*list = append(*list, member{key: bytes.Clone(k), text: text, chunk: a.chunks})
	return &(*list)[len(*list)-1], nil
}

// answer is the whole answer; ok is false when it would not be valid JSON (a chunk's member
// was not: the chunks are not checked one by one).
func (a *assembler) answer() (answer []byte, ok bool) {
	out := make([]byte, 0, 512+a.size/4)
	out = append(out, '{')
	for _, m := range a.top {
		out = appendMember(out, m)
		out = append(out, ',')
	}
	if a.chat {
		out = append(out, `"object":"chat.completion","choices":[{"index":0,"message":{"role":`...)
		if a.role != nil {
			out = append(out, a.role...)
		} else {
			out = append(out, `"assistant"`...)
		}
		hasContent := false
		for _, m := range a.parts {
			hasContent = hasContent || keyIs(m.key, "content")
			out = appendMember(append(out, ','), m)
		}
		if !hasContent {
			out = append(out, `,"content":null`...)
		}
		out = append(out, "},"...)
	} else {
		out = append(out, `"object":"text_completion","choices":[{"index":0,`...)
		hasText := false
		for _, m := range a.parts {
			hasText = hasText || keyIs(m.key, "text")
			out = append(appendMember(out, m), ',')
		}
		if !hasText {
			out = append(out, `"text":"",`...)
		}
	}
	out = append(out, `"logprobs":null,"finish_reason":`...)
	if a.finish == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, a.finish...)
	}
	out = append(out, "}]}"...)
	return out, validJSON(out)
}

func appendMember(out []byte, m member) []byte {
	out = append(append(out, m.key...), ':')
	if m.text {
		return append(append(append(out, '"'), m.value...), '"')
	}
	return append(out, m.value...)
}

// keyIs reports whether the JSON string k (quotes included, as canonicalKey gives it) is s.
func keyIs(k []byte, s string) bool {
	return len(k) == len(s)+2 && string(k[1:len(k)-1]) == s
}

// canonicalKey is the raw JSON string k (quotes included) written without escapes where it has
// any, so that one key is compared as one whatever way the engine escaped it. A key with no
// backslash, nearly every key, is returned as it is.
func canonicalKey(k []byte) []byte {
	if bytes.IndexByte(k, '\\') < 0 {
		return k
	}
	s, err := unquote(k)
	if err != nil {
		return k
	}
	return jsonString(s)
}

// jsonMembers walks the members of one JSON object in one pass, allocating nothing: next moves
// to the next member (key, its raw JSON string; value, its raw value), and err says why the walk
// ended early. Values are delimited, not checked: a caller that copies one into its output
// checks the output (assembler.answer).
type jsonMembers struct {
	data       []byte
	i          int
	close      byte // '}' for an object, ']' for an array
	started    bool
	key, value []byte
	err        error
}

// membersOf starts a walk over the object data (surrounding space allowed).
func membersOf(data []byte) (jsonMembers, error) {
	return walkOf(data, '{', '}')
}

// elementsOf starts a walk over the array data's elements (value; key stays nil).
func elementsOf(data []byte) (jsonMembers, error) {
	return walkOf(data, '[', ']')
}

func walkOf(data []byte, open, close byte) (jsonMembers, error) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != open {
		return jsonMembers{}, errNotObject
	}
	return jsonMembers{data: data, i: i + 1, close: close}, nil
}

var errMalformed = errors.New("malformed JSON")

func (m *jsonMembers) next() bool {
	if m.err != nil || m.i < 0 {
		return false
	}
	d := m.data
	i := skipSpace(d, m.i)
	if i < len(d) && d[i] == m.close {
		m.i = -1
		if skipSpace(d, i+1) != len(d) {
			m.err = errMalformed
		}
		return false
	}
	if m.started {
		if i >= len(d) || d[i] != ',' {
			m.err = errMalformed
			return false
		}
		i = skipSpace(d, i+1)
	}
	m.started = true
	if m.close == '}' {
		end, ok := stringEndStrict(d, i)
		if !ok {
			m.err = errMalformed
			return false
		}
		m.key = d[i:end]
		i = skipSpace(d, end)
		if i >= len(d) || d[i] != ':' {
			m.err = errMalformed
			return false
		}
		i = skipSpace(d, i+1)
	}
	end := valueEnd(d, i)
	if end <= i || end > len(d) {
		m.err = errMalformed
		return false
	}
	m.value, m.i = d[i:end], end
	return true
}

// stringEndStrict returns the index just past the JSON string starting at data[i], and false
// when no string starts there or it is not closed.
func stringEndStrict(data []byte, i int) (int, bool) {
	if i >= len(data) || data[i] != '"' {
		return 0, false
	}
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1, true
		}
	}
	return 0, false
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// relayAssembled reads the stream the worker sends for a whole-answer call (see streamedBody),
// assembles the answer and sends it to the client whole, as relayAnswer does. sent is when the
// request went to the worker: the first chunk's time feeds the worker's learned limit. Until the
// answer is whole the call may be preempted; cancelling it closes the stream, which the engine
// notices at its next token; the attempt hears every line (the silence bound, as for a stream)
// and its first token at the first chunk.
//
// An answer usher cannot assemble is not the worker's failure: the engine answered, usher could
// not read it; a stream that breaks off is.
func (s *Server) relayAssembled(c echo.Context, cl *call, resp *http.Response, sent time.Time, at *attempt) (routing.Outcome, error) {
	var out routing.Outcome
	a := newAssembler(cl.ep.chat, int(s.cfg.MaxResponseBytes))
	lines := newLineReader(resp.Body, int(s.cfg.MaxResponseBytes))
	defer lines.release()
	done := false
	for !done {
		line, err := lines.next()
		at.heard()
		payload, isData := eventData(line)
		switch {
		case !isData:
		case bytes.Equal(payload, []byte("[DONE]")):
			done = true
		default:
			if out.TTFT == 0 {
				out.TTFT = s.now().Sub(sent)
				at.firstToken()
			}
			if aerr := a.add(payload); aerr != nil {
				return out, fmt.Errorf("%w: worker %s: %v", errUpstreamAnswer, cl.worker, aerr)
			}
		}
		if err != nil && !done {
			if c.Request().Context().Err() != nil {
				return out, errClientGone
			}
			out.Failed = true
			return out, fmt.Errorf("%w: reading the stream of worker %s: %v", errUpstreamAnswer, cl.worker, err)
		}
	}
	// The answer is whole: it goes to the client even if a preemption chose it a moment ago.
	at.answering()
	data, ok := a.answer()
	if !ok {
		return out, fmt.Errorf("%w: worker %s: %v", errUpstreamAnswer, cl.worker, errAssembly)
	}
	s.firstByte(cl)
	ttft := out.TTFT
	if u, ok := parseUsage(data); ok {
		out = s.account(cl, u)
	} else if a.events > 0 {
		out = s.account(cl, estimatedUsage(cl, a.events))
	}
	out.TTFT = ttft
	if head, body := cl.rewriteAnswer(cl.withOwnCache(data)); len(head) > 0 {
		data = append(append(make([]byte, 0, len(head)+len(body)), head...), body...)
	} else {
		data = body
	}
	s.closeBooks(cl, nil, s.now())
	if err := c.Blob(http.StatusOK, echo.MIMEApplicationJSON, data); err != nil {
		return out, errClientGone
	}
	return out, nil
}

// isEventStream reports whether an answer is server-sent events.
func isEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "text/event-stream")
}
