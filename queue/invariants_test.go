package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
)

// TestInFlightNeverExceedsCapacity runs random enqueues, completions and capacity changes and
// checks after each step that every dispatch left in-flight within capacity, and Standard and
// Batch outside the interactive reserve.
func TestInFlightNeverExceedsCapacity(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			q, clk, _ := newQueue(t, queue.Config{FIFO: fifo}, queue.Capacity{Requests: 8, Tokens: 4000})
			rng := rand.New(rand.NewPCG(1, 2))
			var pending []*queue.Ticket
			var running []*queue.Grant
			var dispatched int64
			for step := range 5000 {
				switch op := rng.IntN(10); {
				case op < 5:
					tk, err := q.Enqueue(queue.Request{
						Tenant: fmt.Sprint("t", rng.IntN(5)), Class: queue.Class(rng.IntN(3)),
						PromptTokens: rng.IntN(400), MaxTokens: rng.IntN(400),
					})
					if err == nil {
						pending = append(pending, tk)
					}
				case op < 9 && len(running) > 0:
					i := rng.IntN(len(running))
					running[i].Done(queue.Usage{PromptTokens: rng.IntN(400), CompletionTokens: rng.IntN(400)})
					running = slices.Delete(running, i, i+1)
				case op == 9:
					q.SetCapacity(queue.Capacity{Requests: rng.IntN(12), Tokens: 1000 + rng.IntN(4000)})
				}
				clk.Advance(time.Millisecond)
				pending = slices.DeleteFunc(pending, func(tk *queue.Ticket) bool {
					if !ready(tk) {
						return false
					}
					if g, err := tk.Wait(context.Background()); err == nil {
						running = append(running, g)
					}
					return true
				})
				s := q.Snapshot()
				var total int64
				for _, c := range s.Classes {
					total += c.Dispatched
				}
				if total == dispatched {
					continue
				}
				dispatched = total
				if s.InFlight.Requests > s.Capacity.Requests || s.InFlight.Tokens > s.Capacity.Tokens {
					t.Fatalf("step %d: in flight %+v, want within capacity %+v", step, s.InFlight, s.Capacity)
				}
				if fifo {
					continue
				}
				if r, tok := lowerInFlight(s); r > s.Capacity.Requests-s.Reserve.Requests ||
					tok > int64(s.Capacity.Tokens-s.Reserve.Tokens) {
					t.Fatalf("step %d: lower classes hold %d requests, %d tokens, want within %+v minus reserve %+v",
						step, r, tok, s.Capacity, s.Reserve)
				}
			}
			if dispatched < 1000 {
				t.Fatalf("got %d dispatches, want a busy run (>= 1000)", dispatched)
			}
		})
	}
}

