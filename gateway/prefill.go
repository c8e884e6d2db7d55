package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/usherllm/usher/routing"
)

// Prefill in pieces, a part of the proxy stage (see routing.Lease.PrefillPiece for when). An
// engine computes a prompt's KV in the step it takes the prompt in, and a step does not stop: an
// interactive prompt that reaches the worker meanwhile waits for the whole of it. So a long
// standard or batch prompt is sent first as its leading pieces, each a request of its own for
// one output token, whose KV the engine keeps in its prefix cache (vLLM's and SGLang's automatic
// prefix caching; llama.cpp's slot that the next piece, sharing most of its tokens, takes
// again); then the request itself goes, and the engine prefills only its last piece. Before each
// piece, and before the request itself, the call waits while an interactive prompt is being
// prefilled on the worker, so interactive prompts go between the pieces of a batch prompt
// instead of behind all of it, and share their step with none of it; and after each piece,
// while an interactive answer decodes on the worker, for the decode steps that keep that
// answer's mean step within its objective (routing.Lease.AwaitDecodes).
//
// A piece is the request's body with the prompt cut at a word boundary near the piece's end:
// for a chat, the messages up to the cut, the one the cut falls in shortened when its content is
// a string; for a completion, a string prompt shortened. Every other member is kept (the chat
// template sees the same tools and options), but those that shape the output, which a piece
// replaces by max_tokens 1 and no stream. A prompt that cannot be cut so (token ids, content
// parts at the cut) goes whole from there.
//
// A piece that fails is no loss beyond its own work: the request itself carries the whole
// prompt, and the engine computes whatever its cache lacks.

// pieceDropKeys are the members a piece's body does not carry: what shapes the output.
var pieceDropKeys = map[string]bool{
	"stream": true, "stream_options": true, "max_tokens": true, "max_completion_tokens": true,
	"n_predict": true, "n": true, "logprobs": true, "top_logprobs": true, "echo": true,
	"best_of": true, "suffix": true, "response_format": true, "grammar": true, "json_schema": true,
}

// maxPieceAnswer bounds what usher reads of a piece's answer: one token's worth.
const maxPieceAnswer = 64 << 10

// prefillInPieces sends the leading pieces of the call's prompt to the lease's worker, each
// after no interactive prompt is being prefilled there and, after the first, paced beside the
// interactive answers decoding there (routing.Lease.AwaitDecodes), and records them in the call
// (pieces, cachedBeforePieces, and the prompt tokens the engine computed for them in
// piecesComputed). It returns when the last piece is answered, a piece fails, or ctx ends (its
// cause is then the caller's to read).
func (s *Server) prefillInPieces(ctx context.Context, cl *call, lease *routing.Lease, body []byte, in http.Header) {
	cl.pieces, cl.cachedBeforePieces = 0, 0
	piece := lease.PrefillPiece()
	if piece <= 0 || cl.ep.embed {
		return
	}
	pc, ok := newPieceCutter(body, cl.ep.chat)
	if !ok {
		lease.PrefillWhole(cl.promptTokens)
		return
	}
	// The lease's piece is at least a sixteenth of cl.promptTokens, the estimate routing sized
	// it by, so this sends 15 pieces at most.
	for end := piece; end+piece/2 < cl.promptTokens; end += piece {
		b, ok := pc.body(end)
		if !ok && cl.pieces == 0 {
			lease.PrefillWhole(cl.promptTokens)
		}
		if !ok || lease.AwaitInteractive(ctx) != nil {
			return
		}
		load, sent := lease.PieceSent(), s.now()
		answer, ok := s.sendPiece(ctx, lease.Worker, cl, b, in)
		if !ok {
			return
		}
		lease.Heard()
		took := s.now().Sub(sent)
		u, measured := parseUsage(answer)
		if measured && u.PromptTokensDetails != nil {
			// Only with the engine's cached tokens: a piece's prompt is mostly the pieces
			// before it, which the engine does not compute again.
			lease.PieceAnswered(load, routing.Outcome{TTFT: took, Answered: took, PromptTokens: u.PromptTokens,
				CachedTokens: u.cachedTokens(), CompletionTokens: u.CompletionTokens, CacheReported: true})
		}
		cl.piecesComputed = addTokens(cl.piecesComputed, max(0, u.PromptTokens-u.cachedTokens()))
		if cl.pieces == 0 {
			// What the engine held of the prompt before usher sent any of it: the request's
			// own cache hit, which the pieces must not inflate.
			cl.cachedBeforePieces = u.cachedTokens()
		}
		cl.pieces++
		s.metrics.prefillPieces.WithLabelValues(cl.model).Inc()
		if lease.AwaitDecodes(ctx, took) != nil {
			return
		}
	}
}

