package gateway

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// JSON's grammar, checked in the same pass that walks a body (parse) or an answer
// (rewriteAnswer): encoding/json.Valid costs about 35 instructions a byte, a state function call
// for each; scanValue checks the same grammar a word at a time inside strings, which are most of
// a body's bytes. It accepts exactly what encoding/json.Valid accepts (FuzzValidJSONIsEncodingJSONs
// holds the two equal), nesting bound included.

// maxJSONNesting is encoding/json's bound on how deep objects and arrays nest: a deeper document
// is not valid to it.
const maxJSONNesting = 10000

// errSyntax is JSON that encoding/json does not accept; errInputDepth, errInputUTF8 and
// errInputSurrogate are what else scanValue refuses.
var (
	errSyntax         = errors.New("not valid JSON")
	errInputDepth     = errors.New("JSON nests deeper than the gateway allows")
	errInputUTF8      = errors.New("a string holds bytes that are not UTF-8")
	errInputSurrogate = errors.New("a string holds a \\u escape of a lone UTF-16 surrogate")
)

// validJSON is encoding/json.Valid.
func validJSON(data []byte) bool {
	end, err := scanValue(data, skipSpace(data, 0), maxJSONNesting, false)
	return err == nil && skipSpace(data, end) == len(data)
}

// scanValue returns the index just past the JSON value at data[i] (space before it skipped, none
// after), checked against JSON's grammar (errSyntax) with objects and arrays nested at most
// maxDepth deep within the value (errInputDepth; 0: the value may not be an object or an
// array). With engine set, its strings must also be what every engine can read (see
// scanString). Its cost is one pass over the value's bytes, eight at a time within strings, and
// no allocation for values nested up to 64 deep.
func scanValue(data []byte, i, maxDepth int, engine bool) (int, error) {
	// kinds holds whether each open level is an object (a set bit) or an array, the first 64 in
	// a word, deeper ones in deep.
	var (
		kinds uint64
		deep  []bool
		depth int
		err   error
	)
value:
	i = skipSpace(data, i)
	if i >= len(data) {
		return i, errSyntax
	}
	switch c := data[i]; c {
	case '"':
		if i, err = scanString(data, i, engine); err != nil {
			return i, err
		}
	case '{', '[':
		if depth++; depth > maxDepth {
			return i, errInputDepth
		}
		object := c == '{'
		if depth <= 64 {
			if object {
				kinds |= 1 << (depth - 1)
			} else {
				kinds &^= 1 << (depth - 1)
			}
		} else {
			deep = append(deep, object)
		}
		i = skipSpace(data, i+1)
		if i < len(data) && data[i] == c+2 { // '}' and ']' are their opener + 2
			i++
			if depth > 64 {
				deep = deep[:len(deep)-1]
			}
			depth--
			break
		}
		if object {
			goto key
		}
		goto value
	case 't':
		if len(data)-i < 4 || string(data[i:i+4]) != "true" {
			return i, errSyntax
		}
		i += 4
	case 'f':
		if len(data)-i < 5 || string(data[i:i+5]) != "false" {
			return i, errSyntax
		}
		i += 5
	case 'n':
		if len(data)-i < 4 || string(data[i:i+4]) != "null" {
			return i, errSyntax
		}
		i += 4
	default:
		if i, err = scanNumber(data, i); err != nil {
			return i, err
		}
	}
after: // a value ended at i
	if depth == 0 {
		return i, nil
	}
	i = skipSpace(data, i)
	if i >= len(data) {
		return i, errSyntax
	}
	{
		object := kinds&(1<<(depth-1)) != 0
		if depth > 64 {
			object = deep[depth-65]
		}
		switch data[i] {
		case ',':
			i = skipSpace(data, i+1)
			if object {
				goto key
			}
			goto value
		case '}', ']':
			if object != (data[i] == '}') {
				return i, errSyntax
			}
			i++
			if depth > 64 {
				deep = deep[:len(deep)-1]
			}
			depth--
			goto after
		}
		return i, errSyntax
	}
key: // at a member's key, space before it skipped
	if i >= len(data) || data[i] != '"' {
		return i, errSyntax
	}
	if i, err = scanString(data, i, engine); err != nil {
		return i, err
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ':' {
		return i, errSyntax
	}
	i++
	goto value
}

// scanNumber returns the index just past the JSON number at data[i]:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(data []byte, i int) (int, error) {
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return i, errSyntax
	case data[i] == '0':
		i++
	case data[i] >= '1' && data[i] <= '9':
		i = digits(data, i+1)
	default:
		return i, errSyntax
	}
	if i < len(data) && data[i] == '.' {
		j := digits(data, i+1)
		if j == i+1 {
			return j, errSyntax
		}
		i = j
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		j := digits(data, i)
		if j == i {
			return j, errSyntax
		}
		i = j
	}
	return i, nil
}

