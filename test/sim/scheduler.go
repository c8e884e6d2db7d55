package sim

import (
	"container/heap"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Why a sequence ended without finishing; the handler maps each to what the client sees.
var (
	// errClosed: Engine.Close ended the sequence; the client gets 503 or an error event.
	errClosed = errors.New("sim: engine closed")
	// errDead: the engine died (Faults.ExitAfter); the connection is closed without an answer.
	errDead = errors.New("sim: engine died")
)

type seqState int

const (
	stateWaiting seqState = iota
	stateRunning
	stateDone
)

// sequence is one request inside the engine, modelled as vLLM models it: tokens are the prompt
// followed by the tokens generated so far; computed counts the tokens whose KV is in the cache.
// A step computes tokens [computed, computed+n) and, when that reaches len(tokens), samples the
// next token.
type sequence struct {
	// Set at creation, then read-only.
	arrival   uint64 // arrival order, the FCFS key and priority tie-break
	priority  int
	promptLen int
	maxTokens int

	// Guarded by the Engine's mutex (touched by the scheduler only).
	filler     *rand.Rand
	tokens     []uint64
	hashes     []uint64 // chained hashes of tokens' full blocks, extended on demand
	salt       uint64   // the parent hash of the first block: 0, or its cache_salt's saltHash
	blocks     []*block
	computed   int
	cachedUpTo int // full blocks registered in the prefix cache
	state      seqState
	heapIndex  int
	slot       int // ModeSlots: the slot held while running, else -1
	generated  int
	stepTime   time.Duration // the cost of the steps that computed it (counters.seqTime)
	admitted   bool          // admitted at least once: prompt and cache counters already taken
	arrivedAt  time.Time     // when add queued it, for the latency histograms
	// remote is how many prompt tokens have their KV pulled from a prefill worker (RoleDecode):
	// on first admission they count as computed, so only the rest is prefilled. It is cleared
	// then, so a preempted sequence recomputes (vLLM pulls once per request).
	remote int
	// hold, when not empty, is the key under which the sequence's KV blocks are kept for a
	// decode worker when it finishes (RolePrefill), instead of being freed.
	hold string

	out outbox
}

// outbox passes a sequence's output from the scheduler to its HTTP handler without ever
// blocking the scheduler: tokens are appended under mu and notify is signalled without
// waiting.
type outbox struct {
	notify chan struct{} // capacity 1: "something new under mu"

	mu      sync.Mutex // guards the fields below
	pending []int32    // vocabulary indices not yet taken by the handler
	cached  int        // prompt tokens served from the prefix cache on first admission
	finish  string     // the finish reason once done without error
	err     error      // why the sequence ended without finishing
	done    bool
	held    []int // RolePrefill: the ids of the blocks held for a decode worker, set before done
}

func (o *outbox) signal() {
	select {
	case o.notify <- struct{}{}:
	default:
	}
}

func (o *outbox) push(tok int32, finish string) {
	o.mu.Lock()
	o.pending = append(o.pending, tok)
	if finish != "" {
		o.finish, o.done = finish, true
	}
	o.mu.Unlock()
	o.signal()
}

func (o *outbox) fail(err error) {
	o.mu.Lock()
	o.err, o.done = err, true
	o.mu.Unlock()
	o.signal()
}

func (o *outbox) setHeld(ids []int) {
	o.mu.Lock()
	o.held = ids
	o.mu.Unlock()
}

func (o *outbox) heldBlocks() []int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.held
}

func (o *outbox) setCached(n int) {
	o.mu.Lock()
	o.cached = n
	o.mu.Unlock()
}

// take appends the pending tokens to buf and reports whether the sequence is over.
func (o *outbox) take(buf []int32) (toks []int32, done bool, finish string, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	toks = append(buf, o.pending...)
	o.pending = o.pending[:0]
	return toks, o.done, o.finish, o.err
}

func newSequence(arrival uint64, prompt []uint64, maxTokens, priority int) *sequence {
	tokens := make([]uint64, len(prompt), len(prompt)+min(maxTokens, 1024))
	copy(tokens, prompt)
	return &sequence{
		arrival:   arrival,
		priority:  priority,
		promptLen: len(prompt),
		maxTokens: maxTokens,
		filler:    newFiller(prompt),
		tokens:    tokens,
		heapIndex: -1,
		slot:      -1,
		out:       outbox{notify: make(chan struct{}, 1)},
	}
}

