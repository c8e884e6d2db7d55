package gateway

import (
	"bytes"
	"encoding/json"
	"strings"
)

// endpoint is one of the OpenAI inference endpoints the gateway proxies.
type endpoint struct {
	path string // upstream path, e.g. /v1/chat/completions
	chat bool   // messages (chat) or prompt (completions)
}

var (
	chatEndpoint       = endpoint{path: "/v1/chat/completions", chat: true}
	completionEndpoint = endpoint{path: "/v1/completions"}
)

// inferenceRequest holds the fields of a chat or completion request that the gateway reads. The
// body itself is forwarded as sent, except for stream_options (see forUpstream).
type inferenceRequest struct {
	Model               string          `json:"model"`
	Stream              bool            `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Messages            []chatMessage   `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	ServiceTier         string          `json:"service_tier"`

	// clientWantsUsage is stream_options.include_usage as the client sent it.
	clientWantsUsage bool
	// prompt is the text the worker will prefill, for routing and token estimates.
	prompt string
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parseInferenceRequest decodes and checks body for ep. Errors are 400s naming the field.
func parseInferenceRequest(body []byte, ep endpoint) (*inferenceRequest, error) {
	var r inferenceRequest
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, BadRequest("", "request body is empty; expected a JSON object")
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, BadRequest("", "request body is not valid JSON: %v", err)
	}
	if r.Model == "" {
		return nil, BadRequest("model", "missing required parameter: 'model'")
	}
	for name, v := range map[string]*int{"max_tokens": r.MaxTokens, "max_completion_tokens": r.MaxCompletionTokens} {
		if v != nil && *v < 0 {
			return nil, BadRequest(name, "'%s' must be a non-negative integer", name)
		}
	}
	if len(r.StreamOptions) > 0 && !isNull(r.StreamOptions) {
		var so struct {
			IncludeUsage bool `json:"include_usage"`
		}
		if err := json.Unmarshal(r.StreamOptions, &so); err != nil {
			return nil, BadRequest("stream_options", "'stream_options' must be an object")
		}
		r.clientWantsUsage = so.IncludeUsage
	}
	var err error
	if ep.chat {
		r.prompt, err = chatPrompt(r.Messages)
	} else {
		r.prompt, err = completionPrompt(r.Prompt)
	}
	if err != nil {
		return nil, err
	}
	return &r, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// chatPrompt renders the messages' text in order, which is the prefix structure a worker's
// prompt cache sees: a later turn of a conversation extends the earlier turn's text.
func chatPrompt(msgs []chatMessage) (string, error) {
	if len(msgs) == 0 {
		return "", BadRequest("messages", "missing required parameter: 'messages' must be a non-empty array")
	}
	var b strings.Builder
	for i, m := range msgs {
		if m.Role == "" {
			return "", BadRequest("messages", "messages[%d].role is required", i)
		}
		b.WriteString(m.Role)
		b.WriteByte(' ')
		if err := appendContent(&b, m.Content); err != nil {
			return "", BadRequest("messages", "messages[%d].content: %v", i, err)
		}
		b.WriteByte('\n')
	}
	return b.String(), nil
}

// appendContent writes a message's content, a string or an array of parts of which the text
// parts count.
func appendContent(b *strings.Builder, raw json.RawMessage) error {
	if len(raw) == 0 || isNull(raw) {
		return nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		b.WriteString(s)
		return nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return errorString("must be a string or an array of content parts")
	}
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return nil
}

// completionPrompt takes the prompt of /v1/completions: a string, or an array of strings of
// which the first is routed on.
func completionPrompt(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || isNull(raw) {
		return "", BadRequest("prompt", "missing required parameter: 'prompt'")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err == nil && len(list) > 0 {
		return list[0], nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil && len(ids) > 0 {
		return "", nil
	}
	return "", BadRequest("prompt", "'prompt' must be a string or a non-empty array of strings")
}

type errorString string

func (e errorString) Error() string { return string(e) }

// maxOutputTokens is the output the request may produce: its limit, else def.
func (r *inferenceRequest) maxOutputTokens(def int) int {
	switch {
	case r.MaxCompletionTokens != nil:
		return *r.MaxCompletionTokens
	case r.MaxTokens != nil:
		return *r.MaxTokens
	}
	return def
}

// estimateTokens is a cheap prompt token estimate (about four bytes a token, as OpenAI's
// rule of thumb); accounting is reconciled with the worker's real usage afterwards.
func estimateTokens(text string) int { return len(text)/4 + 1 }

// forUpstream returns the body to send to the worker. For a stream whose client did not ask for
// usage, it asks the worker to include it (the proxy removes that chunk again), so the gateway
// learns real token counts of every request.
func (r *inferenceRequest) forUpstream(body []byte) ([]byte, error) {
	if !r.Stream || r.clientWantsUsage {
		return body, nil
	}
	so := map[string]json.RawMessage{}
	if len(r.StreamOptions) > 0 && !isNull(r.StreamOptions) {
		if err := json.Unmarshal(r.StreamOptions, &so); err != nil {
			return nil, err
		}
	}
	so["include_usage"] = json.RawMessage("true")
	raw, err := json.Marshal(so)
	if err != nil {
		return nil, err
	}
	return withField(body, "stream_options", string(raw))
}

// withField returns the JSON object body with field set to the raw JSON value.
func withField(body []byte, field, value string) ([]byte, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return nil, err
	}
	fields[field] = json.RawMessage(value)
	return json.Marshal(fields)
}

// usage is OpenAI's usage object, as workers report it.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u usage) cachedTokens() int {
	if u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

var usageKey = []byte(`"usage"`)

// parseUsage reads the usage object of a response or stream chunk, if it has one. It decodes only
// that object: the last "usage" key of the payload (a key, since a quote inside a JSON string is
// always escaped), so a long answer is not decoded twice.
func parseUsage(payload []byte) (usage, bool) {
	i := bytes.LastIndex(payload, usageKey)
	if i < 0 {
		return usage{}, false
	}
	rest := bytes.TrimLeft(payload[i+len(usageKey):], " \t\r\n")
	if len(rest) == 0 || rest[0] != ':' {
		return usage{}, false
	}
	var u *usage
	if err := json.NewDecoder(bytes.NewReader(rest[1:])).Decode(&u); err != nil || u == nil {
		return usage{}, false
	}
	return *u, true
}

// isUsageOnlyChunk reports whether a stream chunk is the usage chunk that include_usage adds:
// empty choices and a usage object.
func isUsageOnlyChunk(payload []byte) bool {
	var v struct {
		Choices []json.RawMessage `json:"choices"`
		Usage   json.RawMessage   `json:"usage"`
	}
	if err := json.Unmarshal(payload, &v); err != nil {
		return false
	}
	return len(v.Choices) == 0 && len(v.Usage) > 0 && !isNull(v.Usage)
}