func digits(data []byte, i int) int {
	for i < len(data) && data[i] >= '0' && data[i] <= '9' {
		i++
	}
	return i
}

// Words of eight equal bytes, for the tests of scanString.
const (
	ones    = 0x0101010101010101
	highs   = 0x8080808080808080
	quotes  = ones * '"'
	slashes = ones * '\\'
	spaces  = ones * 0x20
)

// scanString returns the index just past the JSON string at data[i] (a quote), checked as
// encoding/json checks it: no control characters, only JSON's escapes. With engine set it also
// refuses what Python engines cannot encode: bytes that are not UTF-8 (errInputUTF8; Go's
// json.Valid accepts them, Python's strict decoder does not) and \u escapes of a UTF-16
// surrogate without its pair (errInputSurrogate; Python decodes them into a string it then
// fails to encode; Go reads U+FFFD).
//
// Eight bytes at a time: a word is passed whole when none of its bytes is a quote, a backslash,
// a control character or (engine) above ASCII. Each test is exact, and a borrow only carries
// upwards, so the lowest flagged byte is the first such byte.
func scanString(data []byte, i int, engine bool) (int, error) {
	var high uint64
	plain := &plainAnyByte
	if engine {
		high, plain = highs, &plainASCIIByte
	}
	j := i + 1
	for {
		if j+8 <= len(data) {
			x := binary.LittleEndian.Uint64(data[j:])
			q, b := x^quotes, x^slashes
			t := ((x-spaces)&^x | (q-ones)&^q | (b-ones)&^b | x&high) & highs
			if t == 0 {
				j += 8
				continue
			}
			j += bits.TrailingZeros64(t) >> 3
		} else {
			for j < len(data) && plain[data[j]] {
				j++
			}
			if j >= len(data) {
				return j, errSyntax
			}
		}
		switch c := data[j]; {
		case c == '"':
			return j + 1, nil
		case c == '\\':
			n, err := scanEscape(data, j, engine)
			if err != nil {
				return j, err
			}
			j += n
		case c < 0x20:
			return j, errSyntax
		case engine: // above ASCII
			r, size := utf8.DecodeRune(data[j:])
			if r == utf8.RuneError && size == 1 {
				return j, fmt.Errorf("%w (in the string at byte %d)", errInputUTF8, i)
			}
			j += size
		default:
			j++
		}
	}
}

// plainAnyByte and plainASCIIByte hold the bytes of a JSON string that need no look: not a
// quote, a backslash or a control character, and for plainASCIIByte not above ASCII either.
var plainAnyByte, plainASCIIByte = func() (all, ascii [256]bool) {
	for c := 0x20; c < 256; c++ {
		all[c] = c != '"' && c != '\\'
		ascii[c] = all[c] && c < utf8.RuneSelf
	}
	return all, ascii
}()

// scanEscape returns the length of the escape at data[j] (a backslash): 2, 6 for a \u escape,
// 12 for a surrogate pair when engine is set (which refuses a surrogate without its pair).
func scanEscape(data []byte, j int, engine bool) (int, error) {
	if j+1 >= len(data) {
		return 0, errSyntax
	}
	switch data[j+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
	default:
		return 0, errSyntax
	}
	r, ok := hex4(data, j+2)
	switch {
	case !ok:
		return 0, errSyntax
	case !engine || r < 0xd800 || r >= 0xe000:
		return 6, nil
	case r < 0xdc00 && j+12 <= len(data) && data[j+6] == '\\' && data[j+7] == 'u':
		if lo, ok := hex4(data, j+8); ok && lo >= 0xdc00 && lo < 0xe000 {
			return 12, nil
		}
	}
	return 0, fmt.Errorf("%w (at byte %d)", errInputSurrogate, j)
}

// hex4 decodes the four hex digits at data[i:]; ok is false when there are not four.
func hex4(data []byte, i int) (r rune, ok bool) {
	if i+4 > len(data) {
		return 0, false
	}
	for _, c := range data[i : i+4] {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(d)
	}
	return r, true
}
