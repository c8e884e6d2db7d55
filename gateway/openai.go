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

// parseUsage reads the usage object of a response or stream chunk, if it has one. It reads only
// that object: the last "usage" key of the payload (a key, since a quote inside a JSON string is
// always escaped), so a long answer is not decoded twice; and it reads the object's counts in one
// pass over its bytes (scanUsage), decoding it with encoding/json only when that pass cannot.
func parseUsage(payload []byte) (usage, bool) {
	// A forward search is vectorised, LastIndex is not: most stream chunks carry no usage at all.
	i := indexKey(payload, usageKey)
	if i < 0 {
		return usage{}, false
	}
	// The last one, searched forwards from the first (LastIndex hashes its way back a byte at
	// a time): there is one in all but odd answers.
	for {
		j := bytes.Index(payload[i+1:], usageKey)
		if j < 0 {
			break
		}
		i += 1 + j
	}
	rest := payload[skipSpace(payload, i+len(usageKey)):]
	if len(rest) == 0 || rest[0] != ':' {
		return usage{}, false
	}
	rest = rest[skipSpace(rest, 1):]
	if len(rest) == 0 || rest[0] != '{' {
		return usage{}, false // null, as OpenAI sends in every chunk but the last
	}
	obj := rest[:valueEnd(rest, 0)]
	if u, ok := scanUsage(obj); ok {
		return u, true
	}
	var u *usage
	if err := json.Unmarshal(obj, &u); err != nil || u == nil {
		return usage{}, false
	}
	return *u, true
}

// scanUsage reads a usage object whose counts are plain non-negative integers, as engines write
// them, without decoding it; ok is false for anything else (the caller decodes it then).
func scanUsage(obj []byte) (u usage, ok bool) {
	m, err := membersOf(obj)
	if err != nil {
		return usage{}, false
	}
	for m.next() {
		var n *int
		switch {
		case keyIs(m.key, "prompt_tokens"):
			n = &u.PromptTokens
		case keyIs(m.key, "completion_tokens"):
			n = &u.CompletionTokens
		case keyIs(m.key, "total_tokens"):
			n = &u.TotalTokens
		case keyIs(m.key, "prompt_tokens_details"):
			if isNull(m.value) {
				u.PromptTokensDetails = nil
				continue
			}
			d, err := membersOf(m.value)
			if err != nil {
				return usage{}, false
			}
			if u.PromptTokensDetails == nil {
				u.PromptTokensDetails = &struct {
					CachedTokens int `json:"cached_tokens"`
				}{}
			}
			for d.next() {
				if !keyIs(d.key, "cached_tokens") && foldsTo(d.key, "cached_tokens") {
					return usage{}, false
				}
				if keyIs(d.key, "cached_tokens") && !isNull(d.value) {
					if u.PromptTokensDetails.CachedTokens, ok = plainInt(d.value); !ok {
						return usage{}, false
					}
				}
			}
			if d.err != nil {
				return usage{}, false
			}
			continue
		case bytes.IndexByte(m.key, '\\') >= 0 || foldsTo(m.key, "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"):
			return usage{}, false // escaped or re-cased: encoding/json reads it its way
		default:
			continue
		}
		if isNull(m.value) {
			continue
		}
		if *n, ok = plainInt(m.value); !ok {
			return usage{}, false
		}
	}
	return u, m.err == nil
}

// foldsTo reports whether the raw JSON string k equals one of names but for case, as
// encoding/json matches keys.
func foldsTo(k []byte, names ...string) bool {
	for _, name := range names {
		if len(k) == len(name)+2 && bytes.EqualFold(k[1:len(k)-1], []byte(name)) {
			return true
		}
	}
	return false
}

// plainInt reads b, a non-negative JSON integer of at most 15 digits.
func plainInt(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 15 || (len(b) > 1 && b[0] == '0') {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// isUsageOnlyChunk reports whether a stream chunk is the usage chunk that include_usage adds:
// empty choices and a usage object.
func isUsageOnlyChunk(payload []byte) bool {
	m, err := membersOf(payload)
	if err != nil {
		return false
	}
	hasUsage := false
	for m.next() {
		switch {
		case keyIs(m.key, "choices") && !isNull(m.value):
			list, err := elementsOf(m.value)
			if err != nil || list.next() || list.err != nil {
				return false
			}
		case keyIs(m.key, "usage"):
			hasUsage = !isNull(m.value)
		case bytes.IndexByte(m.key, '\\') >= 0:
			return false
		}
	}
	return hasUsage && m.err == nil
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
			rest = rest[skipSpace(rest, i+len(key)):]
			if len(rest) > 0 && rest[0] == ':' {
				v := rest[skipSpace(rest, 1):]
				if len(v) > 1 && v[0] == '"' && v[1] != '"' {
					return true
				}
			}
		}
	}
	return indexKey(payload, toolCallsKey) >= 0
}

// indexKey is bytes.Index(data, key) for a key written as a JSON string, quotes included
// (`"usage"`). It searches for the key without its opening quote, whose first letter is rarer in
// JSON than a quote (bytes.Index tries every quote of a chunk as a start), and then checks for
// the quote. Faster for keys whose first letter is rare in chunks ("usage", "tool_calls"); not
// for "content" (chat.completion.chunk, choices and created start alike).
func indexKey(data, key []byte) int {
	rest := key[1:]
	for off := 1; off <= len(data); {
		i := bytes.Index(data[off:], rest)
		if i < 0 {
			return -1
		}
		i += off
		if data[i-1] == key[0] {
			return i - 1
		}
		off = i + 1
	}
	return -1
}

var toolCallsKey = []byte(`"tool_calls"`)