// TestNoRequestLostOrDispatchedTwice hammers one queue from many goroutines that enqueue (some
// with deadlines), cancel and complete, while others change capacity, move the clock (firing
// deadline timers) and take snapshots; then it checks that every ticket ended exactly once (a
// grant, a cancellation, an expiry or a refusal) and nothing is left queued or in flight.
func TestNoRequestLostOrDispatchedTwice(t *testing.T) {
	for _, fifo := range []bool{false, true} {
		t.Run(fmt.Sprintf("fifo=%v", fifo), func(t *testing.T) {
			q, clk, _ := newQueue(t, queue.Config{FIFO: fifo}, queue.Capacity{Requests: 4, Tokens: 2000})
			const goroutines, perG = 16, 400
			var grants, cancels, expired, refused atomic.Int64
			var seen sync.Map
			stop := make(chan struct{})
			var background sync.WaitGroup
			background.Go(func() {
				rng := rand.New(rand.NewPCG(7, 7))
				for {
					select {
					case <-stop:
						return
					default:
						q.SetCapacity(queue.Capacity{Requests: rng.IntN(6), Tokens: 500 + rng.IntN(2000)})
					}
				}
			})
			background.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						clk.Advance(time.Millisecond)
						q.Snapshot()
					}
				}
			})
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 3))
					for i := range perG {
						r := queue.Request{Tenant: fmt.Sprint("t", rng.IntN(8)), Class: queue.Class(rng.IntN(3)),
							Weight: float64(1 + rng.IntN(3)), PromptTokens: rng.IntN(200), MaxTokens: rng.IntN(200)}
						if rng.IntN(3) == 0 {
							r.Deadline = clk.Now().Add(time.Duration(rng.IntN(50)) * time.Millisecond)
						}
						if rng.IntN(3) == 0 {
							r.Due = clk.Now().Add(time.Duration(rng.IntN(20)) * time.Millisecond)
						}
						tk, err := q.Enqueue(r)
						if err != nil {
							if !errors.Is(err, queue.ErrDeadlineUnreachable) {
								t.Errorf("Enqueue: got %v, want admitted or deadline_unreachable", err)
							}
							refused.Add(1)
							continue
						}
						ctx, cancel := context.WithCancel(context.Background())
						switch rng.IntN(3) {
						case 0:
							cancel()
						case 1:
							go cancel()
						}
						gr, err := tk.Wait(ctx)
						cancel()
						switch {
						case err == nil:
							if _, dup := seen.LoadOrStore(tk, i); dup {
								t.Errorf("ticket granted twice")
							}
							grants.Add(1)
							u := queue.Usage{PromptTokens: r.PromptTokens, CompletionTokens: rng.IntN(r.MaxTokens + 1)}
							gr.Done(u)
							gr.Done(u)
						case errors.Is(err, context.Canceled):
							cancels.Add(1)
						case errors.Is(err, queue.ErrDeadlineExceeded):
							expired.Add(1)
						default:
							t.Errorf("Wait: got %v, want a grant, context.Canceled or ErrDeadlineExceeded", err)
						}
					}
				})
			}
			// Capacity 0 may hold waiters until the changer runs again; it runs until all end.
			wg.Wait()
			close(stop)
			background.Wait()
			total := grants.Load() + cancels.Load() + expired.Load() + refused.Load()
			if total != goroutines*perG {
				t.Fatalf("got %d grants + %d cancels + %d expired + %d refused = %d, want %d", grants.Load(),
					cancels.Load(), expired.Load(), refused.Load(), total, goroutines*perG)
			}
			s := q.Snapshot()
			if queued(s) != 0 || s.InFlight != (queue.Capacity{}) {
				t.Fatalf("after the run: %d queued, %+v in flight, want none", queued(s), s.InFlight)
			}
			if grants.Load() == 0 || expired.Load() == 0 {
				t.Fatalf("got %d grants, %d expired, want some of each", grants.Load(), expired.Load())
			}
			t.Logf("%d grants, %d cancels, %d expired, %d refused", grants.Load(), cancels.Load(), expired.Load(), refused.Load())
		})
	}
}

// TestLowerClassNeverTakesInteractiveReserve floods Standard and Batch and checks they stop
// where only the reserve is left free, whatever interactive already holds, and that
// interactive requests then dispatch at once into the reserve.
func TestLowerClassNeverTakesInteractiveReserve(t *testing.T) {
	tests := []struct {
		name         string
		capacity     queue.Capacity
		reserve      float64
		interactive  int // already in flight before the flood
		cost         int // prompt = max = cost/2
		wantLowerReq int
	}{
		{name: "interactive holds some", capacity: queue.Capacity{Requests: 20}, reserve: 0.10, interactive: 5, cost: 10, wantLowerReq: 13},
		{name: "requests bind", capacity: queue.Capacity{Requests: 20, Tokens: 100000}, reserve: 0.10, cost: 100, wantLowerReq: 18},
		{name: "tokens bind", capacity: queue.Capacity{Requests: 100, Tokens: 10000}, reserve: 0.25, cost: 1000, wantLowerReq: 7},
		{name: "small pool keeps one slot for lower classes", capacity: queue.Capacity{Requests: 1}, reserve: 0.5, cost: 10, wantLowerReq: 1},
		{name: "two slots hold one back", capacity: queue.Capacity{Requests: 2}, reserve: 0.1, cost: 10, wantLowerReq: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _, _ := newQueue(t, queue.Config{InteractiveReserve: new(tt.reserve)}, tt.capacity)
			for range tt.interactive {
				granted(t, enqueue(t, q, queue.Request{Tenant: "chat", Class: queue.Interactive, MaxTokens: tt.cost}))
			}
			for i := range 200 {
				c := queue.Batch
				if i%2 == 0 {
					c = queue.Standard
				}
				enqueue(t, q, queue.Request{Tenant: "bulk", Class: c, PromptTokens: tt.cost / 2, MaxTokens: tt.cost / 2})
			}
			s := q.Snapshot()
			if r, _ := lowerInFlight(s); r != tt.wantLowerReq {
				t.Fatalf("lower classes hold %d requests, want %d (capacity %+v, reserve %+v)", r, tt.wantLowerReq, s.Capacity, s.Reserve)
			}
			room := s.Reserve.Requests
			if s.Capacity.Tokens > 0 {
				room = min(room, s.Reserve.Tokens/tt.cost)
			}
			for range room {
				tk := enqueue(t, q, queue.Request{Tenant: "chat", Class: queue.Interactive, PromptTokens: tt.cost / 2, MaxTokens: tt.cost / 2})
				granted(t, tk)
			}
		})
	}
}

