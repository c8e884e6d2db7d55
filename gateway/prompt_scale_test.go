package gateway

import (
	"math"
	"strings"
	"testing"
	"time"
)

// A model's scale is the byte rule's error as its answers report it, used only once it has
// learnt from promptScaleAnswers answers, weighted by the prompts' size, and kept apart from
// other models'.
func TestPromptScaleLearnsTheModelsTokens(t *testing.T) {
	var s promptScales
	for i := range promptScaleAnswers - 1 {
		s.observe("m1", 1000, 750)
		if got := s.of("m1"); got != 1 {
			t.Fatalf("after %d answers the scale is %v, want 1 (the byte rule) until %d", i+1, got, promptScaleAnswers)
		}
	}
	s.observe("m1", 1000, 750)
	if got := s.of("m1"); math.Abs(got-0.75) > 1e-9 {
		t.Fatalf("scale %v, want 0.75", got)
	}
	if got := s.of("m2"); got != 1 {
		t.Fatalf("another model's scale %v, want 1", got)
	}
	// A short prompt, whose chat template weighs more, moves it by its size.
	s.observe("m1", 10, 20)
	if got := s.of("m1"); got < 0.75 || got > 0.76 {
		t.Fatalf("after one 10-token answer the scale is %v, want within a hundredth of 0.75", got)
	}
}

// No answer moves the scale by more than the bounds allow: a usage report a thousand times the
// estimate counts as maxPromptScale times it, and the scale never leaves [minPromptScale,
// maxPromptScale].
func TestPromptScaleIsBounded(t *testing.T) {
	var s promptScales
	for range 2 * promptScaleAnswers {
		s.observe("m1", 100, 1)
	}
	if got := s.of("m1"); got != minPromptScale {
		t.Fatalf("scale %v after answers of 1 token for 100, want %v", got, minPromptScale)
	}
	var h promptScales
	for range promptScaleAnswers {
		h.observe("m1", 1000, 1000)
	}
	h.observe("m1", 1000, 1_000_000)
	// It weighs as one answer of maxPromptScale among the 16 of 1 before it.
	if got, want := h.of("m1"), 1+(maxPromptScale-1)/promptScaleAnswers; got > want {
		t.Fatalf("one absurd answer moved the scale to %v, want at most %v", got, want)
	}
	for range 2000 {
		h.observe("m1", 1000, 1<<40)
	}
	if got := h.of("m1"); got > maxPromptScale || got < maxPromptScale-0.01 {
		t.Fatalf("scale %v after 2,000 absurd answers, want %v", got, maxPromptScale)
	}
	if got := scaleTokens(maxTokenCount, maxPromptScale); got != maxTokenCount {
		t.Fatalf("scaleTokens saturates at %d, got %d", maxTokenCount, got)
	}
	if got := scaleTokens(1, minPromptScale); got != 1 {
		t.Fatalf("scaleTokens(1, %v) = %d, want at least 1", minPromptScale, got)
	}
}

// A piece is sized in routing's tokens: with a scale of one half (a token of the model is eight
// bytes by the byte rule), a piece of 50 tokens is about 400 bytes of text.
func TestPieceIsSizedInTheModelsTokens(t *testing.T) {
	long := words(400)
	body := []byte(`{"model":"m1","prompt":` + string(jsonString(long)) + `}`)
	pc, ok := newPieceCutter(body, false, 0.5)
	if !ok {
		t.Fatal("no cutter")
	}
	b, ok := pc.body(50)
	if !ok {
		t.Fatal("no piece")
	}
	cl := newCall(endpoint{}, time.Now())
	if err := parseBody(b, cl, defaultMaxJSONDepth); err != nil {
		t.Fatal(err)
	}
	if want := long[:strings.LastIndexByte(long[:401], ' ')]; cl.prompt != want {
		t.Fatalf("piece of %d bytes, want %d", len(cl.prompt), len(want))
	}
}
