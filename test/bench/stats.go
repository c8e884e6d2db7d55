package bench

import (
	"math"
	"slices"
)

// Percentile returns the p-th percentile (0..100) of sorted values, interpolating linearly
// between the closest ranks; 0 for no values. sorted must be in ascending order.
func Percentile(sorted []float64, p float64) float64 {
	switch n := len(sorted); {
	case n == 0:
		return 0
	case n == 1 || p <= 0:
		return sorted[0]
	case p >= 100:
		return sorted[n-1]
	}
	rank := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(rank))
	frac := rank - float64(lo)
	if lo+1 >= len(sorted) {
		return sorted[lo]
	}
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// JainIndex is Jain's fairness index (Σx)²/(n·Σx²) of the allocations xs: 1 when all are
// equal, 1/n when one takes everything. It is 1 when every x is zero (nobody got more) and 0
// for no allocations.
func JainIndex(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var sum, sq float64
	for _, x := range xs {
		sum += x
		sq += x * x
	}
	if sq == 0 {
		return 1
	}
	return sum * sum / (float64(len(xs)) * sq)
}

// Summary describes a sample of latencies, in milliseconds.
type Summary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// summarize sorts xs in place and describes it.
func summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += x
	}
	return Summary{
		Count: len(xs),
		Mean:  sum / float64(len(xs)),
		P50:   Percentile(xs, 50),
		P90:   Percentile(xs, 90),
		P99:   Percentile(xs, 99),
		Max:   xs[len(xs)-1],
	}
}
