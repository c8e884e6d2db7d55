package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/routing"
)

// A preemptible (standard or batch) call that wants a whole answer is asked of its worker as a
// stream, and usher assembles the whole answer itself (assembler), for two reasons. A stream
// shows when the engine has prefilled the prompt (its first chunk), which the worker's prefill
// budget counts (routing.Request.Interactive). And a preempted call is cancelled by closing its
// connection, which llama.cpp's server notices for a whole answer only about once a second, so
// the cancelled answer kept its slot and the interactive call it was cancelled for waited behind
// it inside the engine; a stream it writes token by token, and stops within a token. Only
// requests whose answer the stream carries entirely are asked so (streamedBody); any other goes
// as it came.

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
		if !streamableKeys[f.key] || (f.key == "n" && !isNull(f.value) && string(f.value) != "1") {
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
type assembler struct {
	chat   bool
	limit  int
	size   int
	top    []member // in first-seen order
	role   string
	parts  []member // the choice's members; text ones hold a JSON string being joined
	text   map[string]*strings.Builder
	finish json.RawMessage
	events int // chunks that carried output
}

type member struct {
	key   string
	value json.RawMessage
}

func newAssembler(chat bool, limit int) *assembler {
	return &assembler{chat: chat, limit: limit, text: map[string]*strings.Builder{}}
}

// add takes one chunk's payload (the data of one event, [DONE] excluded); it keeps copies of
// what it needs, so payload may be reused afterwards. A chunk that is not a JSON object,
// carries an error or another choice than index 0 ends the assembly.
func (a *assembler) add(payload []byte) error {
	a.size += len(payload)
	if a.size > a.limit {
		return fmt.Errorf("%w (%d bytes)", errAnswerTooLarge, a.limit)
	}
	if !json.Valid(payload) {
		return fmt.Errorf("%w: a chunk is not JSON", errAssembly)
	}
	fields, err := objectFields(payload, nil)
	if err != nil {
		return fmt.Errorf("%w: a chunk: %v", errAssembly, err)
	}
	var choices []struct {
		Index        int             `json:"index"`
		Delta        json.RawMessage `json:"delta"`
		Text         *string         `json:"text"`
		FinishReason json.RawMessage `json:"finish_reason"`
	}
	for _, f := range fields {
		switch f.key {
		case "error":
			if !isNull(f.value) {
				return fmt.Errorf("%w: the worker sent an error: %s", errAssembly, truncate(f.value, 512))
			}
		case "object":
		case "choices":
			if !isNull(f.value) && json.Unmarshal(f.value, &choices) != nil {
				return fmt.Errorf("%w: choices is not a list of choices", errAssembly)
			}
		default:
			setMember(&a.top, f.key, f.value)
		}
	}
	for _, c := range choices {
		if c.Index != 0 {
			return fmt.Errorf("%w: a chunk carries choice %d", errAssembly, c.Index)
		}
		if len(c.FinishReason) > 0 && !isNull(c.FinishReason) {
			a.finish = c.FinishReason // decoded by encoding/json: a copy already
		}
		// A chat choice carries a delta, a completion's its text; the other is ignored, so no
		// member of the answer's choice can appear twice.
		if c.Text != nil && !a.chat {
			a.join("text", *c.Text)
		}
		var delta []jsonField
		if a.chat && len(c.Delta) > 0 && !isNull(c.Delta) {
			if delta, err = objectFields(c.Delta, nil); err != nil {
				return fmt.Errorf("%w: a delta: %v", errAssembly, err)
			}
		}
		for _, d := range delta {
			k, v := d.key, d.value
			var s string
			switch {
			case k == "role":
				_ = json.Unmarshal(v, &a.role)
			case isNull(v):
			case len(v) > 0 && v[0] == '"' && json.Unmarshal(v, &s) == nil:
				a.join(k, s)
			default:
				setMember(&a.parts, k, v)
			}
		}
		if carriesOutput(payload) {
			a.events++
		}
	}
	return nil
}

// setMember sets a copy of v as k's value in list, in place if k is there, else at the end.
func setMember(list *[]member, k string, v []byte) {
	v = bytes.Clone(v)
	for i := range *list {
		if (*list)[i].key == k {
			(*list)[i].value = v
			return
		}
	}
	*list = append(*list, member{k, v})
}

func (a *assembler) join(k, s string) {
	b, ok := a.text[k]
	if !ok {
		b = &strings.Builder{}
		a.text[k] = b
		a.parts = append(a.parts, member{key: k})
	}
	b.WriteString(s)
}

// answer is the whole answer, a JSON object.
func (a *assembler) answer() []byte {
	out := make([]byte, 0, 512+a.size/4)
	out = append(out, '{')
	for _, m := range a.top {
		out = appendMember(out, m.key, m.value)
		out = append(out, ',')
	}
	object := "text_completion"
	if a.chat {
		object = "chat.completion"
	}
	out = appendMember(out, "object", jsonString(object))
	out = append(out, `,"choices":[{"index":0,`...)
	if a.chat {
		role := a.role
		if role == "" {
			role = "assistant"
		}
		out = append(out, `"message":{`...)
		out = appendMember(out, "role", jsonString(role))
		hasContent := false
		for _, m := range a.parts {
			hasContent = hasContent || m.key == "content"
			out = append(out, ',')
			out = appendMember(out, m.key, a.value(m))
		}
		if !hasContent {
			out = append(out, `,"content":null`...)
		}
		out = append(out, "},"...)
	} else {
		for _, m := range a.parts {
			out = appendMember(out, m.key, a.value(m))
			out = append(out, ',')
		}
		if _, ok := a.text["text"]; !ok {
			out = append(out, `"text":"",`...)
		}
	}
	out = append(out, `"logprobs":null,"finish_reason":`...)
	if a.finish == nil {
		out = append(out, "null"...)
	} else {
		out = append(out, a.finish...)
	}
	return append(out, "}]}"...)
}

func (a *assembler) value(m member) []byte {
	if b, ok := a.text[m.key]; ok {
		return jsonString(b.String())
	}
	return m.value
}

func appendMember(out []byte, key string, value []byte) []byte {
	return append(append(append(out, jsonString(key)...), ':'), value...)
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
// notices at its next token; firstChunk is called at the first chunk, from when it does.
func (s *Server) relayAssembled(c echo.Context, cl *call, resp *http.Response, sent time.Time, begin func() bool, firstChunk func()) (routing.Outcome, error) {
	var out routing.Outcome
	a := newAssembler(cl.ep.chat, int(s.cfg.MaxResponseBytes))
	lines := newLineReader(resp.Body, int(s.cfg.MaxResponseBytes))
	done := false
	for !done {
		line, err := lines.next()
		payload, isData := eventData(line)
		switch {
		case !isData:
		case bytes.Equal(payload, []byte("[DONE]")):
			done = true
		default:
			if out.TTFT == 0 {
				out.TTFT = s.now().Sub(sent)
				firstChunk()
			}
			if aerr := a.add(payload); aerr != nil {
				out.Failed = !errors.Is(aerr, errAnswerTooLarge)
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
	begin()
	data := a.answer()
	s.firstByte(cl)
	ttft := out.TTFT
	if u, ok := parseUsage(data); ok {
		out = s.account(cl, u)
	} else if a.events > 0 {
		out = s.account(cl, estimatedUsage(cl, a.events))
	}
	out.TTFT = ttft
	data = cl.rewriteAnswer(cl.withOwnCache(data))
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
