package gateway

import (
	"bytes"
	"encoding/json"
)

// OpenAI's shapes as the gateway reads them from workers.

// endpoint is one of the OpenAI inference endpoints the gateway proxies.
type endpoint struct {
	path  string // upstream path, e.g. /v1/chat/completions
	chat  bool   // messages (chat) or prompt (completions)
	embed bool   // input (embeddings): no output tokens, never streamed
}

var (
	chatEndpoint       = endpoint{path: "/v1/chat/completions", chat: true}
	completionEndpoint = endpoint{path: "/v1/completions"}
	embeddingsEndpoint = endpoint{path: "/v1/embeddings", embed: true}
)

// usage is OpenAI's usage object, as workers report it.
type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`

	// estimated: the worker reported no usage; the gateway counted it (estimatedUsage).
	estimated bool
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

// outputKeys are the members of a stream chunk that carry generated output: chat's delta
// content (and the reasoning some engines stream apart), completions' text.
var outputKeys = [][]byte{[]byte(`"content"`), []byte(`"text"`), []byte(`"reasoning_content"`)}

// carriesOutput reports whether a stream chunk carries generated output: one of outputKeys with
// a non-empty string, or a tool call. The chunks engines send around the output (the role
// alone, the finish reason alone) carry none. It scans the bytes without decoding them.
func carriesOutput(payload []byte) bool {
	for _, key := range outputKeys {
		rest := payload
		for {
			i := bytes.Index(rest, key)
			if i < 0 {
				break
			}
			rest = bytes.TrimLeft(rest[i+len(key):], " \t\r\n")
			if len(rest) > 0 && rest[0] == ':' {
				v := bytes.TrimLeft(rest[1:], " \t\r\n")
				if len(v) > 1 && v[0] == '"' && v[1] != '"' {
					return true
				}
			}
		}
	}
	return bytes.Contains(payload, toolCallsKey)
}

var toolCallsKey = []byte(`"tool_calls"`)