// counters are the engine's running totals and gauges, written by the scheduler (under the
// Engine's mutex) and by request handlers, and read lock-free by Stats and /metrics.
type counters struct {
	requests, completed, cancelled, failed, hung, badRequests atomic.Int64
	promptTokens, cachedPromptTokens, generatedTokens         atomic.Int64
	prefixQueries, prefixHits, preemptions, evictions         atomic.Int64
	running, waiting                                          atomic.Int64
	// promptComputed counts prompt tokens computed by steps (prefill work, recomputation after
	// preemption included); kvReceived counts prompt tokens whose KV was pulled from a prefill
	// worker instead; receiving is the requests pulling now; held is the prefills whose KV is
	// held for a decode worker, and heldExpired those freed unpulled (expired or evicted).
	// transferFailed counts decode requests refused because their KV could not be pulled.
	promptComputed, kvReceived, receiving, held, heldExpired, transferFailed atomic.Int64
	// peak is the most sequences the engine held at once (running and waiting) since it started:
	// what a fleet of gateways sent it in all, by the engine's own count.
	peak atomic.Int64
	// steps counts engine steps (llama_decode calls) and stepSeqs the sequences they computed.
	steps, stepSeqs atomic.Int64
	// seqTime is the sum over steps of the step's cost times the sequences it computed: the
	// time sequences spent computing (one sequence in the batch for a second is a second), in
	// nanoseconds of the engine's time (before TimeScale); lostSeqTime is, of it, the time of
	// sequences cancelled while running, whose work was thrown away (a gateway's preemption, a
	// client gone).
	seqTime, lostSeqTime atomic.Int64
	kvUsageBits          atomic.Uint64
}

func (c *counters) kvUsage() float64 { return math.Float64frombits(c.kvUsageBits.Load()) }

// waitQueue orders waiting sequences: by arrival under FCFS, by (priority, arrival) under
// the priority policy. A preempted sequence keeps its arrival, so it goes back near the front.
type waitQueue struct {
	byPriority bool
	seqs       []*sequence
}

func (q *waitQueue) Len() int { return len(q.seqs) }
func (q *waitQueue) Less(i, j int) bool {
	a, b := q.seqs[i], q.seqs[j]
	if q.byPriority && a.priority != b.priority {
		return a.priority < b.priority
	}
	return a.arrival < b.arrival
}
func (q *waitQueue) Swap(i, j int) {
	q.seqs[i], q.seqs[j] = q.seqs[j], q.seqs[i]
	q.seqs[i].heapIndex = i
	q.seqs[j].heapIndex = j
}
func (q *waitQueue) Push(x any) {
	s := x.(*sequence)
	s.heapIndex = len(q.seqs)
	q.seqs = append(q.seqs, s)
}
func (q *waitQueue) Pop() any {
	n := len(q.seqs) - 1
	s := q.seqs[n]
	q.seqs[n] = nil
	q.seqs = q.seqs[:n]
	s.heapIndex = -1
	return s
}

// stepPlan is what one engine step computes: n[i] tokens of seqs[i], taking cost.
type stepPlan struct {
	seqs []*sequence
	n    []int
	cost time.Duration
}

func (p *stepPlan) empty() bool { return len(p.seqs) == 0 }

// scheduler is the engine proper: the waiting queue, the running batch and the KV cache. It is
// not safe for concurrent use; the Engine holds its mutex around every call. It starts no
// goroutine and never sleeps: schedule plans a step and returns its cost, apply records its
// outcome, and the Engine waits in between.
type scheduler struct {
	cfg  Config
	pool *blockPool
	// slots is llama-server's per-slot prompt cache in ModeSlots, nil in ModeKV. Then pool is
	// only the slots' reserved contexts (it never runs short) and holds no prefix cache.
	slots   *slotCache
	waiting waitQueue
	running []*sequence
	stats   *counters
	plan    stepPlan
	// finished is apply's scratch list of sequences that finished in the step.
	finished []finished
	// latency, if not nil, observes queue time, time to first token and end-to-end latency,
	// read from now.
	latency *latencyHistograms
	now     func() time.Time
	// holds are the finished prefills whose blocks wait for a decode worker (RolePrefill).
	holds *kvHolds
}

