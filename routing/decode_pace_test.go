package routing

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"
)

// A piece whose step kept within the interactive answer's target (2 idle steps with the
// default factor) waits for nothing; a longer one waits for the idle steps that bring the mean
// step back to it, at most maxDecodePace.
func TestDecodePace(t *testing.T) {
	const s = 10 * time.Millisecond
	for _, tt := range []struct {
		name string
		p, s time.Duration
		want time.Duration
	}{
		{"no step learnt", 50 * time.Millisecond, 0, 0},
		{"no piece time", 0, s, 0},
		{"a piece within the target", 15 * time.Millisecond, s, 0},
		// (50 + n 10) / (1 + n) = 20 at n = 3: three idle steps.
		{"a piece of five steps", 50 * time.Millisecond, s, 30 * time.Millisecond},
		{"a piece that waited long in the engine", time.Minute, s, maxDecodePace},
	} {
		if got := decodePace(tt.p, tt.s); got != tt.want {
			t.Errorf("%s: decodePace(%v, %v) = %v, want %v", tt.name, tt.p, tt.s, got, tt.want)
		}
	}
}

// AwaitDecodes holds a lower-class request after a long piece only once interactive answers have
// missed their TPOT objective beside pieces (JudgedDecode), only while an interactive request of
// this replica's decodes on its worker (past its first token, not released), and lets it go when
// that one ends; a short piece, an interactive lease, an interactive request still in prefill,
// and one released before its first token hold nothing. An interactive answer decoded beside
// pieces when one was sent to its worker from its first token to its release.
func TestAwaitDecodes(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	k := picker{t: t, p: p, model: "m"}
	lower := k.pick("lower", Request{PromptTokens: 10})
	defer lower.Release(Outcome{})
	rng := rand.New(rand.NewPCG(7, 8))
	for range 500 {
		lower.Worker.cost.observe(placement{}, 0, steps.answer(rng, 100+rng.IntN(2000), 0, 20, placement{}, 0.05))
	}
	idle, ok := lower.Worker.PredictIdle(1, 0)
	if !ok || idle.TPOT <= 0 {
		t.Fatalf("the worker's idle step is not learnt: %v, %v", idle, ok)
	}
	long := 100 * idle.TPOT
	// The pace starts at nothing: the interactive TPOT has not been seen to miss beside pieces.
	early := k.pick("interactive before any miss", Request{Interactive: true, PromptTokens: 10})
	early.Prefilled()
	if err := lower.AwaitDecodes(context.Background(), long); err != nil {
		t.Fatalf("no pace yet: %v", err)
	}
	if early.DecodedBesidePieces() {
		t.Error("an interactive answer with no piece sent beside it decoded beside pieces")
	}
	lower.PieceSent()
	if !early.DecodedBesidePieces() {
		t.Error("an interactive answer with a piece sent beside it did not decode beside pieces")
	}
	early.Release(Outcome{})
	lower.PieceSent()
	if !early.DecodedBesidePieces() {
		t.Error("a released answer forgot the piece sent beside it")
	}
	for range 5 {
		p.JudgedDecode(false, 99)
	}
	returnsAtOnce := func(what string, l *Lease, took time.Duration) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- l.AwaitDecodes(context.Background(), took) }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: still waiting", what)
		}
	}
	returnsAtOnce("no interactive request", lower, long)
	gone := k.pick("interactive released in prefill", Request{Interactive: true, PromptTokens: 10})
	gone.Release(Outcome{})
	gone.Prefilled()
	inter := k.pick("interactive", Request{Interactive: true, PromptTokens: 10})
	returnsAtOnce("an interactive request in prefill", lower, long)
	inter.Prefilled()
	returnsAtOnce("a piece within the target", lower, idle.TPOT)
	returnsAtOnce("the interactive lease itself", inter, long)

	done := make(chan error, 1)
	go func() { done <- lower.AwaitDecodes(context.Background(), long) }()
	select {
	case err := <-done:
		t.Fatalf("returned %v after a long piece while an interactive request decodes", err)
	case <-time.After(20 * time.Millisecond):
	}
	inter.Release(Outcome{})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("after the interactive request ended: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("still waiting after the interactive request ended")
	}
	if n := lower.Worker.interactiveDecodes.Load(); n != 0 {
		t.Errorf("interactive decodes after every release: %d, want 0", n)
	}

	again := k.pick("interactive again", Request{Interactive: true, PromptTokens: 10})
	again.Prefilled()
	defer again.Release(Outcome{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := lower.AwaitDecodes(ctx, long); err == nil {
		t.Error("a cancelled wait returned nil")
	}
}

// The pace's share follows the TPOT verdicts of interactive answers decoded beside pieces: each
// miss raises it by a quarter (less the percentile's share), each met lowers it by a quarter of
// the percentile's share, within [0, 1]; one miss in a hundred keeps it where it is at the
// 99th percentile.
func TestPaceFollowsTPOTAttainment(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	near := func(what string, want float64) {
		t.Helper()
		if got := p.paceShare(); got < want-1e-9 || got > want+1e-9 {
			t.Errorf("%s: share %v, want %v", what, got, want)
		}
	}
	near("at the start", 0)
	p.JudgedDecode(true, 99)
	near("a met answer at 0", 0)
	p.JudgedDecode(false, 99)
	near("one miss", 0.25*0.99)
	for range 10 {
		p.JudgedDecode(false, 99)
	}
	near("eleven misses", 1)
	for range 99 {
		p.JudgedDecode(true, 99)
	}
	p.JudgedDecode(false, 99)
	near("one miss in a hundred", 1)
	for range 1000 {
		p.JudgedDecode(true, 99)
	}
	near("a thousand met", 0)
}
