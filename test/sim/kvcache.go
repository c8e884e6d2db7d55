package sim

// block is one KV-cache block of blockSize token slots.
//
// A block is in one of three states: referenced (ref > 0, owned by one or more running
// sequences), cached-free (ref == 0, hashed: its content is still valid and a later request
// with the same prefix may take it back) or empty-free (ref == 0, not hashed). Free blocks sit
// in the pool's free queue; the head is reused first.
type block struct {
	id     int // its index in the pool: what vLLM's kv_transfer_params call a block id
	ref    int
	hash   uint64
	hashed bool
	// prev and next link the block into the free queue; both nil when it is not queued.
	prev, next *block
	queued     bool
}

// blockPool is the KV cache of one engine: a fixed number of blocks, a map from block hash to
// the block holding that content (the prefix cache), and a free queue in eviction order.
//
// Eviction is LRU over unreferenced blocks: a block freed by a finished sequence goes to the
// tail of the free queue (sequences free their blocks last block first, so a prefix's deeper
// blocks are evicted before its shallower ones, as in vLLM), an empty block goes to the head,
// and allocation takes from the head, dropping the hash of a cached block it reuses.
//
// A blockPool is not safe for concurrent use; the Engine guards it with its mutex. Every
// operation costs O(blocks touched).
type blockPool struct {
	blockSize int
	blocks    []block
	// head and tail are sentinels of the doubly-linked free queue.
	head, tail block
	nfree      int
	cached     map[uint64]*block
	evictions  int64
	// events, when not nil, receives the pool's KV events (BlockRemoved, AllBlocksCleared; the
	// scheduler adds BlockStored, which needs the tokens).
	events *kvEventLog
}

func newBlockPool(numBlocks, blockSize int) *blockPool {
	p := &blockPool{
		blockSize: blockSize,
		blocks:    make([]block, numBlocks),
		cached:    make(map[uint64]*block),
	}
	p.head.next = &p.tail
	p.tail.prev = &p.head
	for i := range p.blocks {
		p.blocks[i].id = i
		p.pushTail(&p.blocks[i])
	}
	return p
}

func (p *blockPool) pushTail(b *block) {
	last := p.tail.prev
	b.prev, b.next = last, &p.tail
	last.next = b
	p.tail.prev = b
	b.queued = true
	p.nfree++
}

func (p *blockPool) pushHead(b *block) {
	first := p.head.next
	b.prev, b.next = &p.head, first
	first.prev = b
	p.head.next = b
	b.queued = true
	p.nfree++
}

func (p *blockPool) unlink(b *block) {
	b.prev.next = b.next
	b.next.prev = b.prev
	b.prev, b.next = nil, nil
	b.queued = false
	p.nfree--
}

// numBlocks is the pool's capacity in blocks.
func (p *blockPool) numBlocks() int { return len(p.blocks) }

// usage is the fraction of blocks referenced by running sequences, in [0, 1], as vLLM reports
// kv_cache_usage_perc: cached-free blocks count as free.
func (p *blockPool) usage() float64 {
	return 1 - float64(p.nfree)/float64(len(p.blocks))
}

// longestHit returns the cached blocks holding the longest prefix of hashes.
func (p *blockPool) longestHit(hashes []uint64) []*block {
	var hit []*block
	for _, h := range hashes {
		b, ok := p.cached[h]
		if !ok {
			break
		}
		hit = append(hit, b)
	}
	return hit
}

// freeAmong counts the blocks of blks that are in the free queue: taking them as a cache hit
// removes them from what allocate can use.
func freeAmong(blks []*block) int {
	n := 0
	for _, b := range blks {
		if b.ref == 0 {
			n++
		}
	}
	return n
}

// touch takes a reference on each block of a cache hit, taking free ones out of the queue.
func (p *blockPool) touch(blks []*block) {
	for _, b := range blks {
		if b.ref == 0 && b.queued {
			p.unlink(b)
		}
		b.ref++
	}
}

// allocate takes n blocks from the head of the free queue, evicting the cached content of any
// it takes. It returns nil and takes nothing when fewer than n blocks are free.
func (p *blockPool) allocate(n int) []*block {
	if n > p.nfree {
		return nil
	}
	out := make([]*block, n)
	for i := range out {
		b := p.head.next
		p.unlink(b)
		if b.hashed {
			delete(p.cached, b.hash)
			if p.events != nil {
				p.events.add(kvEvent{kind: "BlockRemoved", hashes: []uint64{b.hash}})
			}
			b.hashed, b.hash = false, 0
			p.evictions++
		}
		b.ref = 1
		out[i] = b
	}
	return out
}

// release drops one reference on each block, last block first, queueing the ones nobody holds.
func (p *blockPool) release(blks []*block) {
	for i := len(blks) - 1; i >= 0; i-- {
		b := blks[i]
		b.ref--
		if b.ref > 0 {
			continue
		}
		if b.hashed {
			p.pushTail(b)
		} else {
			p.pushHead(b)
		}
	}
}

// cache records that b holds the full block whose chained hash is h, and reports whether it is
// new in the prefix cache. If another block already holds that content, b stays unhashed: the
// first copy serves later hits.
func (p *blockPool) cache(b *block, h uint64) bool {
	if b.hashed {
		return false
	}
	if _, dup := p.cached[h]; dup {
		return false
	}
	b.hash, b.hashed = h, true
	p.cached[h] = b
	return true
}

// reset empties the prefix cache, as vLLM's POST /reset_prefix_cache: every cached block
// forgets its content (blocks in use keep serving their sequences, uncached).
func (p *blockPool) reset() {
	for i := range p.blocks {
		b := &p.blocks[i]
		if b.hashed {
			b.hashed, b.hash = false, 0
		}
	}
	clear(p.cached)
	if p.events != nil {
		p.events.add(kvEvent{kind: "AllBlocksCleared"})
	}
}
