package sim

import (
	"container/list"
	"time"
)

// kvHolds are the finished prefills of a RolePrefill engine whose KV blocks wait for a decode
// worker to pull them, keyed by the transfer's name (vLLM's remote_request_id, or SGLang's
// bootstrap room). Held blocks keep their reference, so they count against the KV cache as
// vLLM's delayed-free blocks do, until the pull takes them, they expire (timeout after the
// hold) or a newer hold pushes the oldest out past max.
//
// One timeout for every hold makes hold order expiry order: the list is oldest first and a
// sweep looks only at its front. Every operation costs O(1) plus the holds it frees. Not safe
// for concurrent use: the Engine's mutex guards it, as it guards the block pool.
type kvHolds struct {
	max     int
	timeout time.Duration
	pool    *blockPool
	stats   *counters
	byKey   map[string]*list.Element // of *heldKV
	order   *list.List               // of *heldKV, oldest first
	// changed is closed and replaced by every add, waking the pulls that wait for a room.
	changed chan struct{}
}

// heldKV is one held prefill.
type heldKV struct {
	key       string
	blocks    []*block
	ids       []int
	promptLen int
	digest    uint64 // promptDigest of the prompt it prefilled
	expires   time.Time
}

func newKVHolds(max int, timeout time.Duration, pool *blockPool, stats *counters) *kvHolds {
	return &kvHolds{
		max: max, timeout: timeout, pool: pool, stats: stats,
		byKey:   make(map[string]*list.Element),
		order:   list.New(),
		changed: make(chan struct{}),
	}
}

// add holds blocks under key from now and returns their ids. A hold already under key is freed
// first (the newer prefill of the same room wins), and so are the oldest past max.
func (h *kvHolds) add(key string, blocks []*block, promptLen int, digest uint64, now time.Time) []int {
	if el, ok := h.byKey[key]; ok {
		h.drop(el, true)
	}
	h.sweep(now)
	for h.order.Len() >= h.max {
		h.drop(h.order.Front(), true)
	}
	ids := make([]int, len(blocks))
	for i, b := range blocks {
		ids[i] = b.id
	}
	h.byKey[key] = h.order.PushBack(&heldKV{
		key: key, blocks: blocks, ids: ids, promptLen: promptLen, digest: digest,
		expires: now.Add(h.timeout),
	})
	h.stats.held.Store(int64(h.order.Len()))
	close(h.changed)
	h.changed = make(chan struct{})
	return ids
}

// take removes the hold under key and frees its blocks, if it exists, has not expired at now
// and match accepts it; it returns the hold, or nil and why not. A hold match refuses is kept.
func (h *kvHolds) take(key string, now time.Time, match func(*heldKV) error) (*heldKV, error) {
	h.sweep(now)
	el, ok := h.byKey[key]
	if !ok {
		return nil, errTransferUnknown
	}
	held := el.Value.(*heldKV)
	if err := match(held); err != nil {
		return nil, err
	}
	h.drop(el, false)
	return held, nil
}

// has reports whether a hold is under key.
func (h *kvHolds) has(key string) bool {
	_, ok := h.byKey[key]
	return ok
}

// sweep frees every hold expired at now.
func (h *kvHolds) sweep(now time.Time) {
	for el := h.order.Front(); el != nil && !now.Before(el.Value.(*heldKV).expires); el = h.order.Front() {
		h.drop(el, true)
	}
}

// next is when the oldest hold expires; zero when nothing is held.
func (h *kvHolds) next() time.Time {
	if el := h.order.Front(); el != nil {
		return el.Value.(*heldKV).expires
	}
	return time.Time{}
}

// drop removes a hold and frees its blocks; unpulled counts it as expired.
func (h *kvHolds) drop(el *list.Element, unpulled bool) {
	held := h.order.Remove(el).(*heldKV)
	delete(h.byKey, held.key)
	h.pool.release(held.blocks)
	held.blocks = nil
	if unpulled {
		h.stats.heldExpired.Add(1)
	}
	h.stats.held.Store(int64(h.order.Len()))
}
