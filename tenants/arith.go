package tenants

import "math"

// Numbers from clients (token counts, max_tokens) and from the config can be anything an int64
// holds; the limiter's arithmetic on them saturates instead of wrapping, so a huge value is
// refused as huge and never turns negative.

// addSat returns a+b for non-negative a and b, or math.MaxInt64 when the sum does not fit.
func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// toInt64 converts a non-negative float to int64, saturating at math.MaxInt64 (float64 holds
// values an int64 cannot, and the conversion of those is undefined); NaN and negatives give 0.
func toInt64(f float64) int64 {
	switch {
	case !(f > 0):
		return 0
	case f >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(f)
}
