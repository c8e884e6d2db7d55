package routing

import (
	"context"
	"math"
	"testing"
	"time"
)

// The size of a lower-class prompt's pieces: none without interactive traffic, for interactive
// requests, for prompts no longer than a piece and a half, or when off; else the configured size or,
// learnt, the average interactive prompt (the default objective's slack), at least 64
// tokens; and at least a sixteenth of the prompt either way.
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
		{"learnt: a moving average", 0, []int{300, 1100}, false, 3000, 400},
		{"learnt: at least 64 tokens", 0, []int{10}, false, 1000, 64},
		{"learnt: no larger than the prefill budget", 0, []int{2000}, false, 4000, DefaultLowerPrefillTokens},
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

// The learnt piece follows the interactive attainment: a miss at the engine shrinks it, met
// requests grow it back to the objective's slack, never past it nor below a quarter of it; one
// miss in a hundred verdicts (the 99th percentile's share) leaves it where it was; a configured
// piece does not move.
func TestLearntPieceFollowsAttainment(t *testing.T) {
	piece := func(p *Pool) int {
		k := picker{t: t, p: p, model: "m"}
		l := k.pick("a long batch prompt", Request{PromptTokens: 700})
		defer l.Release(Outcome{})
		return l.PrefillPiece()
	}
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 200}).Release(Outcome{})
	if got := piece(p); got != 200 {
		t.Fatalf("before any verdict: piece %d, want the slack, 200", got)
	}
	for range 5 {
		p.JudgedInteractive(true, 99)
	}
	if got := piece(p); got != 200 {
		t.Errorf("after met requests: piece %d, want no more than the slack, 200", got)
	}
	p.JudgedInteractive(false, 99)
	shrunk := piece(p)
	if want := int(200 * math.Exp(-0.25*0.99)); shrunk != want {
		t.Errorf("after a miss: piece %d, want %d", shrunk, want)
	}
	for range 99 {
		p.JudgedInteractive(true, 99)
	}
	p.JudgedInteractive(false, 99)
	if got := piece(p); got != shrunk {
		t.Errorf("after one miss in a hundred more verdicts: piece %d, want it unmoved at %d", got, shrunk)
	}
	for range 20 {
		p.JudgedInteractive(false, 99)
	}
	if got := piece(p); got != 50 {
		t.Errorf("after many misses: piece %d, want a quarter of the slack, 50", got)
	}
	for range 1000 {
		p.JudgedInteractive(true, 99)
	}
	if got := piece(p); got != 200 {
		t.Errorf("after many met requests: piece %d, want the slack again, 200", got)
	}

	cfg := Config{Workers: testWorkers(1, "m")}
	cfg.Concurrency.PrefillPieceTokens = 300
	fixed, _ := newTestPool(t, cfg)
	picker{t: t, p: fixed, model: "m"}.pick("interactive", Request{Interactive: true, PromptTokens: 200}).Release(Outcome{})
	for range 20 {
		fixed.JudgedInteractive(false, 99)
	}
	if got := piece(fixed); got != 300 {
		t.Errorf("configured: piece %d after misses, want 300", got)
	}
}

// An interactive request placed while its worker prefills a lower-class prompt of this replica's
// is behind it; one placed on a worker prefilling none, or after the first token is back, is not;
// a lower-class request never is.
func TestBehindLowerPrefill(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(1, "m")})
	k := picker{t: t, p: p, model: "m"}
	alone := k.pick("interactive alone", Request{Interactive: true, PromptTokens: 10})
	alone.Release(Outcome{})
	lower := k.pick("lower", Request{PromptTokens: 10})
	if lower.BehindLowerPrefill() || alone.BehindLowerPrefill() {
		t.Errorf("behind a lower-class prefill: lower %v, interactive alone %v; want neither", lower.BehindLowerPrefill(), alone.BehindLowerPrefill())
	}
	behind := k.pick("interactive behind it", Request{Interactive: true, PromptTokens: 10})
	if !behind.BehindLowerPrefill() {
		t.Error("an interactive request placed during a lower-class prefill is not behind it")
	}
	behind.Release(Outcome{})
	lower.Prefilled()
	after := k.pick("interactive after the first token", Request{Interactive: true, PromptTokens: 10})
	if after.BehindLowerPrefill() {
		t.Error("an interactive request placed after the lower-class first token is behind it")
	}
	after.Release(Outcome{})
	lower.Release(Outcome{})
}

