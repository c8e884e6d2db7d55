package gateway

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

// jsonSeeds are documents at the edges of JSON's grammar, for the fuzz targets below.
var jsonSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
	`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"}}],"usage":{"prompt_tokens":5}}`,
	` [1, -0.5e+10, 0, -0, 1E3, true, false, null, "", {}] `,
	`"a\"b\\c\/d\be\ff\ng\rh\ti\u00e9j\uD83D\uDE00k"`,
	`"\ud800"`, `"\udc00\ud800"`, `"\uD800\u0041"`, `"\u12G4"`, `"\x"`, "\"caf\xe9\"", "\"\xed\xa0\x80\"",
	"\"tab\there\"", "\"\x7f\x80\"", `"unterminated`, `01`, `1.`, `.5`, `1e`, `-`, `+1`, `1.5e-`, `tru`, `nul`,
	`{"a":1,}`, `[1,]`, `{"a"}`, `{"a":}`, `{,}`, `[}`, `{]`, `{"a":1}}`, `{"a":1} x`, ``, ` `,
	strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
	strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70),
	`"a long string with plenty of ascii so that the word loop runs over it \" and \\ then"`,
}

// FuzzValidJSONIsEncodingJSONs holds scanValue to encoding/json's grammar: validJSON accepts
// exactly what json.Valid accepts; with engine set it accepts exactly the valid documents that
// are also UTF-8, hold no \u escape of a lone surrogate and nest at most maxDepth deep; and the
// parse stage's split of a body (splitObject, which checks the body in the same pass) refuses
// with errSyntax exactly what json.Valid refuses, and accepts nothing that scanValue refuses.
func FuzzValidJSONIsEncodingJSONs(f *testing.F) {
	for _, seed := range jsonSeeds {
		f.Add([]byte(seed), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, depth uint8) {
		valid := json.Valid(data)
		if got := validJSON(data); got != valid {
			t.Fatalf("validJSON %v, json.Valid %v: %q", got, valid, data)
		}
		maxDepth := int(depth%8) + 1
		want := valid && utf8.Valid(data) && !hasLoneSurrogate(data) && nesting(data) <= maxDepth
		end, err := scanValue(data, skipSpace(data, 0), maxDepth, true)
		if got := err == nil && skipSpace(data, end) == len(data); got != want {
			t.Fatalf("scanValue for engines %v (%v), want %v (depth %d): %q", got, err, want, maxDepth, data)
		}
		_, err = splitObject(nil, data, readKeys, maxDepth)
		if errors.Is(err, errSyntax) == valid {
			t.Fatalf("splitObject: %v, json.Valid %v: %q", err, valid, data)
		}
		if err == nil && !want {
			t.Fatalf("splitObject accepts what an engine must not read (depth %d): %q", maxDepth, data)
		}
	})
}

// hasLoneSurrogate reports whether the valid JSON data holds a \u escape of a UTF-16 surrogate
// that is not the first half of a pair followed at once by the second.
func hasLoneSurrogate(data []byte) bool {
	inString := false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			inString = !inString
		case inString && c == '\\' && data[i+1] == 'u':
			r := hexValue(data[i+2 : i+6])
			switch {
			case r >= 0xdc00 && r < 0xe000:
				return true
			case r >= 0xd800 && r < 0xdc00:
				if i+12 > len(data) || data[i+6] != '\\' || data[i+7] != 'u' {
					return true
				}
				if lo := hexValue(data[i+8 : i+12]); lo < 0xdc00 || lo >= 0xe000 {
					return true
				}
				i += 6
			}
			i += 5
		case inString && c == '\\':
			i++
		}
	}
	return false
}

func hexValue(h []byte) rune {
	var r rune
	for _, c := range h {
		r <<= 4
		switch {
		case c <= '9':
			r |= rune(c - '0')
		case c >= 'a':
			r |= rune(c - 'a' + 10)
		default:
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// nesting is how deep objects and arrays nest in the valid JSON data.
func nesting(data []byte) int {
	deepest, depth, inString := 0, 0, false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}

func BenchmarkValidJSON(b *testing.B) {
	body := []byte(`{"model":"m1","max_tokens":16,"messages":[{"role":"system","content":"` + strings.Repeat("You are a helpful assistant. ", 40) +
		`"},{"role":"user","content":"measure the hop of the gateway please"}]}`)
	for _, v := range []struct {
		name  string
		valid func([]byte) bool
	}{{"encoding/json", json.Valid}, {"scanValue", validJSON}} {
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for range b.N {
				if !v.valid(body) {
					b.Fatal("not valid")
				}
			}
		})
	}
}

// FuzzStringEndFindsTheClosingQuote holds stringEnd, which skips through a string eight bytes at
// a time, to its contract: for a valid JSON string followed by anything, the index just past its
// closing quote; the string as encoding/json writes it, and as the fuzzer writes it when
// encoding/json finds it valid (escapes of every kind).
func FuzzStringEndFindsTheClosingQuote(f *testing.F) {
	for _, s := range []string{``, `a`, `"`, `\`, `\\\"`, "\u2028<>&", strings.Repeat(`ab\"`, 9), `\u00e9\/\n`, "é😀"} {
		f.Add(s, `,"x":1}`)
	}
	f.Fuzz(func(t *testing.T, s, after string) {
		enc, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		forms := [][]byte{enc}
		if raw := []byte(`"` + s + `"`); json.Valid(raw) {
			forms = append(forms, raw)
		}
		for _, str := range forms {
			data := append(append([]byte(nil), str...), after...)
			if got := stringEnd(data, 0); got != len(str) {
				t.Fatalf("stringEnd(%q): got %d, want %d", data, got, len(str))
			}
		}
	})
}