// TestReserveHeldWhileInteractiveIdle checks that the held reserve is never given to lower
// classes even over many completions.
func TestReserveHeldWhileInteractiveIdle(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 10})
	var tks []*queue.Ticket
	for range 100 {
		tks = append(tks, enqueue(t, q, queue.Request{Tenant: "b", Class: queue.Batch, MaxTokens: 1}))
	}
	for _, tk := range tks {
		if !ready(tk) {
			continue
		}
		if r, _ := lowerInFlight(q.Snapshot()); r > 9 {
			t.Fatalf("batch holds %d, want at most 9", r)
		}
		granted(t, tk).Done(queue.Usage{CompletionTokens: 1})
	}
}

// TestWorkConservationBatchUsesIdleCapacity checks that with nothing else queued, batch fills
// all capacity it may use, and takes freed capacity at once.
func TestWorkConservationBatchUsesIdleCapacity(t *testing.T) {
	tests := []struct {
		name    string
		reserve float64
		want    int
	}{
		{name: "default reserve", reserve: 0.10, want: 9},
		{name: "no reserve", reserve: 0, want: 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, _, _ := newQueue(t, queue.Config{InteractiveReserve: new(tt.reserve)}, queue.Capacity{Requests: 10, Tokens: 100000})
			var tks []*queue.Ticket
			for i := range 50 {
				tks = append(tks, enqueue(t, q, queue.Request{Tenant: fmt.Sprint("b", i%3), Class: queue.Batch, PromptTokens: 100, MaxTokens: 100}))
			}
			if got := q.Snapshot().InFlight.Requests; got != tt.want {
				t.Fatalf("in flight %d, want %d", got, tt.want)
			}
			for _, tk := range tks {
				if ready(tk) {
					granted(t, tk).Done(queue.Usage{PromptTokens: 100, CompletionTokens: 100})
					if got := q.Snapshot().InFlight.Requests; got != tt.want {
						t.Fatalf("after a completion in flight %d, want %d", got, tt.want)
					}
					break
				}
			}
		})
	}
}

// TestTenantsOfEqualWeightStayWithinBoundedTokenDifference keeps two (or more) tenants
// backlogged with requests of varied sizes and checks that the weighted tokens served stay
// within a bound of each other at every completion.
func TestTenantsOfEqualWeightStayWithinBoundedTokenDifference(t *testing.T) {
	tests := []struct {
		name    string
		weights []float64
	}{
		{name: "equal weights", weights: []float64{1, 1}},
		{name: "weights 2:1", weights: []float64{2, 1}},
		{name: "three tenants 1:1:3", weights: []float64{1, 1, 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4})
			rng := rand.New(rand.NewPCG(5, 9))
			s := newSim(t, q, clk)
			const maxIn, maxOut = 400, 400
			// Each request: real usage up to its estimate; service time proportional to output.
			top := func() {
				for i, w := range tt.weights {
					for s.pendingOf(fmt.Sprint("t", i)) < 20 {
						in, out := 1+rng.IntN(maxIn), 1+rng.IntN(maxOut)
						s.add(queue.Request{Tenant: fmt.Sprint("t", i), Class: queue.Standard, Weight: w, PromptTokens: in, MaxTokens: out},
							queue.Usage{PromptTokens: in, CompletionTokens: 1 + rng.IntN(out)}, time.Duration(out)*time.Millisecond)
					}
				}
			}
			top()
			// Bound: one maximal request's weighted charge per tenant in flight plus one at the
			// head, from the VTC paper's bound of 2 x capacity x max request cost.
			bound := 2 * 4 * float64(maxIn+2*maxOut)
			for range 3000 {
				s.step()
				top()
				var lo, hi float64
				for i, w := range tt.weights {
					v := s.weighted(fmt.Sprint("t", i)) / w
					if i == 0 || v < lo {
						lo = v
					}
					if i == 0 || v > hi {
						hi = v
					}
				}
				if hi-lo > bound {
					t.Fatalf("weighted tokens served differ by %.0f, want at most %.0f (served %v)", hi-lo, bound, s.served)
				}
			}
			var total float64
			for i := range tt.weights {
				total += s.weighted(fmt.Sprint("t", i))
			}
			if total < 1e6 {
				t.Fatalf("served %.0f weighted tokens, want a long run", total)
			}
		})
	}
}

