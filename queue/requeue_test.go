package queue_test

import (
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
)

// A preempted batch request gives its slot to the interactive one waiting, goes back ahead of
// its tenant's later requests, and runs again when capacity frees.
func TestRequeueGivesTheSlotToTheWaitingHigherClass(t *testing.T) {
	q, _, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	batch := func() queue.Request {
		return queue.Request{Tenant: "b", Class: queue.Batch, PromptTokens: 10, MaxTokens: 10}
	}
	first := enqueue(t, q, batch())
	g := granted(t, first)
	later := enqueue(t, q, batch())
	inter := enqueue(t, q, queue.Request{Tenant: "i", Class: queue.Interactive, PromptTokens: 10, MaxTokens: 10})
	if ready(inter) {
		t.Fatal("the interactive request was dispatched with the only slot taken")
	}
	again := g.Requeue()
	if again != first {
		t.Fatal("Requeue returned another ticket")
	}
	gi := granted(t, inter)
	if ready(first) || ready(later) {
		t.Fatal("a batch request was dispatched while the interactive one holds the slot")
	}
	g.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 10}) // spent: changes nothing
	if ready(first) {
		t.Fatal("Done on a requeued grant freed capacity")
	}
	gi.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 10})
	if !ready(first) || ready(later) {
		t.Fatalf("after the interactive request: requeued ready %v, later ready %v; want the requeued one first", ready(first), ready(later))
	}
	g2 := granted(t, first)
	g2.Done(queue.Usage{PromptTokens: 10, CompletionTokens: 10})
	if !ready(later) {
		t.Fatal("the later batch request never ran")
	}
	snap := q.Snapshot()
	var inflight int
	for _, c := range snap.Classes {
		inflight += c.InFlight
	}
	if inflight != 1 {
		t.Errorf("in flight %d, want 1 (the later request)", inflight)
	}
}

// A requeued request's second grant tells the wait since it was requeued: not its first wait
// again, nor the time it was served (the gateway adds the grants' waits up, and a preempted batch
// request's log said it had queued longer than it had existed).
func TestRequeuedWaitBeginsAgain(t *testing.T) {
	q, clock, _ := newQueue(t, queue.Config{}, queue.Capacity{Requests: 1})
	req := func(c queue.Class) queue.Request {
		return queue.Request{Tenant: c.String(), Class: c, PromptTokens: 10, MaxTokens: 10}
	}
	done := queue.Usage{PromptTokens: 10, CompletionTokens: 10}
	hold := granted(t, enqueue(t, q, req(queue.Standard)))
	batch := enqueue(t, q, req(queue.Batch))
	clock.Advance(time.Second)
	hold.Done(done)
	g := granted(t, batch)
	if g.Waited != time.Second {
		t.Fatalf("first grant waited %v, want 1s", g.Waited)
	}
	clock.Advance(5 * time.Second) // served, then preempted for an interactive request
	inter := enqueue(t, q, req(queue.Interactive))
	again := g.Requeue()
	gi := granted(t, inter)
	clock.Advance(2 * time.Second)
	if got := oldestWait(q, queue.Batch); got != 2*time.Second {
		t.Errorf("oldest batch wait %v, want 2s: since it was requeued", got)
	}
	gi.Done(done)
	if g2 := granted(t, again); g2.Waited != 2*time.Second {
		t.Errorf("second grant waited %v, want 2s: since it was requeued", g2.Waited)
	}
}

func oldestWait(q *queue.Queue, c queue.Class) time.Duration {
	for _, cs := range q.Snapshot().Classes {
		if cs.Class == c {
			return cs.OldestWait
		}
	}
	return 0
}
