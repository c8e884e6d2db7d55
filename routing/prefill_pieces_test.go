package routing

import (
	"context"
	"testing"
	"time"
)

// The size of a lower-class prompt's pieces: none without interactive traffic, for interactive
// requests, for prompts no longer than a piece and a half, or when off; else the configured size or,
// learnt, the average interactive prompt, at least 64 tokens; and at least a sixteenth of the
// prompt either way.
func TestPrefillPieceSize(t *testing.T) {
	for _, tt := range []struct {
		name        string
		config      int
		interactive []int // prompt tokens of the interactive requests routed first
		class       bool  // the request is interactive
		prompt      int
		want        int
	}{
		{"no interactive traffic", 100, nil, false, 1000, 0},
		{"configured", 100, []int{10}, false, 1000, 100},
		{"prompt within a piece", 100, []int{10}, false, 100, 0},
		{"prompt within a piece and a half: no piece would go ahead", 100, []int{10}, false, 150, 0},
		{"a piece ahead and half a piece after", 100, []int{10}, false, 151, 100},
		{"off", -1, []int{10}, false, 1000, 0},
		{"an interactive request goes whole", 100, []int{10}, true, 1000, 0},
		{"learnt: the interactive prompt", 0, []int{300}, false, 1000, 300},
		{"learnt: a moving average", 0, []int{300, 1100}, false, 5000, 400},
		{"learnt: at least 64 tokens", 0, []int{10}, false, 1000, 64},
		{"learnt: at most 16 pieces", 0, []int{10}, false, 16000, 1000},
		{"configured: at most 16 pieces too", 100, []int{10}, false, 16001, 1001},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config{Workers: testWorkers(1, "m")}
			cfg.Concurrency.PrefillPieceTokens = tt.config
			p, _ := newTestPool(t, cfg)
			k := picker{t: t, p: p, model: "m"}
			for _, n := range tt.interactive {
				k.pick("interactive", Request{Interactive: true, PromptTokens: n}).Release(Outcome{})
			}
			l := k.pick("the request", Request{Interactive: tt.class, PromptTokens: tt.prompt})
			defer l.Release(Outcome{})
			if got := l.PrefillPiece(); got != tt.want {
				t.Errorf("piece %d, want %d", got, tt.want)
			}
		})
	}
}

// A prompt sent in pieces holds one piece of the worker's lower-class prefill budget, so two
// long prompts can be in prefill on one worker where whole they could not.
func TestPiecesCountAgainstThePrefillBudget(t *testing.T) {
	cfg := Config{Workers: testWorkers(1, "m")}
	cfg.Concurrency.LowerPrefillTokens = 512
	cfg.Concurrency.PrefillPieceTokens = 256
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Prefilled()
	first := k.pick("first long prompt", Request{PromptTokens: 2000})
	second := k.pick("second long prompt, a piece beside a piece", Request{PromptTokens: 2000})
	k.refused("a third piece is over the budget", Request{PromptTokens: 2000})
	first.Prefilled()
	k.pick("a piece once one is prefilled", Request{PromptTokens: 2000}).Release(Outcome{})
	second.Release(Outcome{})
	first.Release(Outcome{})
}

