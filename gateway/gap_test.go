package gateway

import (
	"testing"
	"time"
)

// An attempt's longest gap (routing.Outcome.LongestGap, what the cost model takes for an engine
// step) is the longest time between two hearings of the worker after its first event: the wait
// for the first event is the prompt's own time to first token, not a step, and is not counted.
func TestAttemptLongestGapCountsOnlyAfterTheFirstEvent(t *testing.T) {
	var a attempt
	a.quiet.arm(time.Hour, func(error) {})
	defer a.quiet.stop()
	a.heard()
	time.Sleep(time.Second) // the prompt's prefill
	a.heard()               // its first event
	a.decoding = true       // as firstToken sets it
	a.heard()
	time.Sleep(20 * time.Millisecond) // a step
	a.heard()
	a.heard()
	if a.longestGap < 20*time.Millisecond || a.longestGap >= time.Second {
		t.Errorf("longest gap %v: want the 20 ms pause after the first event, not the 1 s before it", a.longestGap)
	}
}