// newScheduler builds an empty engine. latency may be nil; now nil means time.Now.
func newScheduler(cfg Config, stats *counters, latency *latencyHistograms, now func() time.Time) *scheduler {
	if now == nil {
		now = time.Now
	}
	s := &scheduler{
		cfg:     cfg,
		latency: latency,
		now:     now,
		pool:    newBlockPool(cfg.numBlocks(), cfg.BlockSize),
		waiting: waitQueue{byPriority: cfg.SchedulingPolicy == PolicyPriority},
		stats:   stats,
	}
	s.holds = newKVHolds(cfg.MaxHeldTransfers, cfg.KVHoldTimeout, s.pool, stats)
	if cfg.Mode == ModeSlots {
		s.slots = newSlotCache(cfg.Slots)
	}
	s.publish()
	return s
}

// publish refreshes the gauges read without the lock.
func (s *scheduler) publish() {
	s.stats.running.Store(int64(len(s.running)))
	s.stats.waiting.Store(int64(s.waiting.Len()))
	if held := int64(len(s.running) + s.waiting.Len()); held > s.stats.peak.Load() {
		s.stats.peak.Store(held)
	}
	s.stats.kvUsageBits.Store(math.Float64bits(s.pool.usage()))
	s.stats.evictions.Store(s.pool.evictions)
}

// add queues a new sequence.
func (s *scheduler) add(q *sequence) {
	q.state = stateWaiting
	if s.latency != nil {
		q.arrivedAt = s.now()
	}
	heap.Push(&s.waiting, q)
	s.publish()
}

// cancel removes q wherever it is and frees its blocks at once. It reports whether q was still
// in the engine.
func (s *scheduler) cancel(q *sequence) bool {
	switch q.state {
	case stateWaiting:
		heap.Remove(&s.waiting, q.heapIndex)
	case stateRunning:
		s.stats.lostSeqTime.Add(int64(q.stepTime))
		s.removeRunning(q)
		s.pool.release(q.blocks)
		q.blocks = nil
		s.vacate(q)
	default:
		return false
	}
	q.state = stateDone
	s.publish()
	return true
}

// failAll ends every sequence with err.
func (s *scheduler) failAll(err error) {
	ended := s.running
	for _, q := range s.running {
		s.pool.release(q.blocks)
		q.blocks = nil
		s.vacate(q)
	}
	s.running = nil
	for s.waiting.Len() > 0 {
		ended = append(ended, heap.Pop(&s.waiting).(*sequence))
	}
	s.publish()
	for _, q := range ended {
		q.state = stateDone
		q.out.fail(err)
	}
}

func (s *scheduler) removeRunning(q *sequence) int {
	for i, r := range s.running {
		if r == q {
			copy(s.running[i:], s.running[i+1:])
			s.running[len(s.running)-1] = nil
			s.running = s.running[:len(s.running)-1]
			return i
		}
	}
	return -1
}

// vacate frees the slot of a sequence leaving the batch (ModeSlots; nothing in ModeKV).
func (s *scheduler) vacate(q *sequence) {
	if s.slots != nil {
		s.slots.vacate(q)
	}
}

// ensureHashes extends q.hashes to cover its first nblocks full blocks.
func (s *scheduler) ensureHashes(q *sequence, nblocks int) {
	bs := s.cfg.BlockSize
	for i := len(q.hashes); i < nblocks; i++ {
		parent := q.salt
		if i > 0 {
			parent = q.hashes[i-1]
		}
		q.hashes = append(q.hashes, blockHash(parent, q.tokens[i*bs:(i+1)*bs]))
	}
}

// registerFull records in the prefix cache every full block of q among its first upto tokens
// (ModeKV; in ModeSlots the slot keeps them).
func (s *scheduler) registerFull(q *sequence, upto int) {
	if s.slots != nil {
		return
	}
	full := upto / s.cfg.BlockSize
	s.ensureHashes(q, full)
	bs := s.cfg.BlockSize
	// The run of blocks newly stored in this step goes out as one event, added whole: added
	// block by block, the publisher could send the first block alone.
	var ev *kvEvent
	flush := func() {
		if ev != nil {
			s.pool.events.add(*ev)
			ev = nil
		}
	}
	for ; q.cachedUpTo < full; q.cachedUpTo++ {
		i := q.cachedUpTo
		if !s.pool.cache(q.blocks[i], q.hashes[i]) || s.pool.events == nil {
			flush()
			continue
		}
		if ev == nil {
			ev = &kvEvent{kind: "BlockStored", root: i == 0}
			if i > 0 {
				ev.parent = q.hashes[i-1]
			}
		}
		ev.hashes = append(ev.hashes, q.hashes[i])
		ev.tokens = append(ev.tokens, q.tokens[i*bs:(i+1)*bs]...)
	}
	flush()
}

