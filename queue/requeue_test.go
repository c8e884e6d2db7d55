package queue_test

import (
	"testing"

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
