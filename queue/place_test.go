package queue_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
)

// workers is a fake fleet for the Placer: free slots per worker, tried in name order.
type workers struct {
	free  map[string]int
	names []string
	tries int // Place calls
}

func newWorkers(free map[string]int) *workers {
	w := &workers{free: free}
	for n := range free {
		w.names = append(w.names, n)
	}
	slices.Sort(w.names)
	return w
}

// slot is a request's Placer: on its target worker, or any with room.
type slot struct {
	w       *workers
	target  string
	on      string // where it was placed
	waiting int    // what its last Place was told
}

var errGone = errors.New("worker gone")

func (s *slot) Place(waiting int) (queue.Placement, error) {
	s.w.tries++
	s.waiting = waiting
	for _, n := range s.w.names {
		if s.target != "" && n != s.target || s.w.free[n] == 0 {
			continue
		}
		s.w.free[n]--
		s.on = n
		return s, nil
	}
	if _, ok := s.w.free[s.target]; s.target != "" && !ok {
		return nil, errGone
	}
	return nil, fmt.Errorf("worker full: %w", queue.ErrNoRoom)
}

func (s *slot) Undo() { s.w.free[s.on]++ }

// A request whose worker is full does not hold back, while it waits, the requests behind it
// that can go elsewhere; it goes first once its worker has room.
func TestRequestWhoseWorkerIsFullDoesNotBlockTheOnesBehind(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4})
	fleet := newWorkers(map[string]int{"a": 1, "b": 1})
	req := func(tenant, target string) (queue.Request, *slot) {
		s := &slot{w: fleet, target: target}
		return queue.Request{Tenant: tenant, Class: queue.Standard, PromptTokens: 10, MaxTokens: 10, Placer: s}, s
	}
	r0, s0 := req("t", "a")
	g0 := granted(t, enqueue(t, q, r0))
	if g0.Placement != s0 || s0.on != "a" || s0.waiting != 0 {
		t.Fatalf("first request placed %v on %q told %d waiting, want its own slot on a and none waiting",
			g0.Placement, s0.on, s0.waiting)
	}
	r1, s1 := req("t", "a") // a is full
	pinned := enqueue(t, q, r1)
	r2, s2 := req("t", "")
	later := enqueue(t, q, r2)
	r3, _ := req("u", "")
	third := enqueue(t, q, r3)
	if ready(pinned) {
		t.Fatal("the request for the full worker a was released")
	}
	if !ready(later) || s2.on != "b" {
		t.Fatalf("the later request, which b can take: ready %v, placed on %q; want released on b", ready(later), s2.on)
	}
	if s2.waiting != 1 {
		t.Fatalf("the later request's Place was told %d others waiting, want 1 (the pinned one)", s2.waiting)
	}
	if ready(third) {
		t.Fatal("a request was released with no worker free")
	}
	// a frees: the pinned request, ahead of the third in the queue's order, has it.
	s0.Undo()
	g0.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 10})
	if !ready(pinned) || ready(third) {
		t.Fatalf("after a freed: pinned ready %v, third ready %v; want the pinned one", ready(pinned), ready(third))
	}
	if s1.waiting != 1 {
		t.Fatalf("the pinned request's Place was told %d others waiting, want 1 (the third)", s1.waiting)
	}
}

