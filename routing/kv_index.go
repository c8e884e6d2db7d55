package routing

import (
	"encoding/binary"
	"hash/maphash"
	"math/bits"
)

// kvIndex is what one worker's engine holds in its KV cache, from its events: each held block
// under OUR key, a chained hash of its token ids (kvBlockKey of the parent's key and the block's
// tokens), so the engine's own hash function (seeded, versioned, salted) never needs
// reproducing; the engine's hashes map to ours, for the parents of later stores and for
// removals.
//
// Cost: applying a block stored or removed is one hash of its tokens and two probes of flat
// open-addressing tables; a match is one probe per block. Nothing allocates but the growth of a
// table, which doubles, so a batch allocates nothing once the index has reached its size.
//
// Memory is bounded: past maxBlocks, the blocks stored first are forgotten first (an engine
// evicts least recently used, which the index approximates by insertion order). That is at most
// about 160 bytes a block: 48 in the two tables' slots, which are 3/8 to 3/4 full, and up to 32
// in the insertion order. A kvIndex is not safe for concurrent use; kvWorker guards it.
type kvIndex struct {
	blockSize int // of the engine; 0 until the first BlockStored
	// fixed: blockSize was configured; stores of another size are dropped, not adopted.
	fixed     bool
	maxBlocks int
	// byEngine maps an engine block hash to our key and the insertion number of that mapping.
	byEngine kvTable[kvEntry]
	// held counts, for each of our keys, the engine blocks holding that content.
	held kvTable[int32]
	// order is the engine hashes in insertion order, from head on; entries whose number no
	// longer matches byEngine are stale.
	order []kvOrder
	head  int
	next  uint64
	// orphans counts stored blocks dropped because their parent was unknown (a missed event).
	orphans int64
}

type kvEntry struct {
	ours uint64
	n    uint64
}

type kvOrder struct {
	key uint64
	n   uint64
}

func newKVIndex(blockSize, maxBlocks int) *kvIndex {
	return &kvIndex{blockSize: blockSize, fixed: blockSize > 0, maxBlocks: maxBlocks}
}

// kvRoot is the chain key before a prompt's first block.
const kvRoot uint64 = 0x6a09e667f3bcc908