// chargePieces makes the call's usage count at least the prompt tokens the engine computed for
// its pieces (piecesComputed), in every attempt: a request the engine refused after its pieces,
// or whose attempt ended without usage, has still had them prefilled, and whatever an engine
// computes for a tenant is charged to it. An answered request's prompt tokens hold its pieces'
// already (the engine counts the whole prompt, cached or not). Called by settle, once.
func (s *Server) chargePieces(cl *call) {
	extra := cl.piecesComputed - cl.usage.PromptTokens
	if extra <= 0 {
		return
	}
	cl.usage.PromptTokens += extra
	cl.usage.TotalTokens += extra
	s.metrics.tokens.WithLabelValues(cl.model, "prompt").Add(float64(extra))
}

var cachedKey = []byte(`"cached_tokens"`)

// withOwnCache is payload, an answer or stream chunk the worker sent, with the cached_tokens of
// its usage object (the last "usage" key, as parseUsage reads it) set to what the call accounted
// (see account) when the engine's count may not be the call's own (cachedRewritten): when its
// prompt went in pieces, the engine counts as cached what usher's own pieces put there, and the
// client is told the request's real cache hit, as it is charged; when the engine shares its
// cache among scopes, it is told only its own scope's. Any other payload is returned as it is.
func (cl *call) withOwnCache(payload []byte) []byte {
	if !cl.cachedRewritten() {
		return payload
	}
	i := bytes.LastIndex(payload, usageKey)
	if i < 0 {
		return payload
	}
	j := bytes.Index(payload[i:], cachedKey)
	if j < 0 {
		return payload
	}
	k := skipSpace(payload, i+j+len(cachedKey))
	if k >= len(payload) || payload[k] != ':' {
		return payload
	}
	k = skipSpace(payload, k+1)
	end := k
	for end < len(payload) && payload[end] >= '0' && payload[end] <= '9' {
		end++
	}
	if end == k {
		return payload
	}
	out := make([]byte, 0, len(payload))
	out = strconv.AppendInt(append(out, payload[:k]...), int64(cl.usage.cachedTokens()), 10)
	return append(out, payload[end:]...)
}

// sendPiece sends one piece and reads its answer, within Config.UpstreamIdleTimeout: a piece is
// one token's work, and a worker silent for that long is the request's to find out about.
func (s *Server) sendPiece(ctx context.Context, w *routing.Worker, cl *call, body []byte, in http.Header) (answer []byte, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.UpstreamIdleTimeout)
	defer cancel()
	resp, err := s.send(ctx, w, cl, body, in, &attempt{now: s.now})
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	answer, err = io.ReadAll(io.LimitReader(resp.Body, maxPieceAnswer))
	return answer, err == nil && resp.StatusCode == http.StatusOK
}

// pieceCutter cuts one request body into pieces of its prompt. It decodes the body once, so a
// prompt of many pieces costs one parse, not one a piece. Not safe for concurrent use.
type pieceCutter struct {
	fields []jsonField    // the body's members but those a piece drops (pieceDropKeys)
	prompt string         // a completion's prompt
	msgs   []pieceMessage // a chat's messages
	chat   bool
}

// pieceMessage is one chat message as a piece may keep it.
type pieceMessage struct {
	raw     []byte
	fields  []jsonField
	role    string
	content string // when cuttable
	// cuttable: the content is a string, so a piece may end inside it.
	cuttable bool
	// size is the bytes of its text as parseMessages renders it ("role content\n").
	size int
}

