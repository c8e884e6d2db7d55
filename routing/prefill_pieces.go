package routing

import "math"

// Pieces protect interactive prompts from a long lower-class prompt in prefill: an engine runs
// in steps and does not stop one, so an interactive prompt waits for the step in progress; while
// interactive requests are present a long standard or batch prompt goes to the engine in pieces,
// each its own request that the engine's prefix cache keeps, and each piece, and the request
// itself after them, waits while an interactive prompt is in prefill on its worker (see
// Lease.PrefillPiece and Lease.AwaitInteractive). So an interactive prompt waits for at most one
// piece in the step in progress and shares its own step with no lower-class prefill. The pool
// sizes the pieces per pick (choice.piece, see Pool.protect) from the default interactive
// objective: a piece of (InteractiveObjectiveFactor - 1) times the average interactive prompt
// delays that prompt by at most the objective's slack; and never more than the lower-class
// prefill budget (ConcurrencyConfig.LowerPrefillTokens), the most lower-class prefill a worker
// takes beside interactive prompts, which a larger piece, let in alone, would exceed; and the
// budget is in turn at most one piece, so no two lower-class pieces share a step. Every
// worker takes pieces, those that schedule by priority too: an engine's priority orders its
// waiting queue, not the step it is in.
//
// Why the budget bounds the piece (docs/benchmarks.md, "Pieces no larger than the prefill
// budget"): where interactive prompts are long (the demo's 512-1,536 tokens), pieces of the
// average one let a lower-class prompt of up to a piece and a half (1,536 tokens) into one step,
// and the shorter interactive prompts, whose slack is shorter, missed the default objective
// (193 of 213 met); capped at the budget, 393 of 393 met over six runs, for a sixth of batch's
// throughput there. Where interactive prompts are short (bench-queue's 128-384), the cap does
// not bind. The request's own last part may still be up to half a piece more than the budget.
//
// Measured against pieces the size of the interactive prompt on one worker of several (the others
// taking such prompts whole), with no yield of the request itself and none on workers that
// schedule by priority: the demo's interactive TTFT p99 went from 2.0-2.7x its p99 alone to
// 1.4x, for about a tenth of batch's throughput there (docs/benchmarks.md, "Pieces sized by the
// objective").

// Bounds of the learnt prefill piece (ConcurrencyConfig.PrefillPieceTokens 0): a piece is a
// request of its own, so pieces of very short interactive prompts would cost the engine more in
// requests than they save; and a prompt of any length goes in at most maxPrefillPieces, whatever
// the size configured.
const (
	minPrefillPiece  = 64
	maxPrefillPieces = 16
)

// prefillPiece is the size of the pieces a lower-class prompt of tokens goes to the engine in
// while interactive requests are present, or 0 when it goes whole (see Lease.PrefillPiece):
// piece (Pool.pieceTokens), or more for a prompt of more than maxPrefillPieces of them.
func prefillPiece(piece, tokens int) int {
	if piece <= 0 {
		return 0
	}
	n := max(piece, (tokens+maxPrefillPieces-1)/maxPrefillPieces)
	if tokens <= n+n/2 {
		// Not even one piece would go ahead: the gateway sends a piece only when at least
		// half a piece is left for the request itself.
		return 0
	}
	return n
}

// pieceTokens is the configured or learnt piece (ConcurrencyConfig.PrefillPieceTokens), 0 when
// pieces are off. The learnt piece is the objective's slack (the average interactive prompt
// times InteractiveObjectiveFactor - 1) times the share the interactive attainment left it (see
// JudgedInteractive), within the lower-class prefill budget and at least minPrefillPiece times
// that share.
func (p *Pool) pieceTokens() int {
	n := p.cfg.Concurrency.PrefillPieceTokens
	switch {
	case n < 0:
		return 0
	case n == 0:
		share := p.pieceShare()
		n = int(float64(p.interactivePrompt.Load()) * (InteractiveObjectiveFactor - 1) * share)
		n = max(min(n, p.cfg.Concurrency.LowerPrefillTokens), int(minPrefillPiece*share))
	}
	return n
}