func (s *scheduler) blocksFor(tokens int) int {
	return (tokens + s.cfg.BlockSize - 1) / s.cfg.BlockSize
}

// grow gives q enough blocks to hold upto tokens, reporting false (and taking nothing) if the
// pool cannot.
func (s *scheduler) grow(q *sequence, upto int) bool {
	need := s.blocksFor(upto) - len(q.blocks)
	if need <= 0 {
		return true
	}
	blks := s.pool.allocate(need)
	if blks == nil {
		return false
	}
	q.blocks = append(q.blocks, blks...)
	return true
}

// victim is the running sequence to preempt when blocks run out: the last admitted under FCFS,
// the highest priority value (latest arrival among equals) under the priority policy.
func (s *scheduler) victim() *sequence {
	v := s.running[len(s.running)-1]
	if s.waiting.byPriority {
		for _, q := range s.running {
			if q.priority > v.priority || (q.priority == v.priority && q.arrival > v.arrival) {
				v = q
			}
		}
	}
	return v
}

// preempt sends q back to the waiting queue, freeing its blocks; its KV is recomputed when it
// is admitted again (the prefix cache may still hold much of it).
func (s *scheduler) preempt(q *sequence) {
	s.removeRunning(q)
	s.pool.release(q.blocks)
	q.blocks = nil
	s.vacate(q)
	q.computed = 0
	q.cachedUpTo = 0
	q.state = stateWaiting
	heap.Push(&s.waiting, q)
	s.stats.preemptions.Add(1)
}

// preemptForPriority gives the batch slot of the lowest-priority running sequence to a waiting
// one of higher priority (lower value) when the batch is full, as vLLM's priority scheduling
// preempts: the victim goes back to waiting and recomputes its KV when admitted again. Under
// FCFS it does nothing.
func (s *scheduler) preemptForPriority() {
	if !s.waiting.byPriority {
		return
	}
	for len(s.running) >= s.cfg.batchSeqs() && s.waiting.Len() > 0 && len(s.running) > 0 {
		v := s.victim()
		if s.waiting.seqs[0].priority >= v.priority {
			return
		}
		s.preempt(v)
	}
}

// schedule plans the next step, as vLLM's V1 scheduler does: running sequences first (each
// decoding one takes one token of the budget, a prefilling one a chunk), preempting when the
// KV cache is full; then, if nothing was preempted, waiting sequences in queue order while a
// batch slot, budget and blocks remain. The returned plan is valid until the next call.
func (s *scheduler) schedule() *stepPlan {
	p := &s.plan
	p.seqs, p.n, p.cost = p.seqs[:0], p.n[:0], 0
	budget := s.cfg.MaxNumBatchedTokens
	preempted := false
	s.holds.sweep(s.now())
	s.preemptForPriority()

	for i := 0; i < len(s.running) && budget > 0; i++ {
		q := s.running[i]
		n := min(len(q.tokens)-q.computed, budget)
		scheduled := true
		for !s.grow(q, q.computed+n) {
			v := s.victim()
			if j := slices.Index(p.seqs, v); j >= 0 {
				budget += p.n[j]
				p.n[j] = 0
			}
			if idx := slices.Index(s.running, v); idx <= i {
				i--
			}
			s.preempt(v)
			preempted = true
			if v == q {
				scheduled = false
				break
			}
		}
		if !scheduled {
			continue
		}
		s.registerFull(q, q.computed+n)
		p.seqs = append(p.seqs, q)
		p.n = append(p.n, n)
		budget -= n
	}

	for !preempted && budget > 0 && len(s.running) < s.cfg.batchSeqs() && s.waiting.Len() > 0 {
		q := s.waiting.seqs[0]
		var hit []*block
		computed, slot := 0, -1
		if s.slots != nil {
			// The slot's kept tokens are in its reserved context, so the blocks below
			// cover the whole sequence; the slots never run short of them.
			if slot, computed = s.slots.pick(q); slot < 0 {
				break
			}
		} else {
			usable := (len(q.tokens) - 1) / s.cfg.BlockSize
			s.ensureHashes(q, usable)
			hit = s.pool.longestHit(q.hashes[:usable])
			computed = len(hit) * s.cfg.BlockSize
		}
		local := computed
		computed = max(computed, q.remote)
		n := min(len(q.tokens)-computed, budget)
		need := s.blocksFor(computed+n) - len(hit)
		if need > s.pool.nfree-freeAmong(hit) {
			break
		}
		heap.Pop(&s.waiting)
		if slot >= 0 {
			s.slots.assign(q, slot)
		}
		s.pool.touch(hit)
		q.blocks = append(append(q.blocks[:0], hit...), s.pool.allocate(need)...)
		q.computed = computed
		q.cachedUpTo = len(hit)
		q.state = stateRunning
		s.running = append(s.running, q)
		s.stats.prefixQueries.Add(int64(len(q.tokens)))
		s.stats.prefixHits.Add(int64(local))
		if !q.admitted {
			q.admitted = true
			s.stats.promptTokens.Add(int64(q.promptLen))
			// Pulled tokens are reported as cached, as vLLM's num_cached_tokens counts every
			// token computed before the first step, the connector's included.
			s.stats.cachedPromptTokens.Add(int64(computed))
			s.stats.kvReceived.Add(int64(computed - local))
			q.remote = 0
			q.out.setCached(computed)
			if s.latency != nil {
				s.latency.queue.Observe(s.now().Sub(q.arrivedAt).Seconds())
			}
		}
		s.registerFull(q, computed+n)
		p.seqs = append(p.seqs, q)
		p.n = append(p.n, n)
		budget -= n
	}

	s.costOf(p)
	s.publish()
	return p
}