// A prompt sent in pieces holds one piece of the worker's lower-class prefill budget, and while
// pieces are on the budget is at most one piece: a worker prefilling a piece takes no other
// lower-class prompt (two pieces in one engine step would delay an interactive prompt by twice
// the objective's slack; before, a budget of 512 let two pieces of 256 in), another worker does,
// and the worker takes one again once the piece is prefilled.
func TestPiecesCountAgainstThePrefillBudget(t *testing.T) {
	cfg := Config{Workers: testWorkers(2, "m")}
	cfg.Concurrency.LowerPrefillTokens = 512
	cfg.Concurrency.PrefillPieceTokens = 256
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Prefilled()
	first := k.pick("first long prompt", Request{PromptTokens: 2000, TargetWorker: "w0"})
	k.refused("a second piece beside the first", Request{PromptTokens: 2000, TargetWorker: "w0"})
	k.refused("a short prompt beside the piece", Request{PromptTokens: 100, TargetWorker: "w0"})
	other := k.pick("a piece on the other worker", Request{PromptTokens: 2000})
	if other.Worker.ID() != "w1" {
		t.Errorf("the second long prompt went to %s, want w1", other.Worker.ID())
	}
	first.Prefilled()
	k.pick("a piece once one is prefilled", Request{PromptTokens: 2000, TargetWorker: "w0"}).Release(Outcome{})
	other.Release(Outcome{})
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

// Every worker takes long lower-class prompts in pieces beside interactive traffic, those that
// schedule by priority too (an engine's priority orders its waiting queue, not the step it is
// in); each prompt holds one piece of its worker's prefill budget.
func TestEveryWorkerTakesPieces(t *testing.T) {
	cfg := Config{Workers: testWorkers(3, "m")}
	cfg.Workers[2].PriorityHandoff = true
	cfg.Concurrency.PrefillPieceTokens = 256
	cfg.Concurrency.PiecesEverywhere = true // the removed knob still loads, and changes nothing
	p, _ := newTestPool(t, cfg)
	k := picker{t: t, p: p, model: "m"}
	k.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Release(Outcome{})
	var leases []*Lease
	for _, id := range []string{"w0", "w1", "w2"} {
		l := k.pick("a long prompt on "+id, Request{PromptTokens: 2000, TargetWorker: id})
		if got := l.PrefillPiece(); got != 256 {
			t.Errorf("%s: pieces of %d, want 256", id, got)
		}
		if w, _ := p.find(id); w.prefill.tokens.Load() != 256 {
			t.Errorf("%s: %d tokens in prefill, want one piece", id, w.prefill.tokens.Load())
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// Interactive requests spread: one not pinned nor sent to a target worker goes to a worker with
// no interactive prompt in prefill while one has room, and to any once none has; a request
// with a target worker goes there whatever it prefills.
func TestInteractiveRequestsSpread(t *testing.T) {
	p, _ := newTestPool(t, Config{Workers: testWorkers(3, "m")})
	k := picker{t: t, p: p, model: "m"}
	var leases []*Lease
	seen := map[string]bool{}
	for i := range 3 {
		l := k.pick("interactive", Request{Interactive: true, PromptTokens: 100})
		if seen[l.Worker.ID()] {
			t.Errorf("interactive request %d went to %s, which prefills another; want a worker with none", i, l.Worker.ID())
		}
		seen[l.Worker.ID()] = true
		leases = append(leases, l)
	}
	leases = append(leases, k.pick("a fourth, every worker prefilling one", Request{Interactive: true, PromptTokens: 100}))
	leases[0].Prefilled()
	if l := k.pick("once one is prefilled", Request{Interactive: true, PromptTokens: 100}); l.Worker != leases[0].Worker {
		t.Errorf("went to %s, want %s: the one worker with no interactive prompt in prefill", l.Worker.ID(), leases[0].Worker.ID())
	} else {
		l.Release(Outcome{})
	}
	target := leases[1].Worker.ID()
	k.pick("a target worker", Request{Interactive: true, PromptTokens: 100, TargetWorker: target}).Release(Outcome{})
	for _, l := range leases {
		l.Release(Outcome{})
	}
}

// A request's prompt tokens in a worker's prefill at once: its prompt whole, or one piece of it
// when it goes in pieces; at least one.
func TestPrefillTokensOnAWorker(t *testing.T) {
	for _, tt := range []struct {
		name           string
		prompt, piece  int
		wantPrefilling int64
	}{
		{"whole", 2000, 0, 2000},
		{"in pieces", 2000, 256, 256},
		{"shorter than a piece", 100, 256, 100},
		{"an empty prompt", 0, 0, 1},
	} {
		if got := prefillTokens(tt.prompt, tt.piece); got != tt.wantPrefilling {
			t.Errorf("%s: %d tokens in prefill, want %d", tt.name, got, tt.wantPrefilling)
		}
	}
}

// The prefill budget and the pieces are divided among the replicas of a fleet that send a worker
// lower-class prompts, beyond two: each counts only its own prompts in the worker's prefill, and
// the engine prefills together what every replica sent it, so three replicas each within the
// whole budget put up to three pieces in the step an interactive prompt waits for (three gateways
// beside a prefill-heavy flood met 96-98% of the interactive objectives where one met 100%).
// A replica's piece is in prefill about one step in two, so n replicas each get 2/n of the
// budget and the piece. A replica that queues only interactive requests does not count; while
// the store is cut, every replica the fleet had does.
func TestPiecesDividedAmongTheReplicasThatSendThem(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	fleet := newMemFleet(clock.Now)
	names := []string{"a", "b", "c", "d"}
	pools := map[string]*Pool{}
	for _, name := range names {
		cfg := Config{Workers: testWorkers(1, "m")}
		cfg.Concurrency.LowerPrefillTokens = 512
		cfg.Concurrency.PrefillPieceTokens = 240
		pools[name], _ = newTestPoolWith(t, cfg, Options{Now: clock.Now, Shares: fleet.replica(name)})
	}
	type demands map[string]func(string) ModelBacklog
	queued := func(interactive, lower float64) func(string) ModelBacklog {
		return func(string) ModelBacklog {
			return ModelBacklog{Interactive: int64(interactive), All: int64(interactive + lower),
				InteractiveWeight: interactive, Weight: interactive + lower}
		}
	}
	none := queued(0, 0)
	exchange := func(demand demands) {
		t.Helper()
		for range 3 { // the split settles over a few exchanges
			clock.Advance(50 * time.Millisecond)
			for _, name := range names[1:] {
				d := demand[name]
				if d == nil {
					d = none
				}
				if err := pools[name].SyncShares(context.Background(), d); err != nil {
					t.Fatalf("%s: exchange: %v", name, err)
				}
			}
			if err := pools["a"].SyncShares(context.Background(), queued(1, 2)); err != nil {
				t.Fatalf("a: exchange: %v", err)
			}
		}
	}
	a := picker{t: t, p: pools["a"], model: "m"}
	exchange(nil)
	a.pick("interactive", Request{Interactive: true, PromptTokens: 10}).Prefilled()
	for _, tt := range []struct {
		name   string
		demand demands
		piece  int
	}{
		{"alone", nil, 240},
		{"b queues batch too: two replicas", demands{"b": queued(0, 5)}, 240},
		{"b, c and d queue batch: four", demands{"b": queued(0, 5), "c": queued(0, 5), "d": queued(0, 1)}, 120},
		{"d queues interactive only: three", demands{"b": queued(0, 5), "c": queued(0, 5), "d": queued(3, 0)}, 160},
	} {
		exchange(tt.demand)
		l := a.pick(tt.name, Request{PromptTokens: 1000})
		if got := l.PrefillPiece(); got != tt.piece {
			t.Errorf("%s: piece %d, want %d", tt.name, got, tt.piece)
		}
		if tt.piece < 240 {
			a.refused(tt.name+": a second piece beyond the replica's part of the budget", Request{PromptTokens: 1000})
		}
		l.Release(Outcome{})
	}

	exchange(nil)
	fleet.setCut(true)
	if err := pools["a"].SyncShares(context.Background(), queued(0, 2)); err == nil {
		t.Fatal("an exchange with the store cut succeeded")
	}
	l := a.pick("store cut", Request{PromptTokens: 1000})
	if got := l.PrefillPiece(); got != 120 {
		t.Errorf("store cut: piece %d, want 120 (every replica the fleet had: four)", got)
	}
	l.Release(Outcome{})

	// A slot engine (its /props told its slots) keeps the whole piece and budget whatever the
	// senders: its batch prompts hold their slots through every piece.
	modelWorkersOf(pools["a"]).slots.Store(4)
	l = a.pick("slot engine, store cut", Request{PromptTokens: 1000})
	if got := l.PrefillPiece(); got != 240 {
		t.Errorf("slot engine, store cut: piece %d, want 240 (not divided)", got)
	}
	l.Release(Outcome{})
}

// A sender's part of a budget is exact and cannot overflow, however large the configured budget.
func TestSenderPart(t *testing.T) {
	for _, tt := range []struct{ v, n, want int64 }{
		{240, 3, 160},
		{240, 4, 120},
		{512, 7, 146},
		{1, 3, 0},
		{math.MaxInt64, 3, math.MaxInt64 / 3 * 2}, // MaxInt64 is 3k+1: 2k, the floor of 2(3k+1)/3
	} {
		if got := senderPart(tt.v, tt.n); got != tt.want {
			t.Errorf("senderPart(%d, %d) = %d, want %d", tt.v, tt.n, got, tt.want)
		}
	}
}
