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

// rewriteAnswer returns a worker's whole 2xx answer as the client gets it, head followed by body:
// the model named as the client named it when the worker calls it otherwise (cl.alias), and, for
// a chat or completion, the service_tier served set in place of the engine's own or added first.
// An answer that is not a JSON object (encoding/json.Valid), or that needs no change, is
// returned as it is (in body). The top-level keys are matched as the engines write them
// (unescaped). Cost: one pass over the answer that checks it (scanValue) and finds its members;
// when only the service_tier is to be added, as for most answers, head is a shared constant
// and body the answer after its brace, with no copy; else one copy, the only allocation.
func (cl *call) rewriteAnswer(data []byte) (head, body []byte) {
	setTier := !cl.ep.embed && cl.classed
	if !setTier && cl.alias == nil {
		return nil, data
	}
	open := skipSpace(data, 0)
	if open >= len(data) || data[open] != '{' {
		return nil, data
	}
	// The members' spans, kept for the copy; past len(spans) the copy walks the answer again.
	var spans [16][4]int // key start and end, value start and end
	members, change := 0, false
	i := skipSpace(data, open+1)
	if i < len(data) && data[i] == '}' {
		i++
	} else {
		for {
			if i >= len(data) || data[i] != '"' {
				return nil, data
			}
			kend, err := scanString(data, i, false)
			if err != nil {
				return nil, data
			}
			key := data[i:kend]
			v := skipSpace(data, kend)
			if v >= len(data) || data[v] != ':' {
				return nil, data
			}
			v = skipSpace(data, v+1)
			vend, err := scanValue(data, v, maxJSONNesting-1, false)
			if err != nil {
				return nil, data
			}
			change = change || cl.alias != nil && string(key) == `"model"` || setTier && string(key) == `"service_tier"`
			if members < len(spans) {
				spans[members] = [4]int{i, kend, v, vend}
			}
			members++
			if i = skipSpace(data, vend); i < len(data) && data[i] == ',' {
				i = skipSpace(data, i+1)
				continue
			}
			if i >= len(data) || data[i] != '}' {
				return nil, data
			}
			i++
			break
		}
	}
	if skipSpace(data, i) != len(data) {
		return nil, data
	}
	switch {
	case !change && !setTier:
		return nil, data
	case !change:
		if members == 0 {
			return tierAnswer[cl.class], nil
		}
		return tierHead[cl.class], data[open+1:]
	}
	out := make([]byte, 0, len(data)+32)
	out = append(out, '{')
	if setTier {
		out = append(append(append(out, `"service_tier":"`...), serviceTierOf(cl.class)...), '"')
	}
	add := func(key, value []byte) {
		if cl.alias != nil && string(key) == `"model"` {
			value = cl.alias.public
		}
		if !setTier || string(key) != `"service_tier"` {
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = append(append(append(out, key...), ':'), value...)
		}
	}
	if members <= len(spans) {
		for _, m := range spans[:members] {
			add(data[m[0]:m[1]], data[m[2]:m[3]])
		}
		return nil, append(out, '}')
	}
	// The answer is valid: the unchecked walk reads it alike.
	fields, _ := objectFields(data, nil)
	for _, f := range fields {
		add(f.rawKey, f.value)
	}
	return nil, append(out, '}')
}

// tierHead and tierAnswer are, by class, what an answer with members begins with in place of
// its brace, and the whole of an empty one, when the service_tier is added: shared read-only.
var tierHead, tierAnswer = func() (head, whole [queue.Batch + 1][]byte) {
	for c := range head {
		tier := `{"service_tier":"` + serviceTierOf(queue.Class(c)) + `"`
		head[c], whole[c] = []byte(tier+","), []byte(tier+"}")
	}
	return head, whole
}()
