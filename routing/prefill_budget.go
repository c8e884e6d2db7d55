package routing

import "sync/atomic"

// The prefill budget protects interactive prompts from the lower classes' prefill: while
// interactive requests are present, a worker takes a standard or batch request only while the
// lower-class prompt tokens it is prefilling, this request's included, stay within
// ConcurrencyConfig.LowerPrefillTokens, and no more than one piece while pieces are on
// (prefill_pieces.go); a worker prefilling none of them takes any, so a prompt longer than the
// budget still goes somewhere. The pool sets the budget per pick
// (choice.prefillBudget, see Pool.protect) and the lease counts the request's prompt in its
// worker's lowerPrefill until its first token (see Lease.YieldsPrefill).
//
// A budget drawn from the interactive objective instead (a lower-class prompt admitted while the
// worker's cost model predicted the next interactive prompt within 1.5x its idle TTFT beside it),
// replacing the count or tightening it, was measured side by side with it on make bench-queue and
// moved neither the interactive p99 nor batch's share beyond the rounds' spread (figures in
// docs/benchmarks.md): the count stays.
//
// Why one piece: a piece is sized so that the step an interactive prompt waits for delays it by
// at most its objective's slack, and an engine prefills together the pieces of every prompt it
// holds, so two pieces in one step take twice that. On three real llama-servers (two slots
// each) beside a prefill-heavy flood, a budget of 512 let both slots prefill a piece of ~82
// tokens together, and interactive prompts met their objective 39 and 37 times of 49; with at
// most one piece, 44 and 46, batch's share 0.65-0.68 against 0.62-0.63. On the sims (kv and slot
// engines, decode- and prefill-heavy) attainment and batch's share stayed as they were
// (docs/benchmarks.md, "One lower-class piece a step").

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
