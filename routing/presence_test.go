package routing

import (
	"testing"
	"time"
)

// Interactive requests are present for 8 times their mean gap after the last one, at least
// InteractivePresence and at most maxPresence: with one every 3 s, a batch prompt is still held
// to the prefill budget 20 s after the last (where the 10 s floor alone would have let it go),
// and no longer 25 s after it; with one a minute, the guard lasts 2 minutes.
func TestPresenceFollowsTheInteractiveRhythm(t *testing.T) {
	for _, tt := range []struct {
		name       string
		every      time.Duration
		held, free time.Duration // after the last interactive request
		presence   time.Duration
	}{
		{"every 3s", 3 * time.Second, 20 * time.Second, 25 * time.Second, 24 * time.Second},
		{"every minute", time.Minute, 110 * time.Second, maxPresence, maxPresence},
		{"every 100ms: the floor", 100 * time.Millisecond, 9 * time.Second, DefaultInteractivePresence, DefaultInteractivePresence},
	} {
		t.Run(tt.name, func(t *testing.T) {
			now := time.Unix(1_000_000, 0)
			p, k := wholePromptPool(t, &now)
			for i := range 40 {
				if i > 0 {
					now = now.Add(tt.every)
				}
				k.pick("an interactive request", Request{Interactive: true, PromptTokens: 100}).Release(Outcome{})
			}
			if got := p.presence(); got != tt.presence {
				t.Errorf("presence %v, want %v", got, tt.presence)
			}
			last := now
			now = last.Add(tt.held)
			b := k.pick("the first batch prompt in prefill", Request{PromptTokens: 5000, Tokens: 5010})
			k.refused("a second batch prompt past the budget, interactive requests still present", Request{PromptTokens: 5000, Tokens: 5010})
			now = last.Add(tt.free)
			k.pick("a second batch prompt once interactive requests are gone", Request{PromptTokens: 5000, Tokens: 5010}).Release(Outcome{})
			b.Release(Outcome{})
		})
	}
}