// The learnt piece follows the interactive requests' attainment. A piece the size of the
// objective's slack keeps an interactive prompt that waits for one within its objective when the
// engine's steps take what its cost model learnt; on an engine whose steps vary with what else
// runs on the machine (three llama-servers on two cores: a 74-token piece took 72 ms at p10 and
// 290 at p90), the prompts that arrive behind a slow piece miss. So each interactive request that
// missed its TTFT objective at the engine shrinks the piece, and each that met it grows it back,
// until the misses are the share the objective's percentile allows: a stochastic approximation of
// the quantile (each miss takes pieceStep x (1 - q) off the logarithm of the share, each met
// request adds pieceStep x q, which balance where q of the verdicts are misses). Only the misses
// of requests placed while their worker had a lower-class prompt in prefill count: the others
// waited for something a smaller piece does not shorten (a decode step, a slow machine), and
// shrinking the piece for them cost batch for nothing. Where the objective holds with
// whole-slack pieces (the simulators) the share stays 1 and batch keeps its throughput; smaller
// pieces cost batch a request each.
//
// Measured on three llama-servers of two slots beside a prefill-heavy flood, one replica
// (docs/benchmarks.md, "Pieces that follow the attainment"): pieces of 32 tokens met 98.8-99.7%
// of the interactive objectives where the slack's 74 met 96.6-97.8%, for 0.48-0.50 of capacity of
// batch against 0.68-0.76; learnt this way, 98.8% for 0.59 (one run). Counting every miss at the engine
// instead shrank the piece for misses it did not make: 97.5-98.5% for 0.54-0.57.
const (
	pieceStep = 0.25
	// minPieceShare bounds the shrinking: a piece is a request, and at a quarter of the slack
	// (and of minPrefillPiece) the requests cost the engine more than the step they shorten.
	minPieceShare = 0.25
)

// pieceShare is the share of the objective's slack the learnt piece is now, in
// [minPieceShare, 1]. Cost: an atomic load and an exp.
func (p *Pool) pieceShare() float64 {
	return math.Exp(math.Float64frombits(p.pieceLogShare.Load()))
}

// JudgedInteractive tells the pool of an interactive request's TTFT verdict, met or missed,
// against an objective percentile percent of them should meet (clamped to [50, 99.9]); the
// learnt piece follows (see pieceShare). The caller tells only the misses a piece may have made:
// the request was placed behind a lower-class prefill (Lease.BehindLowerPrefill) and did not
// wait in usher's queue for most of its objective (a smaller piece shortens the step an
// interactive prompt waits for at the engine, not usher's queue). Lock-free; safe for
// concurrent use.
func (p *Pool) JudgedInteractive(met bool, percentile float64) {
	q := 1 - min(max(percentile, 50), 99.9)/100
	d := pieceStep * q
	if !met {
		d = -pieceStep * (1 - q)
	}
	for {
		old := p.pieceLogShare.Load()
		v := min(max(math.Float64frombits(old)+d, math.Log(minPieceShare)), 0)
		if p.pieceLogShare.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

// observeInteractivePrompt adds an interactive request's prompt tokens to the moving average
// the learnt prefill piece follows (an eighth of the way to each new prompt).
func (p *Pool) observeInteractivePrompt(tokens int) {
	for {
		old := p.interactivePrompt.Load()
		avg := int64(tokens)
		if old > 0 {
			avg = old + (int64(tokens)-old)/8
		}
		if p.interactivePrompt.CompareAndSwap(old, avg) {
			return
		}
	}
}

// prefillTokens is how many tokens of a prompt of prompt tokens go into a worker's prefill at
// once when it goes in pieces of piece (0: whole): the prompt, or one piece of it; at least 1.
func prefillTokens(prompt, piece int) int64 {
	if piece > 0 {
		prompt = min(prompt, piece)
	}
	return int64(max(prompt, 1))
}
