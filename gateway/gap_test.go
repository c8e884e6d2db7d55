package gateway

import (
	"testing"
	"time"
)

// An attempt's longest gap (routing.Outcome.LongestGap, what the cost model takes for an engine
// step) is the longest time between two hearings of the worker after its first event: the wait
// for the first event is the prompt's own time to first token, not a step, and is not counted.
func TestAttemptLongestGapCountsOnlyAfterTheFirstEvent(t *testing.T) {
	var g streamGaps
	g.heard(0)
	g.heard(time.Second) // its first event, after the prompt's prefill
	g.decoding = true    // as attempt.firstToken sets it
	g.heard(time.Second)
	g.heard(time.Second + 20*time.Millisecond) // a step
	g.heard(time.Second + 20*time.Millisecond)
	if g.longest < 20*time.Millisecond || g.longest >= time.Second {
		t.Errorf("longest gap %v: want the 20 ms pause after the first event, not the 1 s before it", g.longest)
	}
}
