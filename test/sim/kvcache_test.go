package sim

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// stepUntil runs engine steps, without waiting out their cost, until cond holds.
func stepUntil(t *testing.T, s *scheduler, cond func() bool) {
	t.Helper()
	for range 10_000 {
		if cond() {
			return
		}
		s.apply(s.schedule())
	}
	t.Fatal("condition never held")
}

func testScheduler(cfg Config) (*scheduler, *counters) {
	var c counters
	return newScheduler(cfg.withDefaults(), &c, nil, nil), &c
}

func TestBlockPoolLRU(t *testing.T) {
	p := newBlockPool(4, 16)
	a := p.allocate(2)
	p.cache(a[0], 1)
	p.cache(a[1], 2)
	p.release(a) // queue: [free free a1 a0]
	b := p.allocate(2)
	if got := len(p.longestHit([]uint64{1, 2})); got != 2 {
		t.Fatalf("after allocating the empty blocks: got a hit of %d blocks, want 2 (nothing evicted yet)", got)
	}
	p.cache(b[0], 3)
	p.cache(b[1], 4)
	p.release(b) // queue: [a1 a0 b1 b0]
	c := p.allocate(1)
	if got := len(p.longestHit([]uint64{1, 2})); got != 1 {
		t.Errorf("after one more allocation: got a hit of %d blocks for a, want 1 (its deeper block evicted)", got)
	}
	if got := len(p.longestHit([]uint64{3, 4})); got != 2 {
		t.Errorf("b freed later: got a hit of %d blocks, want 2", got)
	}
	if p.evictions != 1 {
		t.Errorf("evictions: got %d, want 1", p.evictions)
	}
	hit := p.longestHit([]uint64{1})
	p.touch(hit)
	if got, want := p.nfree, 2; got != want {
		t.Errorf("free blocks after touching a cached one: got %d, want %d", got, want)
	}
	if got := p.allocate(3); got != nil {
		t.Errorf("allocating 3 of 2 free: got %d blocks, want nil", len(got))
	}
	p.release(c)
	p.release(hit)
	if got, want := p.usage(), 0.0; got != want {
		t.Errorf("usage with nothing held: got %g, want %g", got, want)
	}
}

func TestBlockHashIsChained(t *testing.T) {
	x, y := tokenize("a b"), tokenize("c d")
	if blockHash(1, x) == blockHash(2, x) {
		t.Error("same tokens under different parents hash equal, want different")
	}
	if blockHash(1, x) != blockHash(1, tokenize("a  b")) {
		t.Error("same parent and tokens hash differently, want equal")
	}
	if blockHash(1, x) == blockHash(1, y) {
		t.Error("different tokens hash equal, want different")
	}
}

func TestSchedulerChunkedPrefill(t *testing.T) {
	s, c := testScheduler(Config{MaxNumBatchedTokens: 64, BlockSize: 16})
	q := newSequence(1, tokenize(words("t", 150)), 2, 0)
	s.add(q)
	var chunks []int
	for q.state != stateDone {
		p := s.schedule()
		chunks = append(chunks, p.n...)
		s.apply(p)
	}
	if got, want := fmt.Sprint(chunks), "[64 64 22 1]"; got != want {
		t.Errorf("tokens computed per step: got %s, want %s", got, want)
	}
	if got := c.generatedTokens.Load(); got != 2 {
		t.Errorf("generated: got %d, want 2", got)
	}
	p := s.schedule()
	if !p.empty() {
		t.Errorf("plan after the only sequence finished: got %d sequences, want none", len(p.seqs))
	}
}

func TestSchedulerStepCost(t *testing.T) {
	cfg := Config{
		DecodeBase: 10 * time.Millisecond, DecodePerSeq: time.Millisecond,
		DecodePerKVToken: time.Microsecond, PrefillPerToken: 100 * time.Microsecond,
	}
	s, _ := testScheduler(cfg)
	q := newSequence(1, tokenize(strings.Repeat("w ", 20)), 3, 0)
	s.add(q)
	p := s.schedule()
	// Prefill of 20 tokens: base + per-seq + 20 x 100us.
	if got, want := p.cost, 10*time.Millisecond+time.Millisecond+2*time.Millisecond; got != want {
		t.Errorf("prefill step: got %v, want %v", got, want)
	}
	s.apply(p)
	p = s.schedule()
	// Decode with a 20-token context: base + per-seq + 20 x 1us.
	if got, want := p.cost, 11*time.Millisecond+20*time.Microsecond; got != want {
		t.Errorf("decode step: got %v, want %v", got, want)
	}
	s.apply(p)
}

func TestSchedulerPrefixHitSkipsPrefill(t *testing.T) {
	s, c := testScheduler(Config{})
	prompt := tokenize(words("p", 64))
	first := newSequence(1, prompt, 1, 0)
	s.add(first)
	stepUntil(t, s, func() bool { return first.state == stateDone })
	second := newSequence(2, prompt, 1, 0)
	s.add(second)
	p := s.schedule()
	// All but the last token cacheable: 3 full blocks of 16 of 63 tokens, so 16 to compute.
	if len(p.seqs) != 1 || p.n[0] != 16 {
		t.Fatalf("plan: got %v tokens, want 16 for the one sequence", p.n)
	}
	if got := c.prefixHits.Load(); got != 48 {
		t.Errorf("prefix hits: got %d, want 48", got)
	}
	s.apply(p)
}

func BenchmarkDecodeStep(b *testing.B) {
	for _, seqs := range []int{16, 256} {
		b.Run(fmt.Sprintf("%dseqs", seqs), func(b *testing.B) {
			s, _ := testScheduler(Config{MaxNumSeqs: seqs, KVCacheTokens: 400_000})
			prompts := make([][]uint64, 1024)
			for i := range prompts {
				prompts[i] = tokenize(words(fmt.Sprint("s", i, "-"), 100))
			}
			var arrival uint64
			add := func() {
				arrival++
				s.add(newSequence(arrival, prompts[arrival%uint64(len(prompts))], 512, 0))
			}
			for range seqs {
				add()
			}
			b.ReportAllocs()
			for b.Loop() {
				s.apply(s.schedule())
				for len(s.running)+s.waiting.Len() < seqs {
					add()
				}
			}
		})
	}
}

func TestPriorityPreemptsLowerPriorityForABatchSlot(t *testing.T) {
	for _, tt := range []struct {
		policy          string
		wantPreemptions int64
	}{{PolicyPriority, 1}, {PolicyFCFS, 0}} {
		t.Run(tt.policy, func(t *testing.T) {
			s, c := testScheduler(Config{MaxNumSeqs: 2, SchedulingPolicy: tt.policy})
			batch := []*sequence{newSequence(1, tokenize("a b c"), 50, 2), newSequence(2, tokenize("d e f"), 50, 2)}
			for _, q := range batch {
				s.add(q)
			}
			s.apply(s.schedule())
			urgent := newSequence(3, tokenize("g h i"), 50, 0)
			s.add(urgent)
			s.apply(s.schedule())
			running := slices.Contains(s.running, urgent)
			if got := c.preemptions.Load(); got != tt.wantPreemptions {
				t.Fatalf("preemptions: got %d, want %d", got, tt.wantPreemptions)
			}
			if running != (tt.wantPreemptions == 1) || len(s.running) != 2 {
				t.Fatalf("urgent running: %v with %d running, want %v with 2", running, len(s.running), tt.wantPreemptions == 1)
			}
		})
	}
}
