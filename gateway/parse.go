package gateway

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"
)

// The parse stage: the body is read once, checked, decoded once into the call, and the body the
// worker gets is built from exactly what was decoded, so the gateway and the engine can never read
// two different requests from one body (Go's encoding/json matches keys without regard to case and
// keeps the last duplicate; the engines behind usher are Python or C++ and read JSON their own way).
//
// The rules, for the top-level object and every object usher reads inside it (messages, their
// content parts, stream_options):
//   - a key that appears twice, after JSON unescaping, is refused (400): which one an engine reads
//     is the engine's choice, not usher's;
//   - a key that differs from one usher reads only in case ("Model", "MAX_TOKENS") is refused
//     (400): an engine that folds case would read it;
//   - usher reads keys exactly as OpenAI spells them; every other key goes to the worker as sent;
//   - the client's `priority` never reaches a worker (a worker that schedules by it gets the
//     class usher assigned; see upstreamBody);
//   - nor do the members that steer an engine's own machinery (engineControlKeys).

// maxOutputTokens bounds max_tokens and max_completion_tokens: a larger value is refused, so no
// token arithmetic downstream can overflow. No model of today generates more.
const maxOutputTokens = 1 << 24

// readKeys are the top-level keys usher reads or drops; their re-cased variants are refused.
var readKeys = append([]string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"n_predict", "n", "best_of", "messages", "prompt", "input", "service_tier", "priority", saltKey, extraKey}, engineControlKeys...)

// extraKey is SGLang's other cache-isolation member, which it appends to cache_salt. Both must be
// strings: SGLang raises a TypeError on any other value that its request model lets through (a
// list of strings), and answers 500, which would count against the worker, so a tenant could
// open every SGLang worker's circuit; usher refuses them first.
const extraKey = "extra_key"

// engineControlKeys are the request members with which vLLM and SGLang let their caller steer
// the engine itself rather than the answer: the KV hand-off of a disaggregated fleet (vLLM's
// kv_transfer_params name a host the engine fetches KV blocks from, and the blocks; SGLang's
// bootstrap_* the same), the engine's request id (rid, request_id: an id another request already
// has collides with it), the data-parallel rank, a LoRA adapter outside the model names usher
// checks (lora_path), code or classes to load (custom_logit_processor, logits_processors) and
// metric labels (custom_labels). A tenant that set them could make an engine connect where it
// chooses, decode from another request's KV, or use what its tier does not allow, so none of
// them reaches a worker: buildUpstream drops them, as it drops priority.
var engineControlKeys = []string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room",
	"rid", "request_id", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank", "lora_path",
	"custom_logit_processor", "logits_processors", "custom_labels"}

// outputLimitKeys are the members that bound a call's output, in whichever order an engine reads
// them (llama.cpp n_predict first, vLLM max_completion_tokens).
var outputLimitKeys = []string{"max_tokens", "max_completion_tokens", "n_predict"}

// maxChoices bounds `n` and `best_of`, the choices generated for one prompt: each is an answer's
// worth of output tokens.
const maxChoices = 128

var (
	messageKeys = []string{"role", "content"}
	partKeys    = []string{"type", "text"}
	optionKeys  = []string{"include_usage"}
)

// jsonField is one member of a JSON object: its key, unescaped, and its raw key and value bytes
// (sub-slices of the decoded document), the value at offset at of the object's bytes.
type jsonField struct {
	key    string
	rawKey []byte
	value  []byte
	at     int
}

// objectFields splits the JSON object data (which must be valid JSON: json.Valid) into its
// members in order. It refuses duplicate keys and keys that equal one of known but for case. A
// value that is not an object gives errNotObject.
func objectFields(data []byte, known []string) ([]jsonField, error) {
	return splitObject(nil, data, known, 0)
}