// costOf prices a plan: the step's fixed cost, plus for each sequence its own cost and either
// its prefill chunk or, when decoding one token, the read of its context.
func (s *scheduler) costOf(p *stepPlan) {
	if p.empty() {
		return
	}
	cost := s.cfg.DecodeBase
	for i, q := range p.seqs {
		n := p.n[i]
		switch {
		case n == 0:
			continue
		case n == 1:
			cost += s.cfg.DecodePerSeq + time.Duration(q.computed)*s.cfg.DecodePerKVToken
		default:
			cost += s.cfg.DecodePerSeq + time.Duration(n)*s.cfg.PrefillPerToken
		}
	}
	p.cost = cost
}

// apply records the outcome of a planned step: computed tokens advance, every sequence whose
// tokens are all computed samples one token, and sequences that reached max_tokens finish. A
// sequence cancelled while the step ran is skipped.
func (s *scheduler) apply(p *stepPlan) {
	s.stats.steps.Add(1)
	s.stats.stepSeqs.Add(int64(len(p.seqs)))
	for i, q := range p.seqs {
		n := p.n[i]
		if n == 0 || q.state != stateRunning {
			continue
		}
		q.stepTime += p.cost
		s.stats.seqTime.Add(int64(p.cost))
		if q.computed < q.promptLen {
			s.stats.promptComputed.Add(int64(min(q.computed+n, q.promptLen) - q.computed))
		}
		q.computed += n
		if q.computed < len(q.tokens) {
			continue
		}
		tok := int32(q.filler.IntN(len(vocabulary)))
		q.tokens = append(q.tokens, vocabularyIDs[tok])
		q.generated++
		s.stats.generatedTokens.Add(1)
		if s.latency != nil && (q.generated == 1 || q.generated >= q.maxTokens) {
			since := s.now().Sub(q.arrivedAt).Seconds()
			if q.generated == 1 {
				s.latency.ttft.Observe(since)
			}
			if q.generated >= q.maxTokens {
				s.latency.e2e.Observe(since)
			}
		}
		if q.generated < q.maxTokens {
			q.out.push(tok, "")
			continue
		}
		s.removeRunning(q)
		if q.hold != "" {
			q.out.setHeld(s.holds.add(q.hold, q.blocks, q.promptLen, promptDigest(q), s.now()))
		} else {
			s.pool.release(q.blocks)
		}
		q.blocks = nil
		s.vacate(q)
		q.state = stateDone
		s.stats.completed.Add(1)
		s.finished = append(s.finished, finished{q, tok})
	}
	// Publish before the last tokens go out, so a client that sees its answer complete also
	// sees the engine's gauges without it.
	s.publish()
	for i, f := range s.finished {
		f.q.out.push(f.tok, finishLength)
		s.finished[i] = finished{}
	}
	s.finished = s.finished[:0]
}

// finished is a sequence that has finished in a step, with its last token.
type finished struct {
	q   *sequence
	tok int32
}

const finishLength = "length"