// TestDeadlinesOrderedWithinFlow checks earliest-deadline-first inside one tenant and class.
func TestDeadlinesOrderedWithinFlow(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{})
	now := clk.Now()
	offsets := []int{7, 3, 9, 1, 5, 2, 8, 4, 6}
	tks := map[*queue.Ticket]int{}
	for _, o := range offsets {
		tk := enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Standard, MaxTokens: 1,
			Deadline: now.Add(time.Duration(o) * time.Minute)})
		tks[tk] = o
	}
	// A request without a deadline goes after all with one.
	last := enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Standard, MaxTokens: 1})
	tks[last] = 100
	q.SetCapacity(queue.Capacity{Requests: 1})
	got := serveInTurn(t, tks)
	if !slices.IsSorted(got) {
		t.Fatalf("dispatch order by deadline minute %v, want ascending", got)
	}
}

// TestExpiredEndsWithErrDeadlineExceeded checks a request whose deadline passes while queued
// ends at that instant with ErrDeadlineExceeded, and is never dispatched after it.
func TestExpiredEndsWithErrDeadlineExceeded(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{})
	now := clk.Now()
	early := enqueue(t, q, queue.Request{Tenant: "a", MaxTokens: 1, Deadline: now.Add(100 * time.Millisecond)})
	late := enqueue(t, q, queue.Request{Tenant: "b", MaxTokens: 1, Deadline: now.Add(time.Second)})
	clk.Advance(99 * time.Millisecond)
	if ready(early) {
		t.Fatalf("ended 1ms before its deadline, want still queued")
	}
	clk.Advance(time.Millisecond)
	if err := ended(t, early); !errors.Is(err, queue.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want ErrDeadlineExceeded", err)
	}
	if ready(late) {
		t.Fatalf("later deadline ended early")
	}
	clk.Advance(time.Second)
	if err := ended(t, late); !errors.Is(err, queue.ErrDeadlineExceeded) {
		t.Fatalf("got %v, want ErrDeadlineExceeded", err)
	}
	q.SetCapacity(queue.Capacity{Requests: 10})
	s := q.Snapshot()
	if s.DeadlineMisses != 2 || s.InFlight.Requests != 0 || queued(s) != 0 {
		t.Fatalf("got %d misses, %d in flight, %d queued, want 2, 0, 0", s.DeadlineMisses, s.InFlight.Requests, queued(s))
	}
}

// serviceTime dispatches and completes one request taking d, so the queue has measured a
// service time of d.
func measure(t *testing.T, q *queue.Queue, clk *fakeClock, d time.Duration) {
	t.Helper()
	tk := enqueue(t, q, queue.Request{Tenant: "probe", Class: queue.Interactive, MaxTokens: 10})
	g := granted(t, tk)
	clk.Advance(d)
	g.Done(queue.Usage{CompletionTokens: 10})
}

