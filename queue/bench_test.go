package queue

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// backlog builds a queue on the real clock holding queued requests of one class over tenants
// tenants, with a pool of one request slot already taken; it returns the running grant.
func backlog(tb testing.TB, queued, tenants int) (*Queue, *Grant) {
	tb.Helper()
	q, err := New(Config{MaxQueuedPerClass: 2 * queued, MaxQueuedPerTenant: 2 * queued}, Options{})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	tb.Cleanup(q.Close)
	q.SetCapacity(Capacity{Requests: 1})
	base := time.Now().Add(1000 * time.Hour)
	var first *Ticket
	for i := range queued + 1 {
		t, err := q.Enqueue(benchRequest(i, tenants, base))
		if err != nil {
			tb.Fatalf("Enqueue %d: %v", i, err)
		}
		if i == 0 {
			first = t
		}
	}
	if first.state != stateDispatched {
		tb.Fatalf("first request not dispatched")
	}
	return q, &first.grant
}

func benchRequest(i, tenants int, base time.Time) Request {
	return Request{Tenant: fmt.Sprint("tenant-", i%tenants), Class: Standard, Weight: float64(1 + i%3),
		PromptTokens: 100 + i%500, MaxTokens: 50 + i%300, Deadline: base.Add(time.Duration(i*7919%100000) * time.Millisecond)}
}

// nextToDispatch is the ticket the next dispatch will release, when the completing request's
// usage equals its estimate (so no counter moves) and only Standard is queued.
func nextToDispatch(q *Queue) *Ticket {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.classes[Standard].flows.peek().items[0].t
}

// exact is the usage equal to t's estimate: cost = prompt + max, charge x weight = prompt + 2 max.
func exact(t *Ticket) Usage {
	maxTokens := int(math.Round(t.charge*t.weight)) - int(t.cost)
	return Usage{PromptTokens: int(t.cost) - maxTokens, CompletionTokens: maxTokens}
}

// BenchmarkEnqueueDispatch measures one Enqueue plus one completion that dispatches the next
// request, at a steady backlog. Allocations come from Enqueue (the Ticket and its channel).
func BenchmarkEnqueueDispatch(b *testing.B) {
	for _, size := range []struct{ queued, tenants int }{{1000, 10}, {100000, 1000}} {
		b.Run(fmt.Sprintf("queued=%d/tenants=%d", size.queued, size.tenants), func(b *testing.B) {
			q, cur := backlog(b, size.queued, size.tenants)
			base := time.Now().Add(1000 * time.Hour)
			reqs := make([]Request, 4096)
			for i := range reqs {
				reqs[i] = benchRequest(i*31, size.tenants, base)
			}
			b.ReportAllocs()
			i := 0
			start := cpuTime(b)
			for b.Loop() {
				if _, err := q.Enqueue(reqs[i%len(reqs)]); err != nil {
					b.Fatalf("Enqueue: %v", err)
				}
				next := nextToDispatch(q)
				cur.Done(exact(cur.t))
				cur = &next.grant
				i++
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkDispatch measures one completion that dispatches the next request from a backlog of
// 50,000 to 100,000 requests over 1,000 tenants, without the Enqueue (refills are not timed).
func BenchmarkDispatch(b *testing.B) {
	q, cur := backlog(b, 100000, 1000)
	b.ReportAllocs()
	base := time.Now().Add(1000 * time.Hour)
	i, refill := 0, time.Duration(0)
	start := cpuTime(b)
	for b.Loop() {
		if q.classes[Standard].queued < 50000 {
			b.StopTimer()
			before := cpuTime(b)
			for range 50000 {
				if _, err := q.Enqueue(benchRequest(i, 1000, base)); err != nil {
					b.Fatalf("Enqueue: %v", err)
				}
				i++
			}
			refill += cpuTime(b) - before
			b.StartTimer()
		}
		next := nextToDispatch(q)
		cur.Done(exact(cur.t))
		cur = &next.grant
	}
	reportCPU(b, start+refill)
}

// reportCPU reports the process CPU time per operation since start: on a shared machine it
// varies far less than wall time, which counts the time other processes held the cores.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// TestDispatchDoesNotAllocate checks that completing a request and dispatching the next from a
// large backlog allocates nothing.
func TestDispatchDoesNotAllocate(t *testing.T) {
	q, cur := backlog(t, 100000, 1000)
	allocs := testing.AllocsPerRun(1000, func() {
		next := nextToDispatch(q)
		cur.Done(exact(cur.t))
		if next.state != stateDispatched {
			t.Fatalf("peeked ticket not dispatched")
		}
		cur = &next.grant
	})
	if allocs != 0 {
		t.Fatalf("dispatch allocated %v times per run, want 0", allocs)
	}
}
