// Command mkmodel writes a llama-architecture GGUF model with random weights and a real
// tokenizer, so that llama.cpp's llama-server can run as a real engine in usher's tests although
// no trained weights are within reach. The tokenizer (every tokenizer.* key, chat template
// included) is copied byte for byte from a vocab-only GGUF such as llama.cpp's
// models/ggml-vocab-qwen2.gguf; the weights are normal random numbers from a fixed seed, so the
// file, and the engine's output at temperature 0, are the same on every run.
//
//	go run ./test/realengine/mkmodel --vocab ggml-vocab-qwen2.gguf --out micro.gguf \
//	  --n-embd 64 --n-layer 2 --n-head 4 --n-head-kv 2 --n-ff 128 --ctx 4096
//
// Layout follows llama.cpp's GGUF v3 (docs in ggml's gguf.md): a header, key/value metadata,
// tensor infos, then the tensor data, each piece aligned to 32 bytes.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
)

// shape is the model's size; every field must be positive and nEmbd a multiple of nHead.
type shape struct {
	nEmbd, nLayer, nHead, nHeadKV, nFF, ctx int
	untied                                  bool
}

func main() {
	var (
		vocab = flag.String("vocab", "", "vocab-only GGUF whose tokenizer.* keys are copied")
		out   = flag.String("out", "", "model file to write")
		name  = flag.String("name", "random-llama", "general.name of the model")
		seed  = flag.Uint64("seed", 1, "seed of the random weights")
		s     shape
	)
	flag.IntVar(&s.nEmbd, "n-embd", 256, "embedding width")
	flag.IntVar(&s.nLayer, "n-layer", 4, "transformer blocks")
	flag.IntVar(&s.nHead, "n-head", 4, "attention heads")
	flag.IntVar(&s.nHeadKV, "n-head-kv", 4, "key/value heads (grouped-query attention when fewer than n-head)")
	flag.IntVar(&s.nFF, "n-ff", 768, "feed-forward width")
	flag.IntVar(&s.ctx, "ctx", 4096, "trained context length")
	flag.BoolVar(&s.untied, "untied", false, "a separate random output projection (varied text; tied embeddings repeat one token)")
	flag.Parse()
	if err := run(*vocab, *out, *name, *seed, s); err != nil {
		fmt.Fprintln(os.Stderr, "mkmodel:", err)
		os.Exit(1)
	}
}

func run(vocabPath, outPath, name string, seed uint64, s shape) error {
	if vocabPath == "" || outPath == "" {
		return errors.New("--vocab and --out are required")
	}
	if s.nEmbd <= 0 || s.nLayer <= 0 || s.nHead <= 0 || s.nHeadKV <= 0 || s.nFF <= 0 || s.ctx <= 0 {
		return errors.New("every size must be positive")
	}
	if s.nEmbd%s.nHead != 0 || s.nHead%s.nHeadKV != 0 {
		return errors.New("n-embd must be a multiple of n-head, and n-head of n-head-kv")
	}
	raw, err := os.ReadFile(vocabPath)
	if err != nil {
		return err
	}
	tok, err := readTokenizer(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", vocabPath, err)
	}
	f, err := os.Create(outPath)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	m := model(name, s, tok)
	if err := m.write(w, rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))); err != nil {
		f.Close()
		return err
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "mkmodel: wrote %s: %d tensors, vocab %d, n_embd %d, %d layers\n", outPath, len(m.tensors), tok.nVocab, s.nEmbd, s.nLayer)
	return nil
}

// model lays out llama's metadata and tensors for shape s around the copied tokenizer. Tensor
// dimensions are GGUF's order, innermost first: a weight that maps E inputs to R outputs is
// [E, R].
func model(name string, s shape, tok tokenizer) *gguf {
	u32 := func(v int) value { return u32Value(uint32(v)) }
	m := &gguf{kv: []kv{
		{"general.architecture", stringValue("llama")},
		{"general.name", stringValue(name)},
		{"general.file_type", u32(1)}, // mostly F16
		{"llama.context_length", u32(s.ctx)},
		{"llama.embedding_length", u32(s.nEmbd)},
		{"llama.block_count", u32(s.nLayer)},
		{"llama.feed_forward_length", u32(s.nFF)},
		{"llama.attention.head_count", u32(s.nHead)},
		{"llama.attention.head_count_kv", u32(s.nHeadKV)},
		{"llama.rope.dimension_count", u32(s.nEmbd / s.nHead)},
		{"llama.rope.freq_base", f32Value(10000)},
		{"llama.attention.layer_norm_rms_epsilon", f32Value(1e-5)},
		{"llama.vocab_size", u32(tok.nVocab)},
	}}
	m.raw = tok.kvs
	if !tok.hasChatTemplate {
		m.kv = append(m.kv, kv{"tokenizer.chat_template", stringValue(chatML)})
	}
	e, kvDim := s.nEmbd, s.nEmbd/s.nHead*s.nHeadKV
	m.tensors = append(m.tensors, tensor{name: "token_embd.weight", dims: []int{e, tok.nVocab}, std: 1})
	for i := range s.nLayer {
		p := fmt.Sprintf("blk.%d.", i)
		m.tensors = append(m.tensors,
			tensor{name: p + "attn_norm.weight", dims: []int{e}, ones: true},
			tensor{name: p + "attn_q.weight", dims: []int{e, e}, std: 0.02},
			tensor{name: p + "attn_k.weight", dims: []int{e, kvDim}, std: 0.02},
			tensor{name: p + "attn_v.weight", dims: []int{e, kvDim}, std: 0.02},
			tensor{name: p + "attn_output.weight", dims: []int{e, e}, std: 0.02},
			tensor{name: p + "ffn_norm.weight", dims: []int{e}, ones: true},
			tensor{name: p + "ffn_gate.weight", dims: []int{e, s.nFF}, std: 0.02},
			tensor{name: p + "ffn_up.weight", dims: []int{e, s.nFF}, std: 0.02},
			tensor{name: p + "ffn_down.weight", dims: []int{s.nFF, e}, std: 0.02},
		)
	}
	m.tensors = append(m.tensors, tensor{name: "output_norm.weight", dims: []int{e}, ones: true})
	if s.untied {
		m.tensors = append(m.tensors, tensor{name: "output.weight", dims: []int{e, tok.nVocab}, std: 0.5})
	}
	return m
}

// chatML is the template added when the vocab carries none (the Qwen2 vocab has its own).
const chatML = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}" +
	"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