// TestUnreachableDeadlineRefusedAtArrival checks that a deadline the queued work ahead makes
// impossible is refused at once with a Retry-After, and a reachable one admitted.
func TestUnreachableDeadlineRefusedAtArrival(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 2})
	now := clk.Now()
	// Before any measurement, everything is admitted.
	enqueue(t, q, queue.Request{Tenant: "x", Class: queue.Interactive, MaxTokens: 1, Deadline: now.Add(time.Hour)}).Wait(context.Background())
	q.SetCapacity(queue.Capacity{Requests: 3})
	measure(t, q, clk, time.Second)
	// Fill the two free slots, then queue 10 interactive requests of one tenant: 10 ahead over
	// 3 slots of 1s each is about 3.3s.
	for range 12 {
		enqueue(t, q, queue.Request{Tenant: "busy", Class: queue.Interactive, MaxTokens: 1})
	}
	now = clk.Now()
	tests := []struct {
		name     string
		req      queue.Request
		wantErr  bool
		minRetry time.Duration
	}{
		{name: "same tenant, 1s budget", req: queue.Request{Tenant: "busy", Class: queue.Interactive, Deadline: now.Add(time.Second)}, wantErr: true, minRetry: 2 * time.Second},
		{name: "already past", req: queue.Request{Tenant: "new", Class: queue.Interactive, Deadline: now}, wantErr: true, minRetry: time.Second},
		{name: "batch behind interactive, 2s budget", req: queue.Request{Tenant: "new", Class: queue.Batch, Deadline: now.Add(2 * time.Second)}, wantErr: true, minRetry: time.Second},
		{name: "same tenant, 10s budget", req: queue.Request{Tenant: "busy", Class: queue.Interactive, Deadline: now.Add(10 * time.Second)}},
		{name: "other tenant jumps the backlog by fair share", req: queue.Request{Tenant: "new", Class: queue.Interactive, Deadline: now.Add(2 * time.Second)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := q.Enqueue(tt.req)
			if !tt.wantErr {
				if err != nil {
					t.Fatalf("got %v, want admitted", err)
				}
				return
			}
			rej := rejection(t, err, queue.DeadlineUnreachable)
			if !errors.Is(err, queue.ErrDeadlineUnreachable) {
				t.Fatalf("errors.Is(%v, ErrDeadlineUnreachable) = false, want true", err)
			}
			if rej.RetryAfter < tt.minRetry {
				t.Fatalf("Retry-After %v, want at least %v", rej.RetryAfter, tt.minRetry)
			}
		})
	}
}

// TestDeadlineEstimateCountsOtherTenantsTurns checks that a request deep in its tenant's queue
// is refused at arrival when the fair share will serve the other backlogged tenants' turns first,
// even while those tenants have only a little queued right now (they keep sending): admitted, it
// would wait its whole deadline for a 504.
func TestDeadlineEstimateCountsOtherTenantsTurns(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	measure(t, q, clk, time.Second)
	granted(t, enqueue(t, q, queue.Request{Tenant: "running", Class: queue.Standard, MaxTokens: 1}))
	for _, tenant := range []string{"b", "c"} {
		enqueue(t, q, queue.Request{Tenant: tenant, Class: queue.Standard, MaxTokens: 1})
	}
	for range 3 {
		enqueue(t, q, queue.Request{Tenant: "d", Class: queue.Standard, MaxTokens: 1})
	}
	// d's fourth request waits for its three, and for b and c to be served as often: about
	// 3 + 2 x 4 = 11 rounds of 1s, not the 5 requests queued now.
	_, err := q.Enqueue(queue.Request{Tenant: "d", Class: queue.Standard, MaxTokens: 1, Deadline: clk.Now().Add(6 * time.Second)})
	rejection(t, err, queue.DeadlineUnreachable)
	// A new tenant goes first by the fair share: its wait is one turn of each backlogged flow.
	enqueue(t, q, queue.Request{Tenant: "e", Class: queue.Standard, MaxTokens: 1, Deadline: clk.Now().Add(6 * time.Second)})
}

// TestCapsRefuseWithQueueFull checks the per-tenant and per-class caps.
func TestCapsRefuseWithQueueFull(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{MaxQueuedPerTenant: 2, MaxQueuedPerClass: 3}, queue.Capacity{})
	steps := []struct {
		tenant string
		class  queue.Class
		full   bool
	}{
		{"a", queue.Batch, false},
		{"a", queue.Standard, false},
		{"a", queue.Batch, true}, // tenant a has 2 over all classes
		{"b", queue.Batch, false},
		{"c", queue.Batch, false},
		{"d", queue.Batch, true}, // batch has 3
		{"d", queue.Interactive, false},
	}
	for i, st := range steps {
		_, err := q.Enqueue(queue.Request{Tenant: st.tenant, Class: st.class, MaxTokens: 1})
		if !st.full {
			if err != nil {
				t.Fatalf("step %d (%s, %v): got %v, want admitted", i, st.tenant, st.class, err)
			}
			continue
		}
		rej := rejection(t, err, queue.QueueFull)
		if rej.RetryAfter < queue.DefaultMinRetryAfter {
			t.Fatalf("step %d: Retry-After %v, want at least %v", i, rej.RetryAfter, queue.DefaultMinRetryAfter)
		}
	}
}

