package gateway

import (
	"encoding/json"
)

// /v1/embeddings goes through the same stages as the inference endpoints: the tenant's
// authentication, model allow-list and limits, the model's queue and fair share, the routing
// policy and the retries. Only parse differs: the body's `input` is estimated, an embedding has
// no output tokens, and the answer is never streamed. A worker that serves only embeddings is one
// whose models are only embedding models: routing picks by model, so chat requests never reach
// it.

// maxInputs bounds the inputs of one request (an array of strings, or of token arrays), as
// OpenAI does for embeddings (2048); /v1/completions' prompt batches take the same bound.
const maxInputs = 2048

// parseInput reads the `input` of /v1/embeddings into cl: no output is expected, and a stream
// is refused (engines answer embeddings whole).
func (cl *call) parseInput(raw []byte) error {
	if cl.stream {
		return BadRequest("stream", "embeddings are not streamed: 'stream' must be false or absent")
	}
	if len(raw) == 0 {
		return BadRequest("input", "missing required parameter: 'input'")
	}
	first, tokens, _, err := estimateInputs(raw, "input")
	if err != nil {
		return err
	}
	cl.prompt, cl.promptTokens = first, tokens
	cl.maxOutput = 0
	return nil
}

// estimateInputs estimates the tokens of a prompt or embedding input (raw, valid JSON, not
// null): a string, an array of strings, an array of token ids, or an array of token-id arrays.
// Every input counts (a token id is a token; a string is estimated by estimateTokens); the sum
// saturates at maxTokenCount, and arrays of inputs hold at most maxInputs; count is how many
// inputs there are (each a prompt that gets its own answer). first is the first
// string input, the text routing sees ("" for token ids). One decode, chosen by the value's
// first bytes; an error is a 400 naming param.
func estimateInputs(raw []byte, param string) (first string, tokens, count int, err error) {
	bad := BadRequest(param, "'%s' must be a string, an array of strings, an array of token ids or an array of token-id arrays", param)
	if raw[0] == '"' {
		if json.Unmarshal(raw, &first) != nil {
			return "", 0, 0, bad
		}
		return first, estimateTokens(first), 1, nil
	}
	if raw[0] != '[' {
		return "", 0, 0, bad
	}
	i := skipSpace(raw, 1)
	if i >= len(raw) || raw[i] == ']' {
		return "", 0, 0, BadRequest(param, "'%s' must not be an empty array", param)
	}
	tooMany := BadRequest(param, "'%s' holds more than %d inputs", param, maxInputs)
	switch raw[i] {
	case '"':
		var list []string
		if json.Unmarshal(raw, &list) != nil {
			return "", 0, 0, bad
		}
		if len(list) > maxInputs {
			return "", 0, 0, tooMany
		}
		for _, s := range list {
			tokens = addTokens(tokens, estimateTokens(s))
		}
		return list[0], tokens, len(list), nil
	case '[':
		var lists [][]int64
		if json.Unmarshal(raw, &lists) != nil {
			return "", 0, 0, bad
		}
		if len(lists) > maxInputs {
			return "", 0, 0, tooMany
		}
		for _, ids := range lists {
			if len(ids) == 0 {
				return "", 0, 0, BadRequest(param, "'%s' must not hold an empty token array", param)
			}
			tokens = addTokens(tokens, len(ids))
		}
		return "", tokens, len(lists), nil
	default:
		var ids []int64
		if json.Unmarshal(raw, &ids) != nil {
			return "", 0, 0, bad
		}
		return "", min(len(ids), maxTokenCount), 1, nil
	}
}
