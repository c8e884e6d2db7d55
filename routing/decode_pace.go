package routing

import (
	"context"
	"math"
	"time"
)

// Pieces paced beside interactive decodes. An engine step holds every sequence it runs: an
// interactive request decoding on a worker whose other slot prefills a lower-class piece gets
// its next token only when the piece's step ends. Pieces sent back to back put one in nearly
// every step of the interactive answer: on three llama-servers beside a prefill-heavy flood the
// interactive TPOT was 1.7x its default objective at the median (17 of 324 met, the objective 2x
// the idle step). So while an interactive request of this replica's decodes on the worker, a
// lower-class request waits after each piece for the decode steps that bring the interactive
// answer's mean step back within its objective, keeping half the objective's room (the default
// factor's) for the machine's noise: after a piece whose answer took p, n steps of s (the
// idle step) such that (p + n s) / (1 + n) <= T, T = s (1 + (InteractiveTPOTFactor - 1) / 2),
// so it waits n s = s (p - T) / (T - s). p, measured from sending the piece to its answer,
// counts the step in progress it waited for too: the pace errs on the interactive side. Where a
// piece's step keeps within T (the simulators' fast prefill) nothing waits.
//
// The pace follows the interactive TPOT attainment, as the learnt piece follows the TTFT one:
// it is decodePace times a share in [0, 1] that each interactive answer that decoded beside a
// lower-class piece and missed its TPOT objective raises (by pieceStep x (1 - q)) and each that
// met it lowers (pieceStep x q), q = 1 - the objective's percentile, so such misses settle at q
// of the verdicts. It starts at 0, and stays there where the interactive TPOT holds beside pieces
// sent back to back: on the simulators (2026-12-07, twenty-sixth session) batch kept 0.81 and 0.85
// of what interactive left against 0.80 and 0.86 unpaced, every interactive answer meeting its
// TPOT objective in both; pacing them always cost 0.06-0.11 there. (That A/B first failed, the
// share rising on the simulators too: their "misses" were answers judged against the 10 ms floor
// before the workers learnt their steps, since fixed.) Paced from the cost model's prefill time
// for the piece's tokens instead of its round trip, the pace cost the simulators as much (always
// on) and kept less on llama-server (260 of 324 met, against 319 of 324 with this one; 19
// unpaced).
//
// Other replicas' interactive requests are not counted (their decodes are not told); an
// explicit tier TPOT objective is not read: the pace keeps the default one.

// maxDecodePace bounds one wait: a piece that waited long in the engine's queue (p) did not
// share its steps with the decode that long.
const maxDecodePace = time.Second

// decodePace is the wait after a piece whose answer took p, on an engine whose idle step is s,
// that keeps an interactive answer's mean step within T (see above); 0 when the piece's step
// kept within it. At most maxDecodePace.
func decodePace(p, s time.Duration) time.Duration {
	if s <= 0 || p <= 0 {
		return 0
	}
	t := float64(s) * (1 + (InteractiveTPOTFactor-1)/2)
	if float64(p) <= t {
		return 0
	}
	wait := float64(s) * (float64(p) - t) / (t - float64(s))
	return time.Duration(min(wait, float64(maxDecodePace)))
}

// AwaitDecodes waits, after one piece of the lease's prompt whose answer took took from sending,
// while an interactive request of this replica's decodes on the lease's worker, until enough of
// its steps have passed without a lower-class prefill for its mean step to keep within its
// objective (see decodePace), or none decodes there, or ctx ends (its error then). A lower-class
// request that sends its prompt in pieces calls it after each piece; it returns at once for an
// interactive lease, while no interactive request decodes on the worker, or while the worker's
// cost model has not learnt its step.
func (l *Lease) AwaitDecodes(ctx context.Context, took time.Duration) error {
	w := l.Worker
	if l.interactive || w.interactiveDecodes.Load() == 0 {
		return nil
	}
	idle, ok := w.PredictIdle(1, 0)
	if !ok {
		return nil
	}
	d := time.Duration(float64(decodePace(took, idle.TPOT)) * l.pool.paceShare())
	if d <= 0 {
		return nil
	}
	l.pool.metrics.decodePaces.Inc()
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		ended := l.pool.interactiveDecoded.Wait()
		if w.interactiveDecodes.Load() == 0 {
			return nil
		}
		select {
		case <-t.C:
			return nil
		case <-ended:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// paceShare is the share of decodePace the pace is now, in [0, 1]. Cost: an atomic load.
func (p *Pool) paceShare() float64 { return math.Float64frombits(p.paceShareBits.Load()) }

// JudgedDecode tells the pool of the TPOT verdict, met or missed, of an interactive answer that
// decoded beside a lower-class piece (Lease.DecodedBesidePieces), against an objective
// percentile percent of them should meet (clamped to [50, 99.9]); the pace follows (see above).
// Lock-free; safe for concurrent use.
func (p *Pool) JudgedDecode(met bool, percentile float64) {
	q := 1 - min(max(percentile, 50), 99.9)/100
	d := pieceStep * (1 - q)
	if met {
		d = -pieceStep * q
	}
	for {
		old := p.paceShareBits.Load()
		v := min(max(math.Float64frombits(old)+d, 0), 1)
		if p.paceShareBits.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

// DecodedBesidePieces reports whether a lower-class piece went to the lease's worker (PieceSent)
// while the lease's interactive request decoded there: from its first token to Release, or to
// now while it decodes.
func (l *Lease) DecodedBesidePieces() bool {
	if l.decoding.Load() {
		return l.Worker.piecesSent.Load() != l.piecesAtDecode.Load()
	}
	return l.besidePieces.Load()
}

// startDecode counts the lease's interactive request as decoding on its worker, from its first
// token until Release (endDecode), once, and not after Release.
func (l *Lease) startDecode() {
	if !l.interactive || l.released.Load() {
		return
	}
	l.piecesAtDecode.Store(l.Worker.piecesSent.Load())
	if !l.decoding.CompareAndSwap(false, true) {
		return
	}
	l.Worker.interactiveDecodes.Add(1)
	if l.released.Load() {
		// Release ran meanwhile and may not have seen decoding set: one of the two ends it.
		l.endDecode()
	}
}

// endDecode uncounts the lease's decode, once.
func (l *Lease) endDecode() {
	if l.decoding.Load() {
		l.besidePieces.Store(l.Worker.piecesSent.Load() != l.piecesAtDecode.Load())
	}
	if l.decoding.CompareAndSwap(true, false) {
		l.Worker.interactiveDecodes.Add(-1)
		l.pool.interactiveDecoded.notify()
	}
}
