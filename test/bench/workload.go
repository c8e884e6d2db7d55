package bench

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Item is the content of one request before it is given a tenant and a send time.
type Item struct {
	// System is an optional system prompt: a system message for chat, the head of the prompt
	// for completions.
	System string
	// Prompt is the user message for chat, the rest of the prompt for completions.
	Prompt string
	// PromptWords is the number of words in System and Prompt together.
	PromptWords int
	// MaxTokens is sent as max_tokens.
	MaxTokens int
	// Session, when set, is sent as X-Session-ID.
	Session string
	// At is the arrival offset from the start of the run, for workloads that carry their own
	// arrival times (traces); zero for the others.
	At time.Duration
}

// Workload yields the requests of a run in order. Next returns false when the workload is
// exhausted; synthetic workloads never are. A Workload is used by one goroutine at a time.
type Workload interface {
	Next() (Item, bool)
	// Timed reports whether items carry their own arrival times in Item.At.
	Timed() bool
}

// NewWorkload builds the workload cfg names, reading the trace file when there is one. cfg
// must be valid; defaults are applied here.
func NewWorkload(cfg Config) (Workload, error) {
	cfg = cfg.withDefaults()
	switch cfg.Workload {
	case WorkloadSharedPrefix:
		return NewSharedPrefix(cfg.SharedPrefix, cfg.Seed), nil
	case WorkloadRandom:
		return NewRandom(cfg.Random, cfg.Seed), nil
	case WorkloadTrace:
		return OpenTrace(cfg.Trace, cfg.Seed)
	}
	return nil, fmt.Errorf("workload %q: unknown", cfg.Workload)
}

// SharedPrefix is SGLang's generated-shared-prefix workload: every group shares one system
// prompt and each of its prompts adds its own question. The order of the prompts is shuffled
// across groups by the seed; after the last prompt the same order starts again. Each group is
// one session ("gsp-<group>").
type SharedPrefix struct {
	cfg     SharedPrefixConfig
	seed    uint64
	systems []string
	order   []int // prompt indexes, group*PromptsPerGroup + question
	next    int
}

var _ Workload = (*SharedPrefix)(nil)

// NewSharedPrefix builds the workload; cfg must have no zero fields (see Config defaults).
// It generates the system prompts up front: O(Groups*SystemPromptLen).
func NewSharedPrefix(cfg SharedPrefixConfig, seed uint64) *SharedPrefix {
	w := &SharedPrefix{cfg: cfg, seed: seed, systems: make([]string, cfg.Groups)}
	for g := range w.systems {
		var b strings.Builder
		words(&b, seeded(seed^saltSystemPrompt, uint64(g)), cfg.SystemPromptLen)
		w.systems[g] = b.String()
	}
	w.order = make([]int, cfg.Groups*cfg.PromptsPerGroup)
	for i := range w.order {
		w.order[i] = i
	}
	seeded(seed, saltShuffle).Shuffle(len(w.order), func(i, j int) {
		w.order[i], w.order[j] = w.order[j], w.order[i]
	})
	return w
}

// Len is the number of distinct prompts, Groups*PromptsPerGroup.
func (w *SharedPrefix) Len() int { return len(w.order) }

// Next returns the next prompt in the shuffled order; it never runs out.
func (w *SharedPrefix) Next() (Item, bool) {
	idx := w.order[w.next%len(w.order)]
	w.next++
	g := idx / w.cfg.PromptsPerGroup
	var b strings.Builder
	words(&b, seeded(w.seed^saltQuestion, uint64(idx)), w.cfg.QuestionLen)
	return Item{
		System:      w.systems[g],
		Prompt:      b.String(),
		PromptWords: w.cfg.SystemPromptLen + w.cfg.QuestionLen,
		MaxTokens:   w.cfg.OutputLen,
		Session:     fmt.Sprintf("gsp-%d", g),
	}, true
}

// Timed is false: arrivals come from the rate.
func (w *SharedPrefix) Timed() bool { return false }

// Random yields prompts that share nothing, with lengths drawn around the configured means.
type Random struct {
	cfg     RandomConfig
	seed    uint64
	lengths *rand.Rand
	n       uint64
}

var _ Workload = (*Random)(nil)

// NewRandom builds the workload; cfg must have positive lengths.
func NewRandom(cfg RandomConfig, seed uint64) *Random {
	return &Random{cfg: cfg, seed: seed, lengths: seeded(seed, saltLengths)}
}

// Next returns a fresh prompt; it never runs out.
func (w *Random) Next() (Item, bool) {
	in := spread(w.lengths, w.cfg.InputLen, w.cfg.Spread)
	out := spread(w.lengths, w.cfg.OutputLen, w.cfg.Spread)
	var b strings.Builder
	words(&b, seeded(w.seed^saltRandomText, w.n), in)
	w.n++
	return Item{Prompt: b.String(), PromptWords: in, MaxTokens: out}, true
}

// Timed is false: arrivals come from the rate.
func (w *Random) Timed() bool { return false }

// spread draws uniformly in [n*(1-s), n*(1+s)], at least 1.
func spread(r *rand.Rand, n int, s float64) int {
	if s == 0 {
		return max(n, 1)
	}
	lo := float64(n) * (1 - s)
	v := int(lo + r.Float64()*(float64(n)*2*s))
	return max(v, 1)
}
