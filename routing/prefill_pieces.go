package routing

// Pieces protect interactive prompts from a long lower-class prompt in prefill: an engine runs
// in steps and does not stop one, so an interactive prompt waits for the step in progress; while
// interactive requests are present a long standard or batch prompt goes to the engine in pieces,
// each its own request that the engine's prefix cache keeps, and yields to interactive prompts
// between them (see Lease.PrefillPiece and Lease.AwaitInteractive). The pool sizes the pieces
// per pick (choice.piece, see Pool.protect); prefill_whole.go lets one worker of several keep its
// steps to pieces while the others take such prompts whole.

// Bounds of the learnt prefill piece (ConcurrencyConfig.PrefillPieceTokens 0): a piece is a
// request of its own, so pieces of very short interactive prompts would cost the engine more in
// requests than they save; and a prompt of any length goes in at most maxPrefillPieces, whatever
// the size configured.
const (
	minPrefillPiece  = 64
	maxPrefillPieces = 16
)

// prefillPiece is the size of the pieces a lower-class prompt of tokens goes to the engine in
// while interactive requests are present, or 0 when it goes whole (see Lease.PrefillPiece).
func (p *Pool) prefillPiece(tokens int) int {
	n := p.cfg.Concurrency.PrefillPieceTokens
	switch {
	case n < 0:
		return 0
	case n == 0:
		n = max(int(p.interactivePrompt.Load()), minPrefillPiece)
	}
	n = max(n, (tokens+maxPrefillPieces-1)/maxPrefillPieces)
	if tokens <= n+n/2 {
		// Not even one piece would go ahead: the gateway sends a piece only when at least
		// half a piece is left for the request itself.
		return 0
	}
	return n
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

// pieceOn is the size of the pieces c's prompt goes to w in (see Lease.PrefillPiece); 0: whole.
// A worker that schedules by priority gets it whole: usher sends such a worker more than it runs
// at once (see WorkerSpec.PriorityHandoff), so a request sent and not answered yet may be waiting
// in the engine's own queue, where the engine puts interactive requests first; it is not a
// prefill to keep interactive requests from.
func (c *choice) pieceOn(w *Worker) int {
	if w.PriorityHandoff() {
		return 0
	}
	return c.piece
}

// prefillTokens is how many prompt tokens c puts in w's prefill at once: its prompt, or one
// piece of it; at least 1.
func (c *choice) prefillTokens(w *Worker) int64 {
	n := c.PromptTokens
	if piece := c.pieceOn(w); piece > 0 {
		n = min(n, piece)
	}
	return int64(max(n, 1))
}
