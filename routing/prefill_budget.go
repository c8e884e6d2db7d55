package routing

import "sync/atomic"

// The prefill budget protects interactive prompts from the lower classes' prefill: while
// interactive requests are present, a worker takes a standard or batch request only while the
// lower-class prompt tokens it is prefilling, this request's included, stay within
// ConcurrencyConfig.LowerPrefillTokens; a worker prefilling none of them takes any, so a prompt
// longer than the budget still goes somewhere. The pool sets the budget per pick
// (choice.prefillBudget, see Pool.protect) and the lease counts the request's prompt in its
// worker's lowerPrefill until its first token (see Lease.YieldsPrefill).
//
// A budget drawn from the interactive objective instead (a lower-class prompt admitted while the
// worker's cost model predicted the next interactive prompt within 1.5x its idle TTFT beside it),
// replacing the count or tightening it, was measured side by side with it on make bench-queue and
// moved neither the interactive p99 nor batch's share beyond the rounds' spread (figures in
// docs/benchmarks.md): the count stays.

// lowerPrefill counts the prompt tokens of the standard and batch requests a worker is
// prefilling (sent, first token not back yet; a prompt sent in pieces counts one piece), which
// the prefill budget bounds. Safe for concurrent use.
type lowerPrefill struct{ tokens atomic.Int64 }

// start counts a lower-class prefill of tokens sent now.
func (c *lowerPrefill) start(tokens int64) { c.tokens.Add(tokens) }

// done uncounts a lower-class prefill of tokens: its first token came back, or it ended.
func (c *lowerPrefill) done(tokens int64) { c.tokens.Add(-tokens) }

// withinPrefillBudget is the prefill budget's filter: whether w may start prefilling c's prompt
// (one piece of it, when it goes in pieces) within c's budget. Without a budget it admits every
// worker. Cost: an atomic load.
func (c *choice) withinPrefillBudget(w *Worker) bool {
	if c.prefillBudget <= 0 {
		return true
	}
	lower := w.prefill.tokens.Load()
	return lower <= 0 || lower+c.prefillTokens() <= c.prefillBudget
}