// splitObject is objectFields, appending the members to fields[:0] (a caller's buffer, so that a
// hot path splits without allocating). With maxDepth > 0 data need not be valid: the split is
// also the one pass that checks the whole of data as parseBody must (JSON's grammar as
// encoding/json.Valid reads it, what an engine must reject, and objects and arrays nested at
// most maxDepth deep, data itself level 1; see scanValue), and its first error is errSyntax
// wherever data is not valid JSON, whatever else comes first.
func splitObject(fields []jsonField, data []byte, known []string, maxDepth int) ([]jsonField, error) {
	fields, err := splitMembers(fields, data, known, maxDepth)
	if err != nil && maxDepth > 0 && !errors.Is(err, errSyntax) && !validJSON(data) {
		return nil, errSyntax
	}
	return fields, err
}

func splitMembers(fields []jsonField, data []byte, known []string, maxDepth int) ([]jsonField, error) {
	checked := maxDepth > 0
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return nil, errNotObject
	}
	fields = fields[:0]
	i = skipSpace(data, i+1)
	if i < len(data) && data[i] == '}' {
		if checked && skipSpace(data, i+1) != len(data) {
			return nil, errSyntax
		}
		return fields, nil
	}
	for i < len(data) {
		end, vstart, vend := 0, 0, 0
		if checked {
			var err error
			if data[i] != '"' {
				return nil, errSyntax
			}
			if end, err = scanString(data, i, true); err != nil {
				return nil, err
			}
			colon := skipSpace(data, end)
			if colon >= len(data) || data[colon] != ':' {
				return nil, errSyntax
			}
			vstart = skipSpace(data, colon+1)
			if vend, err = scanValue(data, vstart, min(maxDepth, maxJSONNesting)-1, true); err != nil {
				return nil, err
			}
		} else {
			end = stringEnd(data, i)
			vstart = skipSpace(data, skipSpace(data, end)+1)
			vend = valueEnd(data, vstart)
		}
		rawKey := data[i:end]
		key, err := unquoteInterned(rawKey)
		if err != nil {
			return nil, err
		}
		for _, f := range fields {
			if f.key == key {
				return nil, fmt.Errorf("the key %q appears twice", key)
			}
		}
		// The known keys are lowercase ASCII (TestKnownKeysAreLowercase), and ASCII folds only
		// to ASCII of its length: a lowercase ASCII key is a case variant of none of them, an
		// ASCII key of another length is no case variant of one (a non-ASCII one may be: K, the
		// Kelvin sign, folds to k).
		if ascii, upper := caseOf(key); !ascii || upper {
			for _, k := range known {
				if ascii && len(key) != len(k) {
					continue
				}
				if key != k && strings.EqualFold(key, k) {
					return nil, fmt.Errorf("the key %q differs from %q only in case", key, k)
				}
			}
		}
		fields = append(fields, jsonField{key: key, rawKey: rawKey, value: data[vstart:vend], at: vstart})
		i = skipSpace(data, vend)
		if !checked && (i >= len(data) || data[i] == '}') {
			break
		}
		if checked {
			switch {
			case i < len(data) && data[i] == ',':
			case i < len(data) && data[i] == '}' && skipSpace(data, i+1) == len(data):
				return fields, nil
			default:
				return nil, errSyntax
			}
		}
		i = skipSpace(data, i+1) // the comma
	}
	if checked {
		return nil, errSyntax
	}
	return fields, nil
}

var errNotObject = errors.New("not a JSON object")

// caseOf reports whether s is ASCII throughout, and whether it holds an upper-case ASCII letter.
func caseOf(s string) (ascii, upper bool) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= utf8.RuneSelf:
			return false, upper
		case c >= 'A' && c <= 'Z':
			upper = true
		}
	}
	return true, upper
}

