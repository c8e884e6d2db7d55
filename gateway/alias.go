package gateway

import (
	"bytes"
	"encoding/json"
)

// modelAlias is a model the call's worker knows by another name (routing.WorkerSpec.ModelAliases):
// the worker gets engine in the request's `model`, and the client sees public in the answer's.
type modelAlias struct {
	public, engine []byte // JSON strings, quotes included
	buf            []byte // the last event rewritten by publicEvent, reused
}

// newModelAlias returns the alias of public as engine, or nil when the names are the same.
func newModelAlias(public, engine string) *modelAlias {
	if engine == "" || engine == public {
		return nil
	}
	return &modelAlias{public: jsonString(public), engine: jsonString(engine)}
}

// jsonString is s as a JSON string, with <, > and & as they are (not \u escapes), as the
// engines behind usher write them, so a name found in their answers is found as written.
func jsonString(s string) []byte { return appendJSONString(make([]byte, 0, len(s)+2), s) }

// appendJSONString appends s as jsonString writes it to dst.
func appendJSONString(dst []byte, s string) []byte {
	plain := true
	for i := 0; i < len(s) && plain; i++ {
		c := s[i]
		plain = c >= 0x20 && c < 0x80 && c != '"' && c != '\\'
	}
	if plain {
		// What the encoder would write, without it: most names and salts are plain ASCII.
		return append(append(append(dst, '"'), s...), '"')
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return append(dst, bytes.TrimSuffix(b.Bytes(), []byte("\n"))...)
}

var modelKey = []byte(`"model"`)

// publicEvent returns a stream line with the `"model": <engine name>` member of its chunk naming
// the public model instead. A line without it is returned as it is; a rewritten one is valid
// until the next call. A `"model"` outside a JSON string is a key (a quote inside a string is
// escaped), so the member is found without decoding the chunk. Cost: one search of the line, and
// a copy into a reused buffer when the member is there.
func (a *modelAlias) publicEvent(line []byte) []byte {
	rest := line
	for {
		i := bytes.Index(rest, modelKey)
		if i < 0 {
			return line
		}
		j := skipSpace(rest, i+len(modelKey))
		rest = rest[j:]
		if len(rest) == 0 || rest[0] != ':' {
			continue
		}
		k := skipSpace(rest, 1)
		if !bytes.HasPrefix(rest[k:], a.engine) {
			continue
		}
		at := len(line) - len(rest) + k
		a.buf = append(append(append(a.buf[:0], line[:at]...), a.public...), line[at+len(a.engine):]...)
		return a.buf
	}
}
