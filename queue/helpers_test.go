package queue_test

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/usherllm/usher/queue"
)

// newQueue builds a queue on a fake clock and a fresh registry, closed when the test ends.
func newQueue(t testing.TB, cfg queue.Config, c queue.Capacity) (*queue.Queue, *fakeClock, *prometheus.Registry) {
	t.Helper()
	clk := newFakeClock()
	reg := prometheus.NewRegistry()
	q, err := queue.New(cfg, queue.Options{Model: "m", Clock: clk, Registerer: reg})
	if err != nil {
		t.Fatalf("queue.New: %v", err)
	}
	t.Cleanup(q.Close)
	q.SetCapacity(c)
	return q, clk, reg
}

func enqueue(t testing.TB, q *queue.Queue, r queue.Request) *queue.Ticket {
	t.Helper()
	tk, err := q.Enqueue(r)
	if err != nil {
		t.Fatalf("Enqueue(%+v): %v", r, err)
	}
	return tk
}

func ready(tk *queue.Ticket) bool {
	select {
	case <-tk.Ready():
		return true
	default:
		return false
	}
}

// granted returns the ticket's grant, failing the test if it was not dispatched.
func granted(t testing.TB, tk *queue.Ticket) *queue.Grant {
	t.Helper()
	if !ready(tk) {
		t.Fatalf("ticket not dispatched, want dispatched")
	}
	g, err := tk.Wait(context.Background())
	if err != nil {
		t.Fatalf("Wait: got error %v, want a grant", err)
	}
	return g
}

// ended returns the error the ticket ended with, failing the test if it is still queued.
func ended(t testing.TB, tk *queue.Ticket) error {
	t.Helper()
	if !ready(tk) {
		t.Fatalf("ticket still queued, want ended")
	}
	_, err := tk.Wait(context.Background())
	return err
}

func rejection(t testing.TB, err error, want queue.Reason) *queue.Rejection {
	t.Helper()
	var rej *queue.Rejection
	if !errors.As(err, &rej) || rej.Reason != want {
		t.Fatalf("got error %v, want a Rejection %v", err, want)
	}
	return rej
}

func lowerInFlight(s queue.Snapshot) (reqs int, toks int64) {
	for _, c := range s.Classes {
		if c.Class != queue.Interactive {
			reqs += c.InFlight
			toks += c.InFlightTokens
		}
	}
	return reqs, toks
}

func queued(s queue.Snapshot) int {
	n := 0
	for _, c := range s.Classes {
		n += c.Queued
	}
	return n
}