func skipSpace(data []byte, i int) int {
	for i < len(data) && (data[i] == ' ' || data[i] == '\t' || data[i] == '\n' || data[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the JSON string starting at data[i] (a quote); data is
// valid JSON. It looks for the first quote or backslash eight bytes at a time: a quote ends the
// string, a backslash begins an escape whose next byte cannot end it (len(data) when the string
// does not end).
func stringEnd(data []byte, i int) int {
	j := i + 1
	for j < len(data) {
		if j+8 <= len(data) {
			x := binary.LittleEndian.Uint64(data[j:])
			q, b := x^quotes, x^slashes
			if t := ((q-ones)&^q | (b-ones)&^b) & highs; t == 0 {
				j += 8
				continue
			} else {
				j += bits.TrailingZeros64(t) >> 3
			}
		} else if c := data[j]; c != '"' && c != '\\' {
			j++
			continue
		}
		if data[j] == '"' {
			return j + 1
		}
		j += 2
	}
	return len(data)
}

// valueEnd returns the index just past the JSON value starting at data[i]; data is valid JSON.
func valueEnd(data []byte, i int) int {
	if i >= len(data) {
		return i
	}
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(data); j++ {
			switch data[j] {
			case '"':
				j = stringEnd(data, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(data)
	}
	j := i
	for j < len(data) {
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
		j++
	}
	return j
}

// unquote decodes a raw JSON string; most keys have no escapes and cost no decoding.
func unquote(raw []byte) (string, error) {
	if bytes.IndexByte(raw, '\\') < 0 && len(raw) >= 2 {
		return string(raw[1 : len(raw)-1]), nil
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}

// interned are the strings usher reads in request bodies (the keys it knows, the roles of
// messages): unquoteInterned returns these without allocating a copy of each.
var interned = func() map[string]string {
	m := map[string]string{}
	for _, list := range [][]string{readKeys, messageKeys, partKeys, optionKeys, scalarKeys, outputLimitKeys,
		{"system", "developer", "user", "assistant", "tool", "function", "text", "image_url"}} {
		for _, k := range list {
			m[k] = k
		}
	}
	for k := range streamableKeys {
		m[k] = k
	}
	return m
}()

// unquoteInterned is unquote, returning the interned copy of a string without escapes that is
// one of interned.
func unquoteInterned(raw []byte) (string, error) {
	if len(raw) >= 2 && bytes.IndexByte(raw, '\\') < 0 {
		if s, ok := interned[string(raw[1:len(raw)-1])]; ok {
			return s, nil
		}
	}
	return unquote(raw)
}

// parse is the first stage: read the body within its bounds, decode it into cl and build the
// upstream body.
func (s *Server) parse(c echo.Context, cl *call) error {
	body, err := s.readBody(c, cl)
	if err != nil {
		return err
	}
	return parseBody(body, cl, s.cfg.MaxJSONDepth)
}

// Buffer sizes of readBody for a body without Content-Length: the first, then doubled.
const firstBodyBuffer = 16 << 10

// readBody reads the request body within the configured bound, each byte reserved in the body
// bound (bodyBytes) before it is read: all of them at once from Content-Length, else as the
// buffer doubles. What it reserves cl.body holds until the call ends.
func (s *Server) readBody(c echo.Context, cl *call) ([]byte, error) {
	r := c.Request()
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, TooLarge(s.cfg.MaxBodyBytes)
	}
	cl.body = s.bodies.hold(cl.principal.TenantID)
	size := int64(firstBodyBuffer)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1 // room to read the end of the body
	}
	if err := cl.body.grow(size); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, size)
	body := http.MaxBytesReader(c.Response(), r.Body, s.cfg.MaxBodyBytes)
	for {
		if len(buf) == cap(buf) {
			more := min(int64(cap(buf)), s.cfg.MaxBodyBytes+1-int64(cap(buf)))
			if more <= 0 {
				return nil, TooLarge(s.cfg.MaxBodyBytes)
			}
			if err := cl.body.grow(more); err != nil {
				return nil, err
			}
			buf = append(make([]byte, 0, int64(cap(buf))+more), buf...)
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		switch {
		case err == nil:
			continue
		case err == io.EOF:
			return buf, nil
		}
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return nil, TooLarge(s.cfg.MaxBodyBytes)
		case r.Context().Err() != nil:
			return nil, errClientGone
		default:
			return nil, BadRequest("", "reading the request body: %v", err)
		}
	}
}

func isNull(raw []byte) bool { return bytes.Equal(raw, []byte("null")) }

// parseBody reads body into cl for endpoint cl.ep and builds the upstream body. Every error is a
// 400 naming the field. Besides JSON's grammar, the body must be what every engine can read:
// UTF-8 throughout, no lone UTF-16 surrogate escapes, objects and arrays nested at most maxDepth
// deep (the body itself is level 1); an engine that fails on such input drops the connection,
// and usher would count that against the worker.
func parseBody(body []byte, cl *call, maxDepth int) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return BadRequest("", "request body is empty; expected a JSON object")
	}
	var buf [16]jsonField
	fields, err := splitObject(buf[:0], body, readKeys, maxDepth)
	switch {
	case errors.Is(err, errSyntax):
		var v any
		err := json.Unmarshal(body, &v)
		return BadRequest("", "request body is not valid JSON: %v", err)
	case errors.Is(err, errNotObject):
		return BadRequest("", "request body must be a JSON object")
	case errors.Is(err, errInputDepth):
		return BadRequest("", "request body: JSON nests deeper than %d levels", maxDepth)
	}
	if err != nil {
		return BadRequest("", "request body: %v", err)
	}
	promptKey := "prompt"
	switch {
	case cl.ep.chat:
		promptKey = "messages"
	case cl.ep.embed:
		promptKey = "input"
	}
	var messages, prompt, input []byte
	rendered := 0 // bytes of members besides the prompt that the engine may render
	for _, f := range fields {
		v := f.value
		if isNull(v) {
			continue
		}
		rendered += renderedBytes(f, promptKey)
		switch f.key {
		case "model":
			// The body is valid UTF-8 JSON (checked above): a string needs no decoder.
			if v[0] != '"' {
				return BadRequest("model", "'model' must be a string")
			}
			if cl.model, err = unquote(v); err != nil {
				return BadRequest("model", "'model' must be a string")
			}
		case "stream":
			switch string(v) {
			case "true", "false":
				cl.stream = v[0] == 't'
			default:
				return BadRequest("stream", "'stream' must be a boolean")
			}
		case "stream_options":
			opts, err := objectFields(v, optionKeys)
			if err != nil {
				return BadRequest("stream_options", "'stream_options' must be an object: %v", err)
			}
			for _, o := range opts {
				if o.key == "include_usage" && json.Unmarshal(o.value, &cl.clientWantsUsage) != nil {
					return BadRequest("stream_options", "'stream_options.include_usage' must be a boolean")
				}
			}
		case "max_tokens", "max_completion_tokens", "n_predict":
			// Engines differ in which of these wins (llama.cpp reads n_predict first, vLLM
			// max_completion_tokens): the largest one is what the call may cost.
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 0 || n > maxOutputTokens {
				return BadRequest(f.key, "'%s' must be an integer from 0 to %d", f.key, maxOutputTokens)
			}
			cl.maxOutput = max(cl.maxOutput, int(n))
		case "n", "best_of":
			// best_of (vLLM, OpenAI's legacy completions) generates that many and returns n.
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil || n < 1 || n > maxChoices {
				return BadRequest(f.key, "'%s' must be an integer from 1 to %d", f.key, maxChoices)
			}
			cl.choices = max(cl.choices, int(n))
		case "messages":
			messages = v
		case "prompt":
			prompt = v
		case "input":
			input = v
		case "service_tier":
			if json.Unmarshal(v, &cl.serviceTier) != nil {
				return BadRequest("service_tier", "'service_tier' must be a string")
			}
		case saltKey, extraKey:
			if v[0] != '"' {
				return BadRequest(f.key, "'%s' must be a string", f.key)
			}
		}
	}
	if cl.model == "" {
		return BadRequest("model", "missing required parameter: 'model'")
	}
	switch {
	case cl.ep.chat:
		err = cl.parseMessages(messages)
	case cl.ep.embed:
		err = cl.parseInput(input)
	default:
		err = cl.parsePrompt(prompt)
	}
	if err != nil {
		return err
	}
	if rendered > 0 {
		cl.promptTokens = addTokens(cl.promptTokens, estimateBytes(rendered))
	}
	cl.upstream = cl.buildUpstream(body, fields)
	return nil
}

// parseMessages renders the messages' text in order, the prefix structure a worker's prompt cache
// sees: a later turn of a conversation extends the earlier turn's text. The prompt estimate
// counts every byte of every message (any member a chat template may render: content parts of
// every type, tool calls, names, reasoning), media payloads by their own rule (mediaPartTokens).
func (cl *call) parseMessages(raw []byte) error {
	if len(raw) == 0 || raw[0] != '[' {
		return BadRequest("messages", "missing required parameter: 'messages' must be a non-empty array")
	}
	// The body is valid JSON (parseBody checked it): its lists are walked, not decoded again.
	msgs, err := elementsOf(raw)
	if err != nil {
		return BadRequest("messages", "missing required parameter: 'messages' must be a non-empty array")
	}
	var b strings.Builder
	// The text is at most the messages' bytes; a long one grows as it needs.
	b.Grow(min(len(raw), 64<<10))
	var buf [4]jsonField
	rendered, media := 0, 0 // bytes of the messages counted as text, media parts
	i := 0
	for ; msgs.next(); i++ {
		m := msgs.value
		fields, err := splitObject(buf[:0], m, messageKeys, 0)
		if err != nil {
			return BadRequest("messages", "messages[%d]: %v", i, err)
		}
		var role string
		var content []byte
		for _, f := range fields {
			switch f.key {
			case "role":
				role = stringValue(f.value)
			case "content":
				content = f.value
			}
		}
		if role == "" {
			return BadRequest("messages", "messages[%d].role is required", i)
		}
		b.WriteString(role)
		b.WriteByte(' ')
		mediaBytes, mediaParts, err := appendContent(&b, content)
		if err != nil {
			return BadRequest("messages", "messages[%d].content: %v", i, err)
		}
		b.WriteByte('\n')
		rendered += len(m) - mediaBytes
		media += mediaParts
	}
	if msgs.err != nil || i == 0 {
		return BadRequest("messages", "missing required parameter: 'messages' must be a non-empty array")
	}
	cl.prompt = b.String()
	cl.promptTokens = addTokens(estimateBytes(rendered), media*mediaPartTokens)
	cl.messages = raw
	return nil
}

// mediaPartTokens is what a content part of a medium (an image, audio, video or file) counts for
// in the prompt estimate instead of its bytes: a data URL's bytes say nothing of the tokens an
// engine makes of it, and a URL says nothing at all. It is OpenAI's rule for one high-detail
// image at its largest (85 + 170 per 512-pixel tile, 8 tiles); engines differ by model.
const mediaPartTokens = 85 + 170*8

// mediaTypes are the content part types whose payload is a medium; the payload is the member of
// the part named in mediaPayloadKeys (vLLM's and OpenAI's chat and Responses part shapes).
var (
	mediaTypes = []string{"image_url", "input_image", "image", "image_embeds", "input_audio", "audio_url",
		"audio", "audio_embeds", "video_url", "video", "file", "input_file"}
	mediaPayloadKeys = []string{"image_url", "image", "image_embeds", "input_audio", "audio_url", "audio",
		"audio_embeds", "video_url", "video", "file", "file_data"}
)

// appendContent writes a message's content, a string or an array of parts, to the routing text:
// the text member of every part that has one (text, input_text, output_text). For the prompt
// estimate it returns the bytes of the media payloads in the content (counted as mediaParts
// parts of mediaPartTokens each, not by their bytes); every other byte of a message counts.
func appendContent(b *strings.Builder, raw []byte) (mediaBytes, mediaParts int, err error) {
	if len(raw) == 0 || isNull(raw) {
		return 0, 0, nil
	}
	if raw[0] == '"' {
		if bytes.IndexByte(raw, '\\') < 0 {
			b.Write(raw[1 : len(raw)-1])
			return 0, 0, nil
		}
		s, err := unquote(raw)
		if err != nil {
			return 0, 0, err
		}
		b.WriteString(s)
		return 0, 0, nil
	}
	parts, err := elementsOf(raw)
	if err != nil {
		return 0, 0, errors.New("must be a string or an array of content parts")
	}
	for i := 0; parts.next(); i++ {
		fields, err := objectFields(parts.value, partKeys)
		if err != nil {
			return 0, 0, fmt.Errorf("part %d: %w", i, err)
		}
		var typ, text string
		payload := 0
		for _, f := range fields {
			switch f.key {
			case "type":
				typ = stringValue(f.value)
			case "text":
				text = stringValue(f.value)
			}
			if slices.Contains(mediaPayloadKeys, f.key) {
				payload += len(f.value)
			}
		}
		b.WriteString(text)
		if slices.Contains(mediaTypes, typ) {
			mediaBytes += payload
			mediaParts++
		}
	}
	if parts.err != nil {
		return 0, 0, errors.New("must be a string or an array of content parts")
	}
	return mediaBytes, mediaParts, nil
}

// stringValue is the raw JSON value's string, or "" when it is not a string (as decoding it into
// a string would leave it).
func stringValue(raw []byte) string {
	if len(raw) == 0 || raw[0] != '"' {
		return ""
	}
	s, err := unquoteInterned(raw)
	if err != nil {
		return ""
	}
	return s
}

// parsePrompt reads the prompt of /v1/completions: a string, an array of strings, an array of
// token ids, or an array of such arrays (see estimateInputs).
func (cl *call) parsePrompt(raw []byte) error {
	if len(raw) == 0 {
		return BadRequest("prompt", "missing required parameter: 'prompt'")
	}
	first, tokens, count, err := estimateInputs(raw, "prompt")
	if err != nil {
		return err
	}
	cl.prompt, cl.promptTokens, cl.prompts = first, tokens, count
	return nil
}

// maxTokenCount caps token estimates so that no sum of them overflows an int anywhere.
const maxTokenCount = 1 << 40

// addTokens adds token counts, saturating at maxTokenCount.
func addTokens(a, b int) int { return min(a+min(b, maxTokenCount), maxTokenCount) }

// estimateTokens is a cheap prompt token estimate (about four bytes a token, as OpenAI's rule of
// thumb); accounting is reconciled with the worker's real usage afterwards.
func estimateTokens(text string) int { return estimateBytes(len(text)) }

// estimateBytes is estimateTokens of n bytes of text.
func estimateBytes(n int) int { return n/4 + 1 }

// scalarKeys are the members usher reads that an engine never renders into the prompt.
var scalarKeys = []string{"model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
	"n_predict", "n", "best_of", "service_tier", "priority", saltKey, extraKey}

// renderedBytes is how many bytes of the member f count toward the prompt estimate besides the
// endpoint's own prompt member (promptKey): every string, array or object usher does not read as
// a scalar. Chat templates render tools, functions and documents, engines compile
// response_format and guided-decoding schemas, templates may read any extra variable
// (chat_template_kwargs, even a chat_template): counting all of them bounds what the engine
// renders from above; the members honest clients send besides (stop, logit_bias, metadata) are
// small. Engine controls never reach the engine (engineControlKeys): they count nothing.
func renderedBytes(f jsonField, promptKey string) int {
	if f.key == promptKey || slices.Contains(scalarKeys, f.key) || slices.Contains(engineControlKeys, f.key) {
		return 0
	}
	switch f.value[0] {
	case '"', '[', '{':
		return len(f.value)
	}
	return 0
}

// buildUpstream returns the body to send to the worker: the client's members in order, as sent,
// except that the client's `priority` and engine controls (engineControlKeys) are dropped, so
// are output limits set to null (null is
// "not set" to every engine; boundOutput may then add max_tokens without a duplicate), and, for
// a stream whose client did not ask for usage, stream_options asks for it (the proxy removes
// that chunk again), so the gateway learns real token counts of every request. A body that needs
// no change is returned as it is.
func (cl *call) buildUpstream(body []byte, fields []jsonField) []byte {
	addUsage := cl.stream && !cl.clientWantsUsage
	changed := addUsage
	for _, f := range fields {
		switch {
		case dropped(f):
			changed = true
		case f.key == "model":
			cl.modelSpan = [2]int{f.at, f.at + len(f.value)}
		}
	}
	if !changed {
		return body
	}
	out := make([]byte, 0, len(body)+40)
	out = append(out, '{')
	sep := func() {
		if len(out) > 1 {
			out = append(out, ',')
		}
	}
	for _, f := range fields {
		if dropped(f) || f.key == "stream_options" && addUsage {
			continue
		}
		sep()
		out = append(append(out, f.rawKey...), ':')
		if f.key == "model" {
			cl.modelSpan = [2]int{len(out), len(out) + len(f.value)}
		}
		out = append(out, f.value...)
	}
	if addUsage {
		sep()
		out = append(out, `"stream_options":{"include_usage":true`...)
		for _, f := range fields {
			if f.key != "stream_options" || isNull(f.value) {
				continue
			}
			opts, _ := objectFields(f.value, optionKeys)
			for _, o := range opts {
				if o.key != "include_usage" {
					out = append(append(append(append(out, ','), o.rawKey...), ':'), o.value...)
				}
			}
		}
		out = append(out, '}')
	}
	return append(out, '}')
}

// dropped reports whether buildUpstream leaves the client's member f out.
func dropped(f jsonField) bool {
	return f.key == "priority" || isNull(f.value) && slices.Contains(outputLimitKeys, f.key) ||
		slices.Contains(engineControlKeys, f.key)
}

// boundOutput settles what the call may generate and reserves it (cl.expected): the output
// limit the client set, or, when it set none, fallback, which is then added to the upstream body
// as max_tokens (what vLLM, llama.cpp without n_predict, and OpenAI read), so the engine's bound
// and usher's reservation are one number. The reservation counts every prompt of a batch and
// every choice: prompts x choices x the bound, saturating at maxTokenCount. The model span is
// unchanged (the member goes last).
func (cl *call) boundOutput(fallback int) {
	if cl.maxOutput < 0 {
		cl.maxOutput = fallback
		cl.upstream = withMember(cl.upstream, "max_tokens", strconv.AppendInt(nil, int64(fallback), 10))
	}
	cl.expected = min(cl.maxOutput*cl.choices*cl.prompts, maxTokenCount)
}

// withMember returns the JSON object b with the member key: value added last, in a new slice.
func withMember(b []byte, key string, value []byte) []byte {
	end := bytes.LastIndexByte(b, '}')
	out := make([]byte, 0, len(b)+len(key)+len(value)+4)
	out = append(out, b[:end]...)
	if len(bytes.TrimSpace(b[bytes.IndexByte(b, '{')+1:end])) > 0 {
		out = append(out, ',')
	}
	out = append(append(append(append(out, '"'), key...), '"', ':'), value...)
	return append(out, b[end:]...)
}

// upstreamBody is the body for a worker: for one that calls the model by another name
// (routing.WorkerSpec.ModelAliases) the model is that name, given as engineModel ("" or the
// call's own model: no change); for one that schedules by priority (vLLM's `priority` field,
// lower first) the call's class is added, the client's own having been dropped. A body that
// needs neither is cl.upstream itself, not a copy.
func (cl *call) upstreamBody(handoff bool, engineModel string) []byte {
	b := cl.upstream
	if engineModel != "" && engineModel != cl.model {
		name := jsonString(engineModel)
		out := make([]byte, 0, len(b)+len(name)+24)
		out = append(out, b[:cl.modelSpan[0]]...)
		out = append(out, name...)
		b = append(out, b[cl.modelSpan[1]:]...)
	}
	if !handoff {
		return b
	}
	return withMember(b, "priority", strconv.AppendInt(nil, int64(cl.class), 10))
}