// TestTierCapPerTenant checks a request's own MaxQueued (its tier's cap) applies when lower than
// the queue-wide cap, and never raises it.
func TestTierCapPerTenant(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{MaxQueuedPerTenant: 3}, queue.Capacity{})
	steps := []struct {
		tenant    string
		maxQueued int
		full      bool
	}{
		{"a", 1, false},
		{"a", 1, true}, // the tier allows one
		{"b", 10, false},
		{"b", 10, false},
		{"b", 10, false},
		{"b", 10, true}, // the queue-wide cap of 3 is lower
	}
	for i, st := range steps {
		_, err := q.Enqueue(queue.Request{Tenant: st.tenant, Class: queue.Standard, MaxTokens: 1, MaxQueued: st.maxQueued})
		if st.full {
			rejection(t, err, queue.QueueFull)
		} else if err != nil {
			t.Fatalf("step %d: got %v, want admitted", i, err)
		}
	}
}

// TestTooLargeRefused checks a request no pool state could hold is refused, not queued forever.
func TestTooLargeRefused(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4, Tokens: 1000})
	_, err := q.Enqueue(queue.Request{Class: queue.Batch, PromptTokens: 500, MaxTokens: 450})
	rejection(t, err, queue.TooLarge) // 950 > 1000 - 100 reserve
	tk := enqueue(t, q, queue.Request{Class: queue.Interactive, PromptTokens: 500, MaxTokens: 450})
	granted(t, tk)
	waiting := enqueue(t, q, queue.Request{Class: queue.Interactive, PromptTokens: 500, MaxTokens: 450})
	q.SetCapacity(queue.Capacity{Requests: 4, Tokens: 900})
	rejection(t, ended(t, waiting), queue.TooLarge)
}

// TestCloseEndsAllQueuedWithShutdown checks that Close ends every queued ticket with a
// Shutdown Rejection, refuses later arrivals, and leaves given grants usable.
func TestCloseEndsAllQueuedWithShutdown(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	first := granted(t, enqueue(t, q, queue.Request{Tenant: "a", MaxTokens: 1}))
	var tks []*queue.Ticket
	for i := range 30 {
		tks = append(tks, enqueue(t, q, queue.Request{Tenant: fmt.Sprint(i % 4), Class: queue.Class(i % 3), MaxTokens: 1,
			Deadline: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}))
	}
	q.Close()
	for i, tk := range tks {
		err := ended(t, tk)
		if !errors.Is(err, queue.ErrShutdown) {
			t.Fatalf("ticket %d: got %v, want ErrShutdown", i, err)
		}
		if rej := rejection(t, err, queue.Shutdown); rej.RetryAfter != queue.DefaultShutdownRetryAfter {
			t.Fatalf("Retry-After %v, want %v", rej.RetryAfter, queue.DefaultShutdownRetryAfter)
		}
	}
	_, err := q.Enqueue(queue.Request{Tenant: "late"})
	rejection(t, err, queue.Shutdown)
	first.Done(queue.Usage{CompletionTokens: 1})
	if s := q.Snapshot(); s.InFlight.Requests != 0 || queued(s) != 0 {
		t.Fatalf("after close: %+v in flight, %d queued, want none", s.InFlight, queued(s))
	}
	q.Close()
}

// TestCancelFreesAtOnce checks that a cancelled wait leaves the queue at once, and that
// removing a blocked head of line lets the requests behind it go.
func TestCancelFreesAtOnce(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4, Tokens: 1000})
	running := granted(t, enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Interactive, PromptTokens: 300}))
	big := enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Interactive, PromptTokens: 800})
	small := enqueue(t, q, queue.Request{Tenant: "b", Class: queue.Interactive, PromptTokens: 100})
	if ready(big) || ready(small) {
		t.Fatalf("dispatched past a head of line that does not fit")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := big.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: got %v, want context.Canceled", err)
	}
	granted(t, small)
	s := q.Snapshot()
	if queued(s) != 0 || s.InFlight.Requests != 2 {
		t.Fatalf("got %d queued, %d in flight, want 0 and 2", queued(s), s.InFlight.Requests)
	}
	running.Done(queue.Usage{PromptTokens: 300})
}

// TestCancelAfterDispatchGivesCapacityBack checks that a wait abandoned by its context after
// the ticket was dispatched (the race Wait resolves) frees the slot.
func TestCancelAfterDispatchGivesCapacityBack(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	first := enqueue(t, q, queue.Request{Tenant: "a", MaxTokens: 1})
	second := enqueue(t, q, queue.Request{Tenant: "a", MaxTokens: 1})
	// first is ready; a cancelled context still gets its grant, since Wait prefers a result.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g, err := first.Wait(ctx)
	if err != nil {
		t.Fatalf("Wait on a dispatched ticket: got %v, want the grant", err)
	}
	g.Done(queue.Usage{})
	granted(t, second).Done(queue.Usage{})
	if s := q.Snapshot(); s.InFlight.Requests != 0 {
		t.Fatalf("in flight %d, want 0", s.InFlight.Requests)
	}
}

