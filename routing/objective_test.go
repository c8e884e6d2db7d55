package routing

import (
	"testing"
	"time"
)

func TestInteractiveObjective(t *testing.T) {
	for _, tt := range []struct{ idle, want time.Duration }{
		{400 * time.Millisecond, 600 * time.Millisecond},
		{time.Millisecond, MinTTFTObjective},
		{-time.Second, MinTTFTObjective},
	} {
		if got := InteractiveObjective(tt.idle); got != tt.want {
			t.Errorf("InteractiveObjective(%v): got %v, want %v", tt.idle, got, tt.want)
		}
	}
}
