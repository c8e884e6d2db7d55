package queue_test

import (
	"errors"
	"fmt"
	"slices"
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
	w      *workers
	target string
	on     string // where it was placed
}

var errGone = errors.New("worker gone")

func (s *slot) Place() (queue.Placement, error) {
	s.w.tries++
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
	if g0.Placement != s0 || s0.on != "a" {
		t.Fatalf("first request placed %v on %q, want its own slot on a", g0.Placement, s0.on)
	}
	r1, _ := req("t", "a") // a is full
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
	if ready(third) {
		t.Fatal("a request was released with no worker free")
	}
	// a frees: the pinned request, ahead of the third in the queue's order, has it.
	s0.Undo()
	g0.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 10})
	if !ready(pinned) || ready(third) {
		t.Fatalf("after a freed: pinned ready %v, third ready %v; want the pinned one", ready(pinned), ready(third))
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

// A release round passes over at most a bounded number of requests its Placer cannot place;
// Retry runs another round.
func TestReleaseRoundPassesOverABoundedNumber(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 100})
	fleet := newWorkers(map[string]int{"a": 0, "b": 0})
	for range 40 {
		enqueue(t, q, queue.Request{Tenant: "t", Class: queue.Standard, Placer: &slot{w: fleet, target: "a"}})
	}
	last := enqueue(t, q, queue.Request{Tenant: "u", Class: queue.Batch, Placer: &slot{w: fleet, target: "b"}})
	fleet.free["b"] = 1
	fleet.tries = 0
	q.Retry()
	if fleet.tries > 16 || ready(last) {
		t.Fatalf("one round made %d placements and released the last request: %v; want at most 16, not released",
			fleet.tries, ready(last))
	}
}