// With the Placer deciding, requests are served in exactly the queue's order (classes, fair
// share between tenants, earliest deadline within one): the order a queue releases them in with
// room for one request at a time.
func TestOrderOfServiceIsTheQueuesOrder(t *testing.T) {
	reqs := []queue.Request{
		{Tenant: "a", Class: queue.Batch, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "a", Class: queue.Standard, PromptTokens: 50, MaxTokens: 50},
		{Tenant: "a", Class: queue.Standard, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "b", Class: queue.Standard, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "b", Class: queue.Standard, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "c", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "a", Class: queue.Standard, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "b", Class: queue.Batch, PromptTokens: 10, MaxTokens: 10},
		{Tenant: "c", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 10},
	}
	// serve enqueues a blocker and then reqs, then frees one slot at a time and returns the
	// indexes of reqs in the order they were released.
	serve := func(c queue.Capacity, fleet *workers) []int {
		q, clk, _ := newQueue(t, queue.Config{}, c)
		blocker := queue.Request{Tenant: "z", Class: queue.Interactive, PromptTokens: 1, MaxTokens: 1}
		if fleet != nil {
			blocker.Placer = &slot{w: fleet}
		}
		g := granted(t, enqueue(t, q, blocker))
		tickets := make([]*queue.Ticket, len(reqs))
		for i, r := range reqs {
			clk.Advance(1)
			r.Deadline = clk.Now().Add(time.Duration(len(reqs)-i) * time.Minute) // later ones due first
			if fleet != nil {
				r.Placer = &slot{w: fleet}
			}
			tickets[i] = enqueue(t, q, r)
		}
		var order []int
		for range reqs {
			if g.Placement != nil {
				g.Placement.Undo()
			}
			g.Done(queue.Usage{PromptTokens: 1, CompletionTokens: 1})
			g = nil
			for i, tk := range tickets {
				if tk != nil && ready(tk) {
					if g != nil {
						t.Fatalf("two requests released for one free slot")
					}
					g = granted(t, tk)
					order = append(order, i)
					tickets[i] = nil
				}
			}
			if g == nil {
				t.Fatalf("nothing released after %v", order)
			}
		}
		return order
	}
	want := serve(queue.Capacity{Requests: 1}, nil)
	got := serve(queue.Capacity{Requests: 100}, newWorkers(map[string]int{"w": 1}))
	if !slices.Equal(got, want) {
		t.Fatalf("order of service %v, want the queue's order %v", got, want)
	}
}

// A request its Placer can never place leaves the queue with the Placer's error, and the ones
// behind it are released.
func TestUnplaceableRequestEndsWithThePlacersError(t *testing.T) {
	q, _, reg := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4})
	fleet := newWorkers(map[string]int{"a": 1})
	gone := enqueue(t, q, queue.Request{Tenant: "t", Class: queue.Standard, Placer: &slot{w: fleet, target: "x"}})
	if err := ended(t, gone); !errors.Is(err, errGone) {
		t.Fatalf("Wait: %v, want the Placer's error", err)
	}
	if n := value(t, reg, "usher_queue_shed_total", map[string]string{"reason": "unplaceable", "class": "standard"}); n != 1 {
		t.Errorf("unplaceable shed %v, want 1", n)
	}
	next := enqueue(t, q, queue.Request{Tenant: "t", Class: queue.Standard, Placer: &slot{w: fleet}})
	granted(t, next)
}

// A tenant whose requests cannot be placed (here: all pinned to a full worker) holds back no other
// tenant's: a round tries at most maxRefusedPerFlow of them before it passes over the rest.
func TestTenantsUnplaceableRequestsDoNotHoldBackOthers(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 100})
	fleet := newWorkers(map[string]int{"a": 0, "b": 0})
	for range 40 {
		enqueue(t, q, queue.Request{Tenant: "t", Class: queue.Standard, Placer: &slot{w: fleet, target: "a"}})
	}
	other := enqueue(t, q, queue.Request{Tenant: "u", Class: queue.Standard, Placer: &slot{w: fleet, target: "b"}})
	fleet.free["b"] = 1
	fleet.tries = 0
	q.Retry()
	if !ready(other) || fleet.tries != 3 {
		t.Fatalf("after 40 unplaceable requests of another tenant: released %v after %d placements; want released after 3",
			ready(other), fleet.tries)
	}
}

// A release round passes over at most a bounded number of requests its Placer cannot place;
// Retry runs another round.
func TestReleaseRoundPassesOverABoundedNumber(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 100})
	fleet := newWorkers(map[string]int{"a": 0, "b": 0})
	for i := range 40 {
		enqueue(t, q, queue.Request{Tenant: fmt.Sprint("t", i), Class: queue.Standard, Placer: &slot{w: fleet, target: "a"}})
	}
	last := enqueue(t, q, queue.Request{Tenant: "u", Class: queue.Batch, Placer: &slot{w: fleet, target: "b"}})
	fleet.free["b"] = 1
	fleet.tries = 0
	q.Retry()
	if fleet.tries != 16 || ready(last) {
		t.Fatalf("one round made %d placements and released the last request: %v; want 16, not released",
			fleet.tries, ready(last))
	}
}