// kvMix folds v into h with a 64-bit finalizer, so every input bit spreads.
func kvMix(h, v uint64) uint64 {
	h ^= v + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// kvSeed seeds our block keys. Keys never leave the process, so a seed of its own is enough,
// and a client cannot aim a prompt at another's key.
var kvSeed = maphash.MakeSeed()

// kvHasher computes block keys; it keeps the bytes of one block between calls, so hashing
// allocates nothing once it has seen the largest block. Not safe for concurrent use.
type kvHasher struct {
	buf []byte
}

// blockKey is our key of a block of tokens after the block whose key is parent: equal keys mean
// equal whole prefixes (to 64 bits). Costs about a nanosecond a token.
func (k *kvHasher) blockKey(parent uint64, tokens []uint64) uint64 {
	n := 8 * len(tokens)
	if cap(k.buf) < n {
		k.buf = make([]byte, n)
	}
	b := k.buf[:n]
	for i, t := range tokens {
		binary.LittleEndian.PutUint64(b[8*i:], t)
	}
	return kvBlockKey(parent, b)
}

// kvBlockKey is blockKey of the tokens given as 8 little-endian bytes each.
func kvBlockKey(parent uint64, tokens []byte) uint64 {
	return kvMix(parent, maphash.Bytes(kvSeed, tokens))
}

// blockKeys appends to dst the keys of the leading full blocks of bs tokens of tokens.
func (k *kvHasher) blockKeys(dst, tokens []uint64, bs int) []uint64 {
	if bs <= 0 {
		return dst
	}
	h := kvRoot
	for n := 0; (n+1)*bs <= len(tokens); n++ {
		h = k.blockKey(h, tokens[n*bs:(n+1)*bs])
		dst = append(dst, h)
	}
	return dst
}

// apply updates the index with every event of b. Costs O(tokens + hashes) of the batch, plus
// the forgetting of as many blocks when the index is full.
func (x *kvIndex) apply(b *kvBatch) {
	for i := range b.events {
		ev := &b.events[i]
		switch ev.kind {
		case kvStored:
			if !ev.skip {
				x.store(ev)
			}
		case kvRemoved:
			if !ev.skip {
				for _, h := range ev.hashes {
					x.remove(h)
				}
			}
		case kvCleared:
			x.clear()
		}
	}
}

func (x *kvIndex) store(ev *kvEvent) {
	if x.blockSize != ev.blockSize && x.fixed {
		x.orphans += int64(len(ev.hashes))
		return
	}
	if x.blockSize != ev.blockSize {
		// Another block size: the worker restarted with another configuration, or the
		// configured size was wrong. What was indexed under the old size never matches again.
		x.clear()
		x.blockSize = ev.blockSize
	}
	parent := kvRoot
	if ev.hasParent {
		i := x.byEngine.find(ev.parent)
		if i < 0 {
			x.orphans += int64(len(ev.hashes))
			return
		}
		parent = x.byEngine.at(i).ours
	}
	bs := 8 * ev.blockSize // bytes
	for i, h := range ev.hashes {
		if (i+1)*bs > len(ev.tokens) {
			x.orphans += int64(len(ev.hashes) - i)
			break
		}
		ours := kvBlockKey(parent, ev.tokens[i*bs:(i+1)*bs])
		parent = ours
		s, dup := x.byEngine.upsert(h)
		e := x.byEngine.at(s)
		if dup {
			if e.ours == ours {
				continue
			}
			x.unhold(e.ours)
		}
		x.next++
		*e = kvEntry{ours: ours, n: x.next}
		c, _ := x.held.upsert(ours)
		*x.held.at(c)++
		x.order = append(x.order, kvOrder{key: h, n: x.next})
	}
	for x.byEngine.len() > x.maxBlocks {
		o := x.order[x.head]
		x.order[x.head] = kvOrder{}
		x.head++
		if i := x.byEngine.find(o.key); i >= 0 && x.byEngine.at(i).n == o.n {
			x.unhold(x.byEngine.at(i).ours)
			x.byEngine.deleteAt(i)
		}
	}
	if x.head > len(x.order)/2 && x.head > 1024 || len(x.order) > 2*x.maxBlocks+1024 {
		x.compact()
	}
}

// compact drops the stale and consumed entries of order, so it stays within a small multiple of
// the blocks held.
func (x *kvIndex) compact() {
	live := x.order[:0]
	for _, o := range x.order[x.head:] {
		if i := x.byEngine.find(o.key); i >= 0 && x.byEngine.at(i).n == o.n {
			live = append(live, o)
		}
	}
	clear(x.order[len(live):])
	x.order, x.head = live, 0
}

func (x *kvIndex) remove(h uint64) {
	i := x.byEngine.find(h)
	if i < 0 {
		return
	}
	x.unhold(x.byEngine.at(i).ours)
	x.byEngine.deleteAt(i)
}

// unhold counts one engine block fewer holding ours.
func (x *kvIndex) unhold(ours uint64) {
	i := x.held.find(ours)
	if i < 0 {
		return
	}
	if c := x.held.at(i); *c > 1 {
		*c--
		return
	}
	x.held.deleteAt(i)
}

func (x *kvIndex) clear() {
	x.byEngine.reset()
	x.held.reset()
	x.order, x.head = nil, 0
}

// blocks returns the number of engine blocks indexed.
func (x *kvIndex) blocks() int { return x.byEngine.len() }

// matchKeys returns the number of leading blocks of a prompt, given by their keys (see
// kvHasher.blockKeys, for this index's blockSize), that the worker holds. Costs one probe per
// block matched, and allocates nothing.
func (x *kvIndex) matchKeys(keys []uint64) int {
	for n, k := range keys {
		if x.held.find(k) < 0 {
			return n
		}
	}
	return len(keys)
}

// kvTable is a hash table from uint64 keys to V for the index's hot path: open addressing with
// linear probing and backward-shift deletion (no tombstones), so a lookup, an insert and a
// delete are each one short scan of adjacent slots, usually within one cache line. It grows by
// doubling at three quarters full and never shrinks but on reset. The zero value is empty and
// ready. Slot numbers (find, upsert) are valid until the next upsert or deleteAt.
type kvTable[V any] struct {
	slots []kvSlot[V]
	count int
	shift uint8 // 64 - log2(len(slots))
}

type kvSlot[V any] struct {
	key  uint64
	val  V
	used bool
}

const kvTableMin = 64

// home is the slot where key's probe starts (Fibonacci hashing, so sequential keys spread).
func (t *kvTable[V]) home(key uint64) int {
	return int((key * 0x9e3779b97f4a7c15) >> t.shift)
}

func (t *kvTable[V]) len() int { return t.count }

func (t *kvTable[V]) at(i int) *V { return &t.slots[i].val }

// find returns the slot of key, or -1.
func (t *kvTable[V]) find(key uint64) int {
	if t.count == 0 {
		return -1
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.used {
			return -1
		}
		if s.key == key {
			return i
		}
	}
}

// upsert returns the slot of key, adding it with a zero value unless existed.
func (t *kvTable[V]) upsert(key uint64) (slot int, existed bool) {
	if 4*(t.count+1) > 3*len(t.slots) {
		t.grow()
	}
	mask := len(t.slots) - 1
	for i := t.home(key); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if !s.used {
			*s = kvSlot[V]{key: key, used: true}
			t.count++
			return i, false
		}
		if s.key == key {
			return i, true
		}
	}
}

func (t *kvTable[V]) grow() {
	old := t.slots
	n := max(2*len(old), kvTableMin)
	t.slots = make([]kvSlot[V], n)
	t.shift = uint8(64 - bits.Len(uint(n-1)))
	mask := n - 1
	for _, s := range old {
		if !s.used {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].used {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// deleteAt empties slot i and moves back the entries after it whose probe passed over it.
func (t *kvTable[V]) deleteAt(i int) {
	mask := len(t.slots) - 1
	for j := (i + 1) & mask; t.slots[j].used; j = (j + 1) & mask {
		h := t.home(t.slots[j].key)
		// The entry at j stays unless its home is cyclically outside (i, j].
		if i <= j && i < h && h <= j || i > j && (i < h || h <= j) {
			continue
		}
		t.slots[i] = t.slots[j]
		i = j
	}
	t.slots[i] = kvSlot[V]{}
	t.count--
}

// reset empties t and gives its memory back.
func (t *kvTable[V]) reset() { *t = kvTable[V]{} }