// TestStarvationGuardGivesBatchItsMinimumShare floods interactive and checks batch still gets
// its configured share of dispatches while backlogged, and standard too.
func TestStarvationGuardGivesBatchItsMinimumShare(t *testing.T) {
	tests := []struct {
		name       string
		batchShare float64
		wantMin    int // of 1000 dispatches, the first 10 before batch arrives
		wantMax    int
	}{
		{name: "default 5%", batchShare: 0.05, wantMin: 48, wantMax: 51},
		{name: "20%", batchShare: 0.20, wantMin: 195, wantMax: 201},
		{name: "guard off", batchShare: 0, wantMin: 0, wantMax: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, clk, _ := newQueue(t, queue.Config{BatchMinShare: new(tt.batchShare), StandardMinShare: new(0.0),
				MaxQueuedPerClass: 5000, MaxQueuedPerTenant: 5000}, queue.Capacity{Requests: 10})
			s := newSim(t, q, clk)
			for range 1500 {
				s.add(queue.Request{Tenant: "chat", Class: queue.Interactive, MaxTokens: 10}, queue.Usage{CompletionTokens: 10}, time.Second)
			}
			for range 300 {
				s.add(queue.Request{Tenant: "bulk", Class: queue.Batch, MaxTokens: 10}, queue.Usage{CompletionTokens: 10}, time.Second)
			}
			for s.dispatches() < 1000 {
				s.step()
			}
			snap := q.Snapshot()
			got := int(snap.Classes[queue.Batch].Dispatched)
			if got < tt.wantMin || got > tt.wantMax {
				t.Fatalf("batch got %d of %d dispatches, want %d..%d", got, s.dispatches(), tt.wantMin, tt.wantMax)
			}
		})
	}
}

// TestReturningTenantGetsNoCreditForIdling: a tenant that was idle while another was served
// starts at the least counter of the backlogged tenants, so it alternates with them instead
// of taking the pool until it has caught up.
func TestReturningTenantGetsNoCreditForIdling(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	s := newSim(t, q, clk)
	usage := queue.Usage{PromptTokens: 100, CompletionTokens: 100}
	req := func(tenant string) queue.Request {
		return queue.Request{Tenant: tenant, Class: queue.Standard, PromptTokens: 100, MaxTokens: 100}
	}
	// b is served once, then idles while a is served 50 times.
	s.add(req("b"), usage, time.Second)
	for range 60 {
		s.add(req("a"), usage, time.Second)
	}
	for range 50 {
		s.step()
	}
	for range 20 {
		s.add(req("b"), usage, time.Second)
	}
	var order []string
	for range 20 {
		s.step()
		order = append(order, s.done[len(s.done)-1].req.Tenant)
	}
	run, longest := 1, 1
	for i := 1; i < len(order); i++ {
		if order[i] == order[i-1] {
			run++
			longest = max(longest, run)
		} else {
			run = 1
		}
	}
	if longest > 2 {
		t.Fatalf("completion order after b returned %v: a run of %d, want a and b alternating", order, longest)
	}
}

// TestFIFOServesInArrivalOrder checks the baseline: one line over all classes and tenants.
func TestFIFOServesInArrivalOrder(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{FIFO: true}, queue.Capacity{})
	var tks []*queue.Ticket
	for i := range 30 {
		tks = append(tks, enqueue(t, q, queue.Request{Tenant: fmt.Sprint("t", i%4), Class: queue.Class(2 - i%3),
			PromptTokens: 10 * (i % 7), MaxTokens: 1, Deadline: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).Add(-time.Duration(i) * time.Hour)}))
	}
	q.SetCapacity(queue.Capacity{Requests: 1})
	for i, tk := range tks {
		g := granted(t, tk)
		for _, later := range tks[i+1:] {
			if ready(later) {
				t.Fatalf("request %d dispatched while %d runs, want arrival order", slices.Index(tks, later), i)
			}
		}
		g.Done(queue.Usage{CompletionTokens: 1})
	}
}