// fleet is a fake fleet safe for concurrent use: Place runs under the queue's lock, frees on the
// requests' goroutines.
type fleet struct {
	mu   sync.Mutex
	free [3]int
}

// seat is a request's Placer on fleet: on worker target, or any with room when target is -1.
type seat struct {
	f      *fleet
	target int
	on     int
}

func (s *seat) Place(int) (queue.Placement, error) {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	for i, n := range s.f.free {
		if (s.target < 0 || i == s.target) && n > 0 {
			s.f.free[i]--
			s.on = i
			return s, nil
		}
	}
	return nil, queue.ErrNoRoom
}

func (s *seat) Undo() {
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	s.f.free[s.on]++
}

// Under concurrent arrivals, cancellations, deadlines and frees, every request placed holds a
// slot of a worker (none is ever over-filled), every request ends once, and in the end every
// slot is free and nothing is queued.
func TestPlacementUnderConcurrency(t *testing.T) {
	q, clk, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 6})
	f := &fleet{free: [3]int{1, 2, 3}}
	const goroutines, perG = 12, 300
	var grants, cancels, expired, refused atomic.Int64
	stop := make(chan struct{})
	var background sync.WaitGroup
	background.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				clk.Advance(time.Millisecond)
				q.Retry()
			}
		}
	})
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 11))
			for range perG {
				s := &seat{f: f, target: rng.IntN(4) - 1}
				r := queue.Request{Tenant: fmt.Sprint("t", rng.IntN(5)), Class: queue.Class(rng.IntN(3)),
					PromptTokens: 10, MaxTokens: 10, Placer: s,
					Deadline: clk.Now().Add(time.Duration(1+rng.IntN(40)) * time.Millisecond)}
				tk, err := q.Enqueue(r)
				if err != nil {
					if !errors.Is(err, queue.ErrDeadlineUnreachable) {
						t.Errorf("Enqueue: got %v, want admitted or deadline_unreachable", err)
					}
					refused.Add(1)
					continue
				}
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(4) == 0 {
					go cancel()
				}
				gr, err := tk.Wait(ctx)
				cancel()
				switch {
				case err == nil:
					if gr.Placement != s {
						t.Errorf("granted with placement %v, want its own", gr.Placement)
					}
					f.mu.Lock()
					if f.free[s.on] < 0 {
						t.Errorf("worker %d over-filled: %d free", s.on, f.free[s.on])
					}
					f.mu.Unlock()
					grants.Add(1)
					s.Undo()
					gr.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 5})
					q.Retry()
				case errors.Is(err, context.Canceled):
					cancels.Add(1)
				case errors.Is(err, queue.ErrDeadlineExceeded):
					expired.Add(1)
				default:
					t.Errorf("Wait: %v", err)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	background.Wait()
	if total := grants.Load() + cancels.Load() + expired.Load() + refused.Load(); total != goroutines*perG {
		t.Fatalf("%d grants + %d cancels + %d expired + %d refused = %d, want %d",
			grants.Load(), cancels.Load(), expired.Load(), refused.Load(), total, goroutines*perG)
	}
	if s := q.Snapshot(); queued(s) != 0 || s.InFlight != (queue.Capacity{}) {
		t.Fatalf("after the run: %d queued, %+v in flight, want none", queued(s), s.InFlight)
	}
	if f.free != [3]int{1, 2, 3} {
		t.Fatalf("slots free after the run %v, want all [1 2 3]", f.free)
	}
	if grants.Load() == 0 {
		t.Fatal("nothing was granted")
	}
	t.Logf("%d grants, %d cancels, %d expired, %d refused", grants.Load(), cancels.Load(), expired.Load(), refused.Load())
}
