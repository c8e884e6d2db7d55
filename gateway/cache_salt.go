package gateway

import (
	"bytes"
	"encoding/json"

	"github.com/usherllm/usher/routing"
)

// Cache scopes at the engine, a part of the proxy stage. An engine's prefix cache is shared by
// every prompt sent to it, and a shared cache is an oracle: a tenant that guesses another's
// prompt finds it cached (a faster answer, usage.prompt_tokens_details.cached_tokens). Routing
// keeps its own view of the caches per cache scope (routing.CacheScope); here the engine is
// told the scope too, and the client is told only what its scope put in the cache.
//
//   - The body of a chat or completion request for a worker whose engine takes it carries the
//     scope's cache_salt (routing.Lease.CacheSalt; vLLM mixes it into the hash of the prompt's
//     first KV block, SGLang into its radix cache's key), so a prompt hits only blocks its own
//     scope computed. A cache_salt the client sent stays within its scope: it is appended to
//     usher's ("<usher's>:<client's>"), so a client may partition its own cache further but
//     never name another's. A client's salt that is not a string is refused at parse (SGLang would
//     answer a list with a 500); one that reaches withCacheSalt is dropped.
//   - The cached tokens a client is told (and the ledger and routing are given) are bounded by
//     routing.Lease.OwnCached: an engine without a salt (llama.cpp's slots) reports hits on
//     every scope's prefixes, of which only the scope's own may be told.

// saltKey is the member of a request body that carries the cache salt.
const saltKey = "cache_salt"

// forWorker is body, the call's body for the lease's worker, with the cache salt of the call's
// scope when the worker takes one; and it makes the lease the one whose scope bounds the cached
// tokens the client is told (see ownCache). Embeddings go as they are: they report no cached
// tokens. Costs a copy of body when a salt is added, and a scan of its members when the client
// may have sent a cache_salt itself.
func (s *Server) forWorker(cl *call, lease *routing.Lease, body []byte) []byte {
	cl.lease = lease
	if cl.ep.embed {
		return body
	}
	salt := lease.CacheSalt()
	if salt == "" {
		return body
	}
	return withCacheSalt(body, salt)
}

var (
	saltBytes = []byte(saltKey)
	escape    = []byte(`\u`)
)

// withCacheSalt is body, a JSON object as buildUpstream builds it, with its top-level cache_salt
// member set to salt, or to salt + ":" + the client's own when body had one that is a string.
// The key can be written only as these bytes or with \u escapes, so a body holding neither has
// no cache_salt and the salt is added without reading its members.
func withCacheSalt(body []byte, salt string) []byte {
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		return body
	}
	if !bytes.Contains(body, saltBytes) && !bytes.Contains(body, escape) {
		out := make([]byte, 0, len(body)+len(salt)+20)
		out = append(out, body[:end]...)
		if len(bytes.TrimSpace(body[bytes.IndexByte(body, '{')+1:end])) > 0 {
			out = append(out, ',')
		}
		out = appendSalt(out, salt)
		return append(out, body[end:]...)
	}
	fields, err := objectFields(body, nil)
	if err != nil {
		return body
	}
	out := make([]byte, 0, len(body)+len(salt)+20)
	out = append(out, '{')
	for _, f := range fields {
		if f.key == saltKey {
			var own string
			if json.Unmarshal(f.value, &own) == nil && own != "" {
				salt += ":" + own
			}
			continue
		}
		out = append(append(append(out, f.rawKey...), ':'), f.value...)
		out = append(out, ',')
	}
	return append(appendSalt(out, salt), '}')
}

func appendSalt(out []byte, salt string) []byte {
	out = append(out, `"`+saltKey+`":`...)
	return appendJSONString(out, salt)
}

// ownCache is u with its cached tokens bounded by what the call's own cache scope can have put in
// the engine's cache (routing.Lease.OwnCached); u as it is when the engine reported none or no
// lease is known.
func (cl *call) ownCache(u usage) usage {
	if cl.lease == nil || u.PromptTokensDetails == nil {
		return u
	}
	d := *u.PromptTokensDetails
	d.CachedTokens = cl.lease.OwnCached(d.CachedTokens, u.PromptTokens)
	u.PromptTokensDetails = &d
	return u
}

// cachedRewritten reports whether the cached tokens the engine reported may differ from what the
// client is told, so that withOwnCache writes the call's own into the answer: the prompt went in
// pieces, or the engine does not keep the call's scope apart.
func (cl *call) cachedRewritten() bool {
	return cl.pieces > 0 || cl.decoding || cl.lease != nil && !cl.lease.Worker.IsolatesCache()
}