// TestLateLast: within one tenant and class, a request found past its due (the last moment its
// dispatch meets its latency objective) goes after the requests not past theirs, which keep
// their order (deadline, then arrival; no due: never late); the late ones go in that order too,
// once none of the others waits. A late request still ends at its deadline while others are
// served before it.
func TestLateLast(t *testing.T) {
	q, clk, reg := newQueue(t, queue.Config{}, queue.Capacity{})
	now := clk.Now()
	due := func(d time.Duration) queue.Request {
		return queue.Request{Tenant: "a", Class: queue.Standard, MaxTokens: 1, Due: now.Add(d)}
	}
	names := map[*queue.Ticket]string{}
	for _, r := range []struct {
		name string
		r    queue.Request
	}{
		{"a", due(100 * time.Millisecond)}, {"b", due(100 * time.Millisecond)}, {"c", due(10 * time.Second)},
		{"d", queue.Request{Tenant: "a", Class: queue.Standard, MaxTokens: 1}}, {"e", due(50 * time.Millisecond)},
	} {
		names[enqueue(t, q, r.r)] = r.name
	}
	clk.Advance(200 * time.Millisecond)
	q.SetCapacity(queue.Capacity{Requests: 1})
	if got := strings.Join(serveInTurn(t, names), ""); got != "cdabe" {
		t.Fatalf("served %q, want cdabe: the two on time in arrival order, then the three late", got)
	}
	if n := value(t, reg, "usher_queue_late_total", map[string]string{"model": "m", "class": "standard"}); n != 3 {
		t.Fatalf("usher_queue_late_total = %v, want 3", n)
	}

	q.SetCapacity(queue.Capacity{})
	now = clk.Now()
	late := enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Standard, MaxTokens: 1,
		Due: now.Add(10 * time.Millisecond), Deadline: now.Add(time.Second)})
	onTime := enqueue(t, q, due(time.Minute))
	clk.Advance(20 * time.Millisecond)
	q.SetCapacity(queue.Capacity{Requests: 1})
	g := granted(t, onTime)
	if ready(late) {
		t.Fatal("the late request was served with the worker's one slot taken")
	}
	clk.Advance(time.Second)
	if err := ended(t, late); !errors.Is(err, queue.ErrDeadlineExceeded) {
		t.Fatalf("the late request ended with %v at its deadline, want ErrDeadlineExceeded", err)
	}
	g.Done(queue.Usage{CompletionTokens: 1})
}

// TestDeadlineEstimateSkipsLateRequests: a tenant's requests past their due go after its new one
// (late last), so a deadline they would make unreachable in arrival order is admitted, and the
// new request is served before them.
func TestDeadlineEstimateSkipsLateRequests(t *testing.T) {
	q, clk, reg := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	measure(t, q, clk, time.Second)
	g := granted(t, enqueue(t, q, queue.Request{Tenant: "running", Class: queue.Standard, MaxTokens: 1}))
	var late []*queue.Ticket
	for range 5 {
		late = append(late, enqueue(t, q, queue.Request{Tenant: "d", Class: queue.Standard, MaxTokens: 1,
			Due: clk.Now().Add(time.Millisecond)}))
	}
	clk.Advance(10 * time.Millisecond)
	// In arrival order it would wait for five rounds of 1s; its own late requests go after it.
	fresh := enqueue(t, q, queue.Request{Tenant: "d", Class: queue.Standard, MaxTokens: 1,
		Deadline: clk.Now().Add(3 * time.Second), Due: clk.Now().Add(time.Second)})
	if n := value(t, reg, "usher_queue_late_total", map[string]string{"model": "m", "class": "standard"}); n != 5 {
		t.Fatalf("usher_queue_late_total = %v, want 5", n)
	}
	g.Done(queue.Usage{CompletionTokens: 1})
	granted(t, fresh).Done(queue.Usage{CompletionTokens: 1})
	for _, tk := range late {
		if ready(tk) {
			granted(t, tk).Done(queue.Usage{CompletionTokens: 1})
		}
	}
}

// serveInTurn serves the tickets of a queue of capacity one request, each as it is dispatched,
// until all are, and returns their labels in the order they were dispatched.
func serveInTurn[L any](t *testing.T, tks map[*queue.Ticket]L) []L {
	t.Helper()
	var got []L
	for range len(tks) {
		var g *queue.Grant
		for tk, label := range tks {
			if ready(tk) {
				got = append(got, label)
				g = granted(t, tk)
				delete(tks, tk)
				break
			}
		}
		if g == nil {
			t.Fatalf("nothing dispatched after %v", got)
		}
		g.Done(queue.Usage{CompletionTokens: 1})
	}
	return got
}
