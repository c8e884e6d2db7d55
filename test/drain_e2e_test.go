package test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/test/sim"
)

type workerStatus struct {
	ID       string `json:"id"`
	State    string `json:"state"`
	InFlight int64  `json:"in_flight"`
}

func TestDrainLetsInFlightFinishAndReportsEmpty(t *testing.T) {
	// About 12 ms a token: a 60-token stream runs for most of a second.
	s := startStack(t, stackOptions{workers: 2, sim: func(_ int, c *sim.Config) { c.TimeScale = 1 }})
	type result struct {
		worker string
		done   bool
	}
	results := make(chan result, 4)
	var started sync.WaitGroup
	for i := 0; i < 4; i++ {
		started.Add(1)
		go func() {
			resp := s.do(context.Background(), t, "/v1/chat/completions", chat("a long story", 60, true))
			events := newSSEReader(resp.Body)
			_, _ = events.next()
			started.Done()
			last := ""
			for e, ok := events.next(); ok; e, ok = events.next() {
				last = e
			}
			results <- result{resp.Header.Get("X-Usher-Worker"), last == "[DONE]"}
		}()
	}
	started.Wait()
	var st workerStatus
	if code := s.admin(t, http.MethodPost, "/workers/sim-0/drain", &st); code != http.StatusOK {
		t.Fatalf("drain: status %d", code)
	}
	if st.State != "draining" || st.InFlight == 0 {
		t.Fatalf("right after drain: got %+v, want draining with requests in flight", st)
	}
	for i := 0; i < 4; i++ {
		resp := s.do(context.Background(), t, "/v1/chat/completions", chat("new work", 2, false))
		if w := resp.Header.Get("X-Usher-Worker"); resp.StatusCode != http.StatusOK || w != "sim-1" {
			t.Fatalf("new request %d during the drain: %d from %q, want 200 from sim-1", i, resp.StatusCode, w)
		}
	}
	for i := 0; i < 4; i++ {
		if r := <-results; !r.done {
			t.Fatalf("a stream on %s was cut by the drain", r.worker)
		}
	}
	eventually(t, 2*time.Second, "sim-0 reports drained", func() bool {
		s.admin(t, http.MethodGet, "/workers/sim-0", &st)
		return st.State == "drained" && st.InFlight == 0
	})
}
