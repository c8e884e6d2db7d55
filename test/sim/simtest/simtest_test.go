package simtest

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/test/sim"
)

// TestStartCleansUpAHungRequest leaves a request hanging when its subtest ends: the cleanup
// must still stop the engine and the server instead of waiting for the request forever.
func TestStartCleansUpAHungRequest(t *testing.T) {
	var e *sim.Engine
	answered := make(chan int, 1)
	t.Run("worker", func(t *testing.T) {
		eng, srv := Start(t, sim.Config{Faults: sim.Faults{HangRate: 1}})
		e = eng
		go func() {
			resp, err := srv.Client().Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"a"}`))
			if err != nil {
				answered <- 0
				return
			}
			resp.Body.Close()
			answered <- resp.StatusCode
		}()
		deadline := time.Now().Add(5 * time.Second)
		for e.Stats().Hung == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the request never reached the engine")
			}
			time.Sleep(time.Millisecond)
		}
	})
	select {
	case got := <-answered:
		if got != http.StatusServiceUnavailable {
			t.Errorf("hung request at cleanup: got status %d, want 503", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("hung request still open after cleanup")
	}
	if got := e.Stats().Hung; got != 1 {
		t.Errorf("Hung: got %d, want 1", got)
	}
}
