package sim

// slotCache is llama-server's prompt cache, used in ModeSlots instead of the shared block
// cache: each slot keeps the tokens its last request computed (prompt and output). A request
// takes the idle slot whose kept tokens share the longest prefix with its prompt, if that prefix
// is more than slotSimilarity of the slot's tokens; otherwise the idle slot used least
// recently. It reuses the shared prefix, all but the prompt's last token at most (llama-server
// always evaluates one). A slotCache is not safe for concurrent use; the scheduler's caller
// holds the Engine's mutex.
type slotCache struct {
	slots []slot
	// clock orders the slots' last use; it only grows.
	clock uint64
}

// slotSimilarity is llama-server's default --slot-prompt-similarity.
const slotSimilarity = 0.5

type slot struct {
	tokens   []uint64 // what the slot's last request computed; shared with that done sequence
	lastUsed uint64
	busy     bool
	task     uint64 // the running request's arrival number while busy
}

func newSlotCache(n int) *slotCache { return &slotCache{slots: make([]slot, n)} }

// pick chooses q's slot among the idle ones and returns it with the number of q's tokens found
// in it; it returns -1 when every slot is busy. It changes nothing.
func (c *slotCache) pick(q *sequence) (idx, reuse int) {
	idx = -1
	best := 0
	for i := range c.slots {
		sl := &c.slots[i]
		if sl.busy || len(sl.tokens) == 0 {
			continue
		}
		n := commonPrefix(sl.tokens, q.tokens)
		if n > best && float64(n)/float64(len(sl.tokens)) > slotSimilarity {
			idx, best = i, n
		}
	}
	if idx < 0 {
		for i := range c.slots {
			if !c.slots[i].busy && (idx < 0 || c.slots[i].lastUsed < c.slots[idx].lastUsed) {
				idx = i
			}
		}
		if idx < 0 {
			return -1, 0
		}
		best = commonPrefix(c.slots[idx].tokens, q.tokens)
	}
	return idx, min(best, len(q.tokens)-1)
}

// assign gives slot idx to q until vacate.
func (c *slotCache) assign(q *sequence, idx int) {
	c.slots[idx].busy, c.slots[idx].task = true, q.arrival
	q.slot = idx
}

// vacate frees q's slot, which keeps the tokens q computed for the next request.
func (c *slotCache) vacate(q *sequence) {
	if q.slot < 0 {
		return
	}
	c.clock++
	sl := &c.slots[q.slot]
	sl.tokens, sl.lastUsed, sl.busy, sl.task = q.tokens[:q.computed], c.clock, false, 0
	q.slot = -1
}

// commonPrefix is the length of the longest common prefix of a and b.
func commonPrefix(a, b []uint64) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}
