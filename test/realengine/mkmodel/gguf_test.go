package main

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

func TestFloat16(t *testing.T) {
	tests := []struct {
		in   float32
		want uint16
	}{
		{0, 0x0000},
		{1, 0x3c00},
		{-2, 0xc000},
		{0.5, 0x3800},
		{65504, 0x7bff},
		{1e6, 0x7c00},
		{float32(math.Ldexp(1, -14)), 0x0400}, // smallest normal
		{float32(math.Ldexp(1, -24)), 0x0001}, // smallest subnormal
		{float32(math.Ldexp(1, -30)), 0x0000},
		{1 + float32(math.Ldexp(1, -11)), 0x3c00}, // halfway: to even
		{1 + float32(math.Ldexp(3, -11)), 0x3c02}, // halfway: to even, up
	}
	for _, tt := range tests {
		if got := float16(tt.in); got != tt.want {
			t.Errorf("float16(%g): got %#04x, want %#04x", tt.in, got, tt.want)
		}
	}
}

// A model written from a vocab reads back as a vocab: its tokenizer keys survive byte for byte,
// its header counts match and its tensor data starts aligned.
func TestModelRoundTrip(t *testing.T) {
	vocab := &gguf{kv: []kv{
		{"general.architecture", stringValue("llama")},
		{"tokenizer.ggml.model", stringValue("gpt2")},
		{"tokenizer.ggml.tokens", tokens("a", "b", "c")},
		{"tokenizer.ggml.bos_token_id", u32Value(1)},
	}}
	var vb bytes.Buffer
	if err := vocab.write(&vb, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	tok, err := readTokenizer(vb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if tok.nVocab != 3 || len(tok.kvs) != 3 || tok.hasChatTemplate {
		t.Fatalf("got vocab %d, %d tokenizer keys, template %v; want 3, 3, false", tok.nVocab, len(tok.kvs), tok.hasChatTemplate)
	}
	m := model("t", shape{nEmbd: 8, nLayer: 1, nHead: 2, nHeadKV: 1, nFF: 16, ctx: 64, untied: true}, tok)
	var mb bytes.Buffer
	if err := m.write(&mb, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	back, err := readTokenizer(mb.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if back.nVocab != 3 || len(back.kvs) != 4 || !back.hasChatTemplate {
		t.Fatalf("model: got vocab %d, %d tokenizer keys, template %v; want 3, 4 (chat template added), true", back.nVocab, len(back.kvs), back.hasChatTemplate)
	}
	for i, kv := range tok.kvs { // after the added chat template
		if !bytes.Equal(kv, back.kvs[i+1]) {
			t.Fatalf("tokenizer key %d changed", i)
		}
	}
	b := mb.Bytes()
	if n := binary.LittleEndian.Uint64(b[8:]); n != uint64(len(m.tensors)) {
		t.Fatalf("tensor count: got %d, want %d", n, len(m.tensors))
	}
	data := 0
	for _, t := range m.tensors {
		data += align(t.size())
	}
	if hdr := len(b) - data; hdr%alignment != 0 || hdr <= 0 {
		t.Fatalf("%d bytes before the tensor data, want a positive multiple of %d", hdr, alignment)
	}
}

func TestReadTokenizerRefusesBadFiles(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":     nil,
		"not gguf":  []byte("GGML and more bytes"),
		"truncated": append([]byte("GGUF"), 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0),
		"huge key":  append([]byte("GGUF\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00"), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f),
	} {
		if _, err := readTokenizer(b); err == nil {
			t.Errorf("%s: got no error", name)
		}
	}
}

func tokens(ts ...string) value {
	v := binary.LittleEndian.AppendUint32(nil, typeArray)
	v = binary.LittleEndian.AppendUint32(v, typeString)
	v = binary.LittleEndian.AppendUint64(v, uint64(len(ts)))
	for _, s := range ts {
		v = appendString(v, strings.Clone(s))
	}
	return v
}
