package gateway

import (
	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/tenants"
)

// OpenAI's `service_tier` in usher's classes. A request asks for a class; its tier decides what
// it gets (tenants.Tier.Class: never above the tier's highest class):
//
//	auto, default, absent  the tier's default class
//	flex                   batch
//	priority, scale        interactive where the tier allows it, else the tier's highest class
//
// The answer says the tier served, named by the class it ran in: interactive "priority",
// standard "default", batch "flex". Every answer carries it in the X-Usher-Service-Tier header;
// a whole (non-streamed) chat or completion answer also in its `service_tier` field, as OpenAI
// sends it. Streamed chunks are relayed as the engine wrote them: setting the field would mean
// rewriting every chunk on the relay's hot path, for a value the header already gave before the
// first chunk.

// headerServiceTier is the OpenAI service_tier the request was served in.
const headerServiceTier = "X-Usher-Service-Tier"

// requestedClass maps a service_tier value to the class it asks for ("" asks for the tier's
// default); ok is false for a value OpenAI does not define.
func requestedClass(serviceTier string) (class string, ok bool) {
	switch serviceTier {
	case "", "auto", "default":
		return "", true
	case "flex":
		return tenants.ClassBatch, true
	case "priority", "scale":
		return tenants.ClassInteractive, true
	}
	return "", false
}

// serviceTierHeader holds the X-Usher-Service-Tier value of each class, shared read-only by
// every response, so that setting the header allocates nothing.
var serviceTierHeader = [...][]string{
	queue.Interactive: {serviceTierOf(queue.Interactive)},
	queue.Standard:    {serviceTierOf(queue.Standard)},
	queue.Batch:       {serviceTierOf(queue.Batch)},
}

// classHeader holds the X-Usher-Class value of each class, shared read-only as serviceTierHeader.
var classHeader = [...][]string{
	queue.Interactive: {queue.Interactive.String()},
	queue.Standard:    {queue.Standard.String()},
	queue.Batch:       {queue.Batch.String()},
}

// serviceTierOf names the class a request ran in as OpenAI's service_tier.
func serviceTierOf(c queue.Class) string {
	switch c {
	case queue.Interactive:
		return "priority"
	case queue.Batch:
		return "flex"
	}
	return "default"
}

// rewriteAnswer returns a worker's whole 2xx answer as the client gets it: the model named as
// the client named it when the worker calls it otherwise (cl.alias), and, for a chat or
// completion, the service_tier served set in place of the engine's own or added first. An answer
// that is not a JSON object (encoding/json.Valid), or that needs no change, is returned as it
// is. The top-level keys are matched as the engines write them (unescaped). Cost: one pass over
// the answer that both checks it (scanValue) and copies its members, and no allocation but the
// copy.
func (cl *call) rewriteAnswer(data []byte) []byte {
	setTier := !cl.ep.embed && cl.classed
	if !setTier && cl.alias == nil {
		return data
	}
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return data
	}
	out := make([]byte, 0, len(data)+32)
	out = append(out, '{')
	if setTier {
		out = append(append(append(out, `"service_tier":"`...), serviceTierOf(cl.class)...), '"')
	}
	if i = skipSpace(data, i+1); i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			if i >= len(data) || data[i] != '"' {
				return data
			}
			kend, err := scanString(data, i, false)
			if err != nil {
				return data
			}
			key := data[i:kend]
			v := skipSpace(data, kend)
			if v >= len(data) || data[v] != ':' {
				return data
			}
			v = skipSpace(data, v+1)
			vend, err := scanValue(data, v, maxJSONNesting-1, false)
			if err != nil {
				return data
			}
			value := data[v:vend]
			if cl.alias != nil && string(key) == `"model"` {
				value = cl.alias.public
			}
			if !setTier || string(key) != `"service_tier"` {
				if len(out) > 1 {
					out = append(out, ',')
				}
				out = append(append(append(out, key...), ':'), value...)
			}
			if i = skipSpace(data, vend); i < len(data) && data[i] == ',' {
				i = skipSpace(data, i+1)
				continue
			}
			if i >= len(data) || data[i] != '}' {
				return data
			}
			i++
			break
		}
	}
	if skipSpace(data, i) != len(data) {
		return data
	}
	return append(out, '}')
}
