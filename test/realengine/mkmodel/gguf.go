package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
)

// GGUF value types, as numbered by the format.
const (
	typeUint8 uint32 = iota
	typeInt8
	typeUint16
	typeInt16
	typeUint32
	typeInt32
	typeFloat32
	typeBool
	typeString
	typeArray
	typeUint64
	typeInt64
	typeFloat64
)

// GGML tensor types used here.
const (
	ggmlF32 uint32 = 0
	ggmlF16 uint32 = 1
)

const (
	magic     = "GGUF"
	version   = 3
	alignment = 32 // general.alignment's default
)

// tokenizer is what the model takes from a vocab file: the tokenizer.* key/value pairs as they
// were encoded there, the vocabulary size and whether a chat template was among them.
type tokenizer struct {
	kvs             [][]byte
	nVocab          int
	hasChatTemplate bool
}

// readTokenizer parses the metadata of a GGUF file (version 2 or 3) and keeps its tokenizer.*
// pairs. It reads no tensor data.
func readTokenizer(b []byte) (tokenizer, error) {
	r := &reader{b: b}
	if string(r.next(4)) != magic {
		return tokenizer{}, errors.New("not a GGUF file")
	}
	if v := r.u32(); v != 2 && v != 3 {
		return tokenizer{}, fmt.Errorf("GGUF version %d, want 2 or 3", v)
	}
	r.u64() // tensor count
	n := r.u64()
	var tok tokenizer
	for i := uint64(0); i < n && r.err == nil; i++ {
		start := r.off
		key := string(r.str())
		typ := r.u32()
		if key == "tokenizer.ggml.tokens" {
			if typ != typeArray {
				return tokenizer{}, errors.New("tokenizer.ggml.tokens is not an array")
			}
			tok.nVocab = int(binary.LittleEndian.Uint64(r.peek(12)[4:]))
		}
		r.skip(typ)
		if len(key) > len("tokenizer.") && key[:len("tokenizer.")] == "tokenizer." {
			tok.kvs = append(tok.kvs, b[start:r.off])
			tok.hasChatTemplate = tok.hasChatTemplate || key == "tokenizer.chat_template"
		}
	}
	if r.err != nil {
		return tokenizer{}, r.err
	}
	if tok.nVocab == 0 {
		return tokenizer{}, errors.New("no tokenizer.ggml.tokens")
	}
	return tok, nil
}

// reader walks a GGUF byte slice; the first overrun sets err and every later read returns
// zeros.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) next(n int) []byte {
	p := r.peek(n)
	r.off += len(p)
	return p
}

func (r *reader) peek(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		if r.err == nil {
			r.err = fmt.Errorf("truncated at byte %d", r.off)
		}
		return make([]byte, max(n, 0))
	}
	return r.b[r.off : r.off+n]
}

func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.next(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.next(8)) }

func (r *reader) str() []byte {
	n := r.u64()
	if n > uint64(len(r.b)) {
		r.err = fmt.Errorf("string of %d bytes at byte %d", n, r.off)
		return nil
	}
	return r.next(int(n))
}

// skip passes over one value of type typ.
func (r *reader) skip(typ uint32) {
	switch typ {
	case typeUint8, typeInt8, typeBool:
		r.next(1)
	case typeUint16, typeInt16:
		r.next(2)
	case typeUint32, typeInt32, typeFloat32:
		r.next(4)
	case typeUint64, typeInt64, typeFloat64:
		r.next(8)
	case typeString:
		r.str()
	case typeArray:
		elem, n := r.u32(), r.u64()
		if elem == typeArray {
			r.err = errors.New("nested arrays are not supported")
			return
		}
		for i := uint64(0); i < n && r.err == nil; i++ {
			r.skip(elem)
		}
	default:
		r.err = fmt.Errorf("unknown value type %d at byte %d", typ, r.off)
	}
}

// value is one encoded metadata value: its type followed by its bytes.
type value []byte

func u32Value(v uint32) value {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, typeUint32), v)
}

func f32Value(v float32) value {
	return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, typeFloat32), math.Float32bits(v))
}

func stringValue(s string) value {
	return appendString(binary.LittleEndian.AppendUint32(nil, typeString), s)
}

func appendString(b []byte, s string) []byte {
	return append(binary.LittleEndian.AppendUint64(b, uint64(len(s))), s...)
}

type kv struct {
	key string
	val value
}

// tensor is one weight: ones (a norm, F32) or normal random numbers with deviation std (F16).
type tensor struct {
	name string
	dims []int
	ones bool
	std  float64
}

func (t tensor) elems() int {
	n := 1
	for _, d := range t.dims {
		n *= d
	}
	return n
}

func (t tensor) size() int {
	if t.ones {
		return 4 * t.elems()
	}
	return 2 * t.elems()
}

// gguf is a model file to write: metadata pairs (kv, then raw pairs copied from another file)
// and tensors.
type gguf struct {
	kv      []kv
	raw     [][]byte
	tensors []tensor
}

func (m *gguf) write(w io.Writer, rng *rand.Rand) error {
	var h bytes.Buffer
	h.WriteString(magic)
	binary.Write(&h, binary.LittleEndian, uint32(version))
	binary.Write(&h, binary.LittleEndian, uint64(len(m.tensors)))
	binary.Write(&h, binary.LittleEndian, uint64(len(m.kv)+len(m.raw)))
	for _, p := range m.kv {
		h.Write(appendString(nil, p.key))
		h.Write(p.val)
	}
	for _, p := range m.raw {
		h.Write(p)
	}
	off := 0
	for _, t := range m.tensors {
		h.Write(appendString(nil, t.name))
		binary.Write(&h, binary.LittleEndian, uint32(len(t.dims)))
		for _, d := range t.dims {
			binary.Write(&h, binary.LittleEndian, uint64(d))
		}
		typ := ggmlF16
		if t.ones {
			typ = ggmlF32
		}
		binary.Write(&h, binary.LittleEndian, typ)
		binary.Write(&h, binary.LittleEndian, uint64(off))
		off = align(off + t.size())
	}
	h.Write(make([]byte, align(h.Len())-h.Len()))
	if _, err := w.Write(h.Bytes()); err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<16)
	for _, t := range m.tensors {
		n := t.elems()
		for i := 0; i < n; i++ {
			if t.ones {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(1))
			} else {
				buf = binary.LittleEndian.AppendUint16(buf, float16(float32(rng.NormFloat64()*t.std)))
			}
			if len(buf) >= cap(buf)-4 {
				if _, err := w.Write(buf); err != nil {
					return err
				}
				buf = buf[:0]
			}
		}
		buf = append(buf, make([]byte, align(t.size())-t.size())...)
	}
	_, err := w.Write(buf)
	return err
}

func align(n int) int { return (n + alignment - 1) / alignment * alignment }

// float16 converts f to IEEE half precision, rounding to nearest even; too large becomes
// infinity, too small zero.
func float16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23&0xff) - 127 + 15
	mant := b & 0x7fffff
	switch {
	case exp >= 31:
		return sign | 0x7c00
	case exp <= 0:
		if exp < -10 {
			return sign
		}
		shift := uint(14 - exp)
		m := mant | 0x800000
		return sign | uint16((m+(1<<(shift-1)))>>shift)
	}
	h := uint32(exp)<<10 | mant>>13
	if rem := mant & 0x1fff; rem > 0x1000 || rem == 0x1000 && h&1 == 1 {
		h++
	}
	return sign | uint16(h)
}