// AwaitInteractive returns at once without an interactive prompt in prefill on the worker, and
// otherwise when its first token is back.
func TestAwaitInteractive(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	k := picker{t: t, p: p, model: "m"}
	lower := k.pick("lower", Request{PromptTokens: 10})
	defer lower.Release(Outcome{})
	if err := lower.AwaitInteractive(context.Background()); err != nil {
		t.Fatalf("no interactive prefill: %v", err)
	}
	inter := k.pick("interactive", Request{Interactive: true, PromptTokens: 10})
	done := make(chan error, 1)
	go func() { done <- lower.AwaitInteractive(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("returned %v while an interactive prompt is in prefill", err)
	case <-time.After(20 * time.Millisecond):
	}
	inter.Prefilled()
	if err := <-done; err != nil {
		t.Fatalf("after the interactive first token: %v", err)
	}
	inter.Release(Outcome{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	again := k.pick("interactive again", Request{Interactive: true, PromptTokens: 10})
	defer again.Release(Outcome{})
	if err := lower.AwaitInteractive(ctx); err == nil {
		t.Error("a cancelled wait returned nil")
	}
}

// With several workers, long lower-class prompts go whole to all but one: a worker with a whole
// prompt in prefill takes the next in pieces, and so does the last worker without one; an
// interactive request goes first to a worker without one. Once the whole prompt is prefilled its
// worker may take another whole.
func TestOneWorkerKeepsItsStepsToPieces(t *testing.T) {
	cfg := Config{Workers: testWorkers(2, "m")}
	cfg.Concurrency.PrefillPieceTokens = 256
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10, TargetWorker: "w1"}).Release(Outcome{})
	long := func(worker string) Request { return Request{PromptTokens: 2000, TargetWorker: worker} }

	whole := k.pick("a long prompt on w0", long("w0"))
	if got := whole.PrefillPiece(); got != 0 {
		t.Fatalf("the first long prompt goes in pieces of %d, want whole", got)
	}
	pieced := k.pick("a long prompt on w1", long("w1"))
	if got := pieced.PrefillPiece(); got != 256 {
		t.Fatalf("the long prompt on the last worker without a whole one: pieces of %d, want 256", got)
	}
	for range 5 {
		inter := k.pick("interactive", Request{Interactive: true, PromptTokens: 10})
		if inter.Worker.ID() != "w1" {
			t.Errorf("an interactive request went to %s, which prefills a whole prompt; want w1", inter.Worker.ID())
		}
		inter.Release(Outcome{})
	}
	pieced.Prefilled()
	whole.Prefilled()
	again := k.pick("a long prompt on w0 once the first is prefilled", long("w0"))
	if got := again.PrefillPiece(); got != 0 {
		t.Errorf("after the whole prompt was prefilled: pieces of %d, want whole", got)
	}
	w0, _ := p.find("w0")
	again.Release(Outcome{})
	pieced.Release(Outcome{})
	whole.Release(Outcome{})
	if n := w0.wholePrefills.Load(); n != 0 {
		t.Errorf("after every lease ended, w0 counts %d whole prompts in prefill", n)
	}
}

// With pieces everywhere, no long prompt goes whole beside interactive traffic, on any worker.
func TestPiecesEverywhere(t *testing.T) {
	cfg := Config{Workers: testWorkers(2, "m")}
	cfg.Concurrency.PrefillPieceTokens = 256
	cfg.Concurrency.PiecesEverywhere = true
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Release(Outcome{})
	for _, id := range []string{"w0", "w1"} {
		l := k.pick("a long prompt on "+id, Request{PromptTokens: 2000, TargetWorker: id})
		if got := l.PrefillPiece(); got != 256 {
			t.Errorf("%s: pieces of %d, want 256", id, got)
		}
		l.Release(Outcome{})
	}
}

// A worker that schedules by priority gets long prompts whole: usher sends it more than it runs
// at once, so a request not answered yet may be waiting in its queue, where the engine puts
// interactive requests first; such prompts neither count as whole ones nor steer interactive
// requests away.
func TestPriorityHandoffWorkerTakesPromptsWhole(t *testing.T) {
	cfg := Config{Workers: testWorkers(2, "m")}
	for i := range cfg.Workers {
		cfg.Workers[i].PriorityHandoff = true
	}
	cfg.Concurrency.PrefillPieceTokens = 256
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Release(Outcome{})
	var leases []*Lease
	for _, id := range []string{"w0", "w1"} {
		l := k.pick("a long prompt on "+id, Request{PromptTokens: 2000, TargetWorker: id})
		if got := l.PrefillPiece(); got != 0 {
			t.Errorf("%s: pieces of %d, want whole", id, got)
		}
		leases = append(leases, l)
	}
	for _, id := range []string{"w0", "w1"} {
		if w, _ := p.find(id); w.wholePrefills.Load() != 0 || w.prefill.tokens.Load() != 2000 {
			t.Errorf("%s: %d whole prompts, %d tokens in prefill; want 0 and 2000", id, w.wholePrefills.Load(), w.prefill.tokens.Load())
		}
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// A request's prompt tokens in a worker's prefill at once: its prompt whole, one piece of it
// when it goes in pieces, whole on a worker that schedules by priority; at least one.
func TestPrefillTokensOnAWorker(t *testing.T) {
	specs := testWorkers(2, "m")
	specs[1].PriorityHandoff = true
	p, _ := newTestPool(t, Config{Workers: specs})
	ws := modelWorkers(t, p, "m")
	for _, tt := range []struct {
		name           string
		prompt, piece  int
		w              *Worker
		wantPiece      int
		wantPrefilling int64
	}{
		{"whole", 2000, 0, ws[0], 0, 2000},
		{"in pieces", 2000, 256, ws[0], 256, 256},
		{"shorter than a piece", 100, 256, ws[0], 256, 100},
		{"whole on a worker that schedules by priority", 2000, 256, ws[1], 0, 2000},
		{"an empty prompt", 0, 0, ws[0], 0, 1},
	} {
		c := choice{Request: &Request{Model: "m", PromptTokens: tt.prompt}, piece: tt.piece}
		if got := c.pieceOn(tt.w); got != tt.wantPiece {
			t.Errorf("%s: piece %d, want %d", tt.name, got, tt.wantPiece)
		}
		if got := c.prefillTokens(tt.w); got != tt.wantPrefilling {
			t.Errorf("%s: %d tokens in prefill, want %d", tt.name, got, tt.wantPrefilling)
		}
	}
}
