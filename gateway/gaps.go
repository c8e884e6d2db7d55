package gateway

import (
	"math/bits"
	"time"
)

// streamGaps measures the gaps of an answer's stream: the time between two hearings of the
// worker after its first event, while it decodes. An engine sends each sequence's token as a
// step ends, so a gap is a step: most of them decode steps, a few (fewer as the answer is
// longer) steps that prefilled another prompt beside it. Its longest gap
// (routing.Outcome.LongestGap) is the longest step it waited through, its median gap
// (routing.Outcome.MedianGap) a decode step of its batch, which a TPOT, an average that counts
// the long steps, is not. A gap shorter than minGap is one step's bytes read in two, not a
// step, and is not counted. Fixed memory; the zero value is ready.
type streamGaps struct {
	last     time.Time     // the last hearing's time
	longest  time.Duration // the longest gap so far
	decoding bool          // the first event came
	gaps     gapHistogram
}

// minGap is the shortest gap counted: far below any engine step (a step computes the model
// once), far above the time between two reads of one step's bytes.
const minGap = 100 * time.Microsecond

// heard records a hearing at at (on the gateway's clock, which the answer's TTFT and TPOT are
// measured on: a gap read backwards, the clock set back, is not counted).
func (g *streamGaps) heard(at time.Time) {
	if g.decoding && !g.last.IsZero() {
		gap := at.Sub(g.last)
		g.longest = max(g.longest, gap)
		if gap >= minGap {
			g.gaps.add(gap)
		}
	}
	g.last = at
}

// median is the stream's median gap, within an eighth; 0 when fewer than minMedianGaps were
// counted (too few to tell a decode step from a prefill step).
func (g *streamGaps) median() time.Duration {
	if g.gaps.count() < minMedianGaps {
		return 0
	}
	return g.gaps.quantile(0.5)
}

// minMedianGaps is the fewest gaps a stream's median is taken from.
const minMedianGaps = 3

// gapHistogram counts durations in buckets of microseconds, four to an octave (each bucket's
// upper bound at most 5/4 of its lower, so a quantile read at a bucket's middle is within an
// eighth of the true one), from 1 µs to about 8 s (longer ones count in the last bucket). Under
// 200 bytes; adding is a few integer operations, and nothing allocates.
type gapHistogram struct {
	counts [gapBuckets]uint16 // saturating
}

// gapOctaves bounds the histogram at 2^gapOctaves µs (about 8.4 s).
const (
	gapOctaves = 23
	gapBuckets = 4 * gapOctaves
)

// gapBucket is the bucket of d: 4 per octave of its microseconds, by the two bits below the
// highest (durations under 4 µs, far below minGap, all in the first bucket of the third octave).
func gapBucket(d time.Duration) int {
	us := uint64(max(d.Microseconds(), 4))
	octave := bits.Len64(us) - 1
	return min(4*octave+(int(us>>(octave-2))&3), gapBuckets-1)
}

// add counts d.
func (h *gapHistogram) add(d time.Duration) {
	b := gapBucket(d)
	if h.counts[b] < ^uint16(0) {
		h.counts[b]++
	}
}

// count is how many durations were counted (as saturated).
func (h *gapHistogram) count() uint64 {
	var n uint64
	for _, c := range h.counts {
		n += uint64(c)
	}
	return n
}

// quantile is the q-quantile (q in (0, 1]) of the durations added, as the middle of its bucket;
// 0 when none was.
func (h *gapHistogram) quantile(q float64) time.Duration {
	want := uint64(max(q*float64(h.count()), 1))
	var seen uint64
	for b, c := range h.counts {
		if seen += uint64(c); seen >= want {
			octave, quarter := b/4, b%4
			// The bucket spans [(4+quarter), (5+quarter)) x 2^octave / 4 µs.
			us := (4.5 + float64(quarter)) * float64(uint64(1)<<octave) / 4
			return time.Duration(us * float64(time.Microsecond))
		}
	}
	return 0
}
