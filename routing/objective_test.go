package routing

import (
	"testing"
	"time"
)

// The default interactive objective is twice the idle TTFT plus one idle step, at least 50 ms;
// a bound holds it.
func TestInteractiveObjective(t *testing.T) {
	for _, tt := range []struct {
		idle Prediction
		want time.Duration
	}{
		{Prediction{TTFT: 400 * time.Millisecond, TPOT: 20 * time.Millisecond}, 820 * time.Millisecond},
		{Prediction{TTFT: 400 * time.Millisecond}, 800 * time.Millisecond},
		{Prediction{TTFT: time.Millisecond, TPOT: time.Millisecond}, MinTTFTObjective},
		{Prediction{TTFT: -time.Second, TPOT: -time.Second}, MinTTFTObjective},
		{Prediction{TTFT: time.Duration(1 << 62), TPOT: time.Duration(1 << 62)}, time.Hour},
	} {
		if got := InteractiveObjective(tt.idle); got != tt.want {
			t.Errorf("InteractiveObjective(%+v): got %v, want %v", tt.idle, got, tt.want)
		}
	}
	if got := TTFTObjective(Prediction{TTFT: 100 * time.Millisecond, TPOT: 10 * time.Millisecond}, StandardObjectiveFactor, time.Second); got != 310*time.Millisecond {
		t.Errorf("standard: got %v, want 310ms", got)
	}
}
