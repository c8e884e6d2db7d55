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
	budget, piece := c.prefillOn(w)
	lower := w.prefill.tokens.Load()
	return lower <= 0 || lower+prefillTokens(c.PromptTokens, piece) <= budget
}

// prefillOn is c's prefill budget and piece on w: this replica's own (see Pool.protect), or,
// when more than pieceCycleSteps replicas of the fleet send w lower-class prompts
// (Worker.lowerSenders) and w is not a slot engine, pieceCycleSteps over their number of it, a
// piece no smaller than minPrefillPiece unless the pool's own is. Each replica counts only its
// own prompts in w's prefill, and an engine prefills together what every replica sent it: three
// replicas each within the whole budget put up to three pieces in the step an interactive prompt
// waits for. A slot engine (llama-server: its /props told its slots, Worker.slots) keeps the
// whole budget and piece: there a batch prompt holds its slot through all its pieces, and the
// interactive request waits for a slot more than for a step. Divided, a prompt went in twice as
// many pieces that held the slots longer: three replicas in front of real llama-servers met fewer
// interactive objectives (71/89 against 77/88 whole) with less batch (0.60-0.62 of capacity
// against 0.70), and on slot sims the division bought no interactive attainment the rounds could
// tell (199/201 against 186/189) for six points of batch (0.77-0.78 against 0.84):
// docs/benchmarks.md, "Lending the reserve", twentieth session. Cost: two atomic loads.
func (c *choice) prefillOn(w *Worker) (budget int64, piece int) {
	n := w.lowerSenders.Load()
	if n <= pieceCycleSteps || c.prefillBudget <= 0 || w.slots.Load() > 0 {
		return c.prefillBudget, c.piece
	}
	budget = max(senderPart(c.prefillBudget, n), 1)
	if c.basePiece > 0 {
		base := max(int(senderPart(int64(c.basePiece), n)), min(c.basePiece, minPrefillPiece))
		piece = prefillPiece(base, c.PromptTokens)
	}
	return budget, piece
}

// senderPart is one of n senders' part of v, v x pieceCycleSteps / n rounded down, for n above
// pieceCycleSteps, with no overflow whatever v (a configured budget may be any size).
func senderPart(v, n int64) int64 {
	return v/n*pieceCycleSteps + v%n*pieceCycleSteps/n
}

// pieceCycleSteps is how many engine steps one replica's lower-class pieces on a worker take
// from one to the next: a piece waits for the step in progress, is prefilled in the next, and
// the replica sends the next piece once that step's first token is back. So a replica's piece
// is in the engine's prefill about one step in two, and n replicas put about n/2 pieces in a
// step. Three replicas beside a prefill-heavy flood (make bench-queue SCENARIOS=4 REPLICAS=3,
// docs/benchmarks.md "Three replicas: the prefill budget divided") met 95.6-97.8% of the
// interactive objectives with whole pieces each, where one replica met 100% with batch at 0.79
// of what interactive left; with 2/3 each, 99.3% and 98.6%, batch 0.80-0.82; with a half, 100%
// and 0.75-0.76; with a third (one piece a step however they fall), 100% and 0.62-0.64: a
// replica sends a worker one piece at a time, so smaller pieces cost batch what they save.
const pieceCycleSteps = 2
