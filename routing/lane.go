package routing

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// The clear lane, on when ConcurrencyConfig.ClearWithin is set. An engine runs in steps, and a
// step does not stop: an interactive prompt that reaches a worker in the middle of a long
// standard or batch prefill waits for the rest of that step before its own begins. Holding every
// worker's lower-class prefill to a budget (ConcurrencyConfig.LowerPrefillTokens) shortens such
// steps but cannot remove them: with prompts of hundreds of tokens every worker is in one most of
// the time. So, while interactive requests are present and a model has two workers or more, the
// lane keeps one of them clear: at any time at least one worker with room for a request has no
// lower-class prefill in progress, or one it expects to end within ClearWithin. A standard or
// batch request is sent to a worker only if another stays clear; an interactive request goes to
// a clear worker when one can take it. The workers take the lane in turn, as their prefills end.
//
// The price is batch throughput: the clear worker's free slot is held, and its next lower-class
// prefill waits for another's to near its end. With prefill-heavy batch (about 520-token
// prompts) on two simulated slot engines, ClearWithin 30ms held the interactive p99 at
// 1.34-1.37x its no-batch p99 (1.61-1.79x without), and batch got 77% of the capacity
// interactive left (94-98% without); on KV-bound engines the p99 moved less than run-to-run noise.
// So it is off by default.
//
// How long a prefill takes is learned per worker from the time to first token of its standard
// and batch answers against their prompt tokens (a least-squares line over recent answers);
// until a worker has answered a few, a prefill in progress there counts as never ending before
// its first token comes back. Each replica sees only the prefills it sent.

// prefillClock estimates when the lower-class prefill in progress on one worker ends. Safe for
// concurrent use; every method takes its mutex once.
type prefillClock struct {
	// tokens sums the prompt tokens of the worker's lower-class requests in prefill (sent, first
	// token not back). Written under mu, read without it.
	tokens atomic.Int64

	mu sync.Mutex
	// end is when the prefill the worker is doing or was sent for the lower classes is expected
	// to end (unix ns); 0 when there is none, math.MaxInt64 when its cost is not known yet.
	end int64
	// Moving averages of prompt tokens (x) and time to first token in seconds (y) over the
	// worker's answered standard and batch requests, for the least-squares line y = a + b x.
	x, y, xx, xy float64
	samples      int
}

// Weight of one answer in the prefill line's averages, and the answers needed before it counts.
const (
	prefillWeight     = 0.1
	minPrefillSamples = 3
)

// observe adds one answered lower-class request: its prompt tokens as estimated when it was sent
// and its time to first token.
func (c *prefillClock) observe(tokens int64, ttft time.Duration) {
	if tokens <= 0 || ttft <= 0 {
		return
	}
	x, y := float64(tokens), ttft.Seconds()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.samples == 0 {
		c.x, c.y, c.xx, c.xy = x, y, x*x, x*y
	} else {
		c.x += prefillWeight * (x - c.x)
		c.y += prefillWeight * (y - c.y)
		c.xx += prefillWeight * (x*x - c.xx)
		c.xy += prefillWeight * (x*y - c.xy)
	}
	c.samples++
}

// costLocked is the expected duration of a prefill of tokens, or false before enough answers.
// c.mu must be held.
func (c *prefillClock) costLocked(tokens int64) (time.Duration, bool) {
	if c.samples < minPrefillSamples {
		return 0, false
	}
	// Through the origin when the prompts were all of about one size: the slope is then unknown.
	slope, base := c.y/c.x, 0.0
	if v := c.xx - c.x*c.x; v > 1e-9*c.xx {
		slope = (c.xy - c.x*c.y) / v
		base = c.y - slope*c.x
	}
	slope, base = max(slope, 0), max(base, 0)
	s := base + slope*float64(tokens)
	if s <= 0 || s > 3600 || math.IsNaN(s) {
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}

// start records a lower-class prefill of tokens sent now: it ends after the one in progress, if
// any, has ended, by the learned cost of its own.
func (c *prefillClock) start(now time.Time, tokens int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tokens.Add(tokens)
	cost, ok := c.costLocked(tokens)
	if !ok || c.end == math.MaxInt64 {
		c.end = math.MaxInt64
		return
	}
	c.end = max(c.end, now.UnixNano()) + int64(cost)
}

// done records the end of a lower-class prefill of tokens (its first token came back, or the
// request ended); when it was the last in progress, the worker's lower prefill is over.
func (c *prefillClock) done(tokens int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokens.Add(-tokens) == 0 {
		c.end = 0
	}
}

// remaining is how long the lower-class prefill in progress is expected to last from now: 0 when
// there is none or it should have ended, math.MaxInt64 when its cost is not known.
func (c *prefillClock) remaining(now time.Time) time.Duration {
	c.mu.Lock()
	end := c.end
	c.mu.Unlock()
	if end == math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(max(end-now.UnixNano(), 0))
}

// clear reports whether w could start an interactive request's prefill within within: it takes
// requests, has a free request slot and tokens left, and has no standard or batch prefill in
// progress that is expected to last longer.
func (w *Worker) clear(now time.Time, within time.Duration) bool {
	if !w.takesRequests() {
		return false
	}
	if w.inFlight.Load() >= w.limit.Load() || w.inFlightTokens.Load() >= w.tokenLimit.Load() {
		return false
	}
	return w.prefill.tokens.Load() == 0 || w.prefill.remaining(now) <= within
}

// lane is what Pick found of a model's workers for the clear lane, in force only while
// interactive requests are present and two workers or more take requests.
type lane struct {
	active bool
	now    time.Time     // when it was taken
	within time.Duration // ConcurrencyConfig.ClearWithin
	clear  int           // workers clear now
	only   *Worker       // the one clear worker when clear == 1
	// opens is when the next worker becomes clear as its prefill's expected end nears (zero:
	// none is expected to): when a request held back by the lane should look again.
	opens time.Time
}

// laneOf takes the state of the lane among workers at now.
func laneOf(workers []*Worker, now time.Time, within time.Duration) lane {
	l := lane{now: now, within: within}
	taking := 0
	for _, w := range workers {
		if !w.takesRequests() {
			continue
		}
		taking++
		if w.clear(now, within) {
			l.clear++
			l.only = w
			continue
		}
		if rem := w.prefill.remaining(now); rem != math.MaxInt64 && rem > within {
			if at := now.Add(rem - within); l.opens.IsZero() || at.Before(l.opens) {
				l.opens = at
			}
		}
	}
	l.active = taking >= 2
	if l.clear != 1 {
		l.only = nil
	}
	return l
}

// admitsLower reports whether a standard or batch request may start its prefill on w: another
// worker stays clear.
func (l *lane) admitsLower(w *Worker) bool {
	return !l.active || l.clear >= 2 || l.clear == 1 && l.only != w
}

// wakeAt tells OnRoom's function of room for every model at t, so that requests the lane held
// back are placed again when a worker's prefill is expected to be nearly over (it is told anyway
// when one ends). One timer is armed at a time, for the earliest such moment asked.
func (p *Pool) wakeAt(t time.Time) {
	p.laneMu.Lock()
	defer p.laneMu.Unlock()
	if p.laneTimer != nil && !p.laneWake.After(t) && p.laneWake.After(p.now()) {
		return
	}
	if p.laneTimer != nil {
		p.laneTimer.Stop()
	}
	p.laneWake = t
	p.laneTimer = time.AfterFunc(max(t.Sub(p.now()), 0), p.roomEverywhere)
}
