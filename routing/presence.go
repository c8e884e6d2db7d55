package routing

import "time"

// Interactive presence: the protections of interactive requests (the prefill budget and pieces,
// see protect) hold while interactive requests are present, and the lower classes have a worker
// to themselves otherwise. A fleet without interactive traffic is never bound; one with it must
// not drop its guard between two interactive requests, or the next one meets every worker
// prefilling whole lower-class prompts, which no placement avoids (on three llama-servers beside
// a prefill-heavy flood, the request after a 17 s pause took 0.4-1.0 s against an objective of
// 0.3-0.4 s, and missed in 10 runs of 10; docs/benchmarks.md).
//
// So presence lasts, after the last interactive request, presenceGaps times the mean gap between
// interactive requests lately, at least ConcurrencyConfig.InteractivePresence and at most
// maxPresence. Arrivals at random (Poisson) leave a gap of 8 mean gaps once in about 3,000; the
// bound is what a fleet whose interactive traffic stopped pays in lower-class throughput (the
// budget and pieces cost it about a quarter) before its lower classes run unbound again.
const (
	presenceGaps = 8
	maxPresence  = 2 * time.Minute
	// presenceWeight is the weight of each new gap in the mean: the last few dozen count.
	presenceWeight = 1.0 / 16
)

// noteInteractive records that an interactive request was routed at now (unix ns): the gap
// since the one before goes into the mean (a gap counts at most maxPresence, so one long silence
// does not make the next one's guard last long). Lock-free; safe for concurrent use.
func (p *Pool) noteInteractive(now int64) {
	last := p.lastInteractive.Swap(now)
	if last == 0 {
		return
	}
	gap := float64(min(max(now-last, 0), int64(maxPresence)))
	for {
		old := p.interactiveGap.Load()
		mean := gap
		if old > 0 {
			mean = float64(old) + presenceWeight*(gap-float64(old))
		}
		if p.interactiveGap.CompareAndSwap(old, max(int64(mean), 1)) {
			return
		}
	}
}

// interactivePresent reports whether interactive requests are present: one was routed within
// the presence (see presence).
func (p *Pool) interactivePresent() bool {
	last := p.lastInteractive.Load()
	return last != 0 && p.now().UnixNano()-last < int64(p.presence())
}

// presence is how long after the last interactive request they are still present:
// presenceGaps times their mean gap, within [ConcurrencyConfig.InteractivePresence,
// maxPresence] (the configured floor wins when it is the larger).
func (p *Pool) presence() time.Duration {
	floor := p.cfg.Concurrency.InteractivePresence
	learnt := min(time.Duration(presenceGaps*p.interactiveGap.Load()), maxPresence)
	return max(floor, learnt)
}
