package gateway

import (
	"math"
	"sync"
	"sync/atomic"
)

// The prompt's size in the model's own tokens. usher estimates a prompt before any engine has
// seen it, by the byte rule (estimateBytes: four bytes a token, OpenAI's rule of thumb), and every
// tokenizer differs from it: common English words are five to six bytes a token in the BPE
// vocabularies of Llama and Qwen, code about three, so the estimate of a chat is about 1.3 times
// its tokens and of code about 0.8. Routing compares prompts with budgets and bounds set in
// tokens (ConcurrencyConfig.LowerPrefillTokens, a prefill piece, the cost model's prefill time per
// token, which it learns from the engine's own counts), so it places by promptScales' estimate,
// the byte rule times what the model's answers say a byte-rule token is in its tokens.
//
// The tenant's limits, budgets and the queue keep the byte rule, which is the published rule:
// answers are learnt from every tenant's calls, and one tenant's text must not change what
// another is allowed (see routeTokens). A hostile tenant can move the learnt scale only within
// [minPromptScale, maxPromptScale], which moves only where and when calls are placed, by no
// more than text of an unusual density moves the byte rule today.

const (
	// minPromptScale and maxPromptScale bound the learnt scale and each answer's share in it.
	// The byte rule is within these of every tokenizer on text (a token is 2 to 8 bytes).
	minPromptScale, maxPromptScale = 0.5, 2.0
	// promptScaleDecay is the weight each answer takes from the ones before it: the last few
	// hundred answers make the scale.
	promptScaleDecay = 1.0 / 256
	// promptScaleAnswers is how many answers the scale needs before it is used.
	promptScaleAnswers = 16
)

// promptScales holds a promptScale per model. Its keys are the models admit let through
// (routing.Pool.Serves), so they are bounded by the fleet's models. Safe for concurrent use.
type promptScales struct{ models sync.Map } // model -> *promptScale

// promptScale is one model's learnt tokens per byte-rule token.
type promptScale struct {
	mu                 sync.Mutex
	estimated, counted float64 // decaying sums of the estimates and of the engines' counts
	answers            int
	learnt             atomic.Uint64 // the scale's float64 bits; 0 until promptScaleAnswers
}

// of is the model's scale: the engines' prompt tokens per byte-rule token over its recent
// answers, or 1 (the byte rule) until it has learnt from promptScaleAnswers. One map load and
// one atomic load; no allocation.
func (s *promptScales) of(model string) float64 {
	v, ok := s.models.Load(model)
	if !ok {
		return 1
	}
	if bits := v.(*promptScale).learnt.Load(); bits != 0 {
		return math.Float64frombits(bits)
	}
	return 1
}

// observe learns from one answer of model: estimated, the byte-rule estimate of its prompt (at
// least 1), and counted, the prompt tokens its engine reported. counted is taken only within
// [minPromptScale, maxPromptScale] times estimated, so no one answer can swing the scale.
// Answers are weighted by their size: a long prompt says more of the tokenizer than a short one,
// whose chat template's tokens weigh more. Cost: a mutex and a few floating-point operations.
func (s *promptScales) observe(model string, estimated, counted int) {
	if estimated <= 0 || counted <= 0 {
		return
	}
	v, ok := s.models.Load(model)
	if !ok {
		v, _ = s.models.LoadOrStore(model, &promptScale{})
	}
	ps := v.(*promptScale)
	e := float64(estimated)
	c := min(max(float64(counted), e*minPromptScale), e*maxPromptScale)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.estimated = ps.estimated*(1-promptScaleDecay) + e
	ps.counted = ps.counted*(1-promptScaleDecay) + c
	ps.answers = min(ps.answers+1, promptScaleAnswers)
	if ps.answers >= promptScaleAnswers {
		scale := min(max(ps.counted/ps.estimated, minPromptScale), maxPromptScale)
		ps.learnt.Store(math.Float64bits(scale))
	}
}

// scaleTokens is tokens, a byte-rule estimate, times scale: at least 1, at most maxTokenCount.
func scaleTokens(tokens int, scale float64) int {
	return int(min(max(math.Round(float64(tokens)*scale), 1), maxTokenCount))
}