// newPieceCutter reads body, a chat (chat) or completion request built by buildUpstream; false
// when its prompt is not one a piece can be cut from (a completion's token ids or list of
// prompts).
func newPieceCutter(body []byte, chat bool) (*pieceCutter, bool) {
	fields, err := objectFields(body, nil)
	if err != nil {
		return nil, false
	}
	pc := &pieceCutter{chat: chat}
	for _, f := range fields {
		if pieceDropKeys[f.key] {
			continue
		}
		pc.fields = append(pc.fields, f)
		switch {
		case chat && f.key == "messages":
			var msgs []json.RawMessage
			if json.Unmarshal(f.value, &msgs) != nil {
				return nil, false
			}
			for _, raw := range msgs {
				m, ok := readPieceMessage(raw)
				if !ok {
					return nil, false
				}
				pc.msgs = append(pc.msgs, m)
			}
		case !chat && f.key == "prompt":
			if json.Unmarshal(f.value, &pc.prompt) != nil {
				return nil, false
			}
		}
	}
	return pc, true
}

func readPieceMessage(raw []byte) (pieceMessage, bool) {
	fields, err := objectFields(raw, messageKeys)
	if err != nil {
		return pieceMessage{}, false
	}
	m := pieceMessage{raw: raw, fields: fields}
	text := 0
	for _, f := range fields {
		switch f.key {
		case "role":
			_ = json.Unmarshal(f.value, &m.role)
		case "content":
			if m.cuttable = json.Unmarshal(f.value, &m.content) == nil; m.cuttable {
				text = len(m.content)
			} else {
				// Content parts: their text counts, as parseMessages renders it.
				var parts strings.Builder
				_, _, _ = appendContent(&parts, f.value)
				text = parts.Len()
			}
		}
	}
	m.size = len(m.role) + 1 + text + 1
	return m, true
}

// body is the piece of the prompt that ends near the estimated token tokens (see
// estimateTokens), at a word boundary: the request's members with that prompt, max_tokens 1 and
// no stream. ok is false when no such piece can be cut.
func (pc *pieceCutter) body(tokens int) (piece []byte, ok bool) {
	size := 4 * tokens
	out := []byte{'{'}
	for _, f := range pc.fields {
		v := f.value
		switch {
		case pc.chat && f.key == "messages":
			if v, ok = pc.cutMessages(size); !ok {
				return nil, false
			}
		case !pc.chat && f.key == "prompt":
			p, ok := cutText(pc.prompt, size)
			if !ok {
				return nil, false
			}
			v = jsonString(p)
		}
		out = append(append(append(out, f.rawKey...), ':'), v...)
		out = append(out, ',')
	}
	return append(out, `"max_tokens":1,"stream":false}`...), true
}

// cutMessages keeps the messages whose text (as parseMessages renders it) starts within the
// first size bytes, the last one cut at size when its content is a string; false when that
// leaves less than half of size.
func (pc *pieceCutter) cutMessages(size int) ([]byte, bool) {
	out := []byte{'['}
	at := 0
	for _, m := range pc.msgs {
		if at+m.size <= size {
			out = append(append(out, m.raw...), ',')
			at += m.size
			continue
		}
		room := size - at - len(m.role) - 1
		if !m.cuttable || room <= 0 {
			break
		}
		cut, ok := cutText(m.content, room)
		if !ok {
			break
		}
		out = append(out, '{')
		for _, f := range m.fields {
			v := f.value
			if f.key == "content" {
				v = jsonString(cut)
			}
			out = append(append(append(out, f.rawKey...), ':'), v...)
			out = append(out, ',')
		}
		out[len(out)-1] = '}'
		out = append(out, ',')
		at = size
		break
	}
	if len(out) == 1 || at < size/2 {
		return nil, false
	}
	out[len(out)-1] = ']'
	return out, true
}

// cutText is text cut at the last whitespace at or before size bytes; false when there is none.
func cutText(text string, size int) (string, bool) {
	if size >= len(text) {
		return "", false
	}
	i := strings.LastIndexAny(text[:size+1], " \n\t")
	if i <= 0 {
		return "", false
	}
	return text[:i], true
}
