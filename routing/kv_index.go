package routing

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// KV-cache events in vLLM's wire format (vllm/distributed/kv_events.py). A batch is a msgpack
// array [ts, events] (a third element, the data-parallel rank, may follow); each event is an
// array whose first element is its tag, the class name:
//
//	["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]
//	["BlockRemoved", block_hashes, medium]
//	["AllBlocksCleared"]
//
// Trailing fields equal to their default may be left out (msgspec's omit_defaults). A block
// hash is an integer or bytes, depending on the engine's version and hash function; it is only
// ever compared, never recomputed.
const (
	kvTagStored  = "BlockStored"
	kvTagRemoved = "BlockRemoved"
	kvTagCleared = "AllBlocksCleared"
)

// Bounds on one decoded batch, so a hostile or broken publisher cannot make the decoder allocate
// without limit.
const (
	kvMaxEvents = 1 << 16
	kvMaxHashes = 1 << 16
	kvMaxTokens = 1 << 22
)

var errKVBatch = errors.New("malformed kv event batch")

// kvEventKind says what a kvEvent does to a worker's index.
type kvEventKind uint8

const (
	kvStored  kvEventKind = iota + 1 // blocks were stored: index them
	kvRemoved                        // blocks were evicted: forget them
	kvCleared                        // every block went: empty the index
)

// kvEvent is one decoded event. Engine block hashes are kept as 64-bit keys (an integer as it
// is, bytes by their FNV-1a hash), only ever compared.
type kvEvent struct {
	kind      kvEventKind
	hashes    []uint64
	parent    uint64
	hasParent bool // false when the first block starts the prompt
	tokens    []uint64
	blockSize int
	// skip: the blocks are not the worker's GPU cache of the base model (a LoRA adapter's, or
	// another medium's such as CPU offload), which a prompt of the base model does not hit.
	skip bool
}

// kvBatch is one decoded batch; decodeKVBatch reuses its slices.
type kvBatch struct {
	events []kvEvent
}

// decodeKVBatch decodes payload into b, reusing b's slices. It bounds every length it reads.
func decodeKVBatch(payload []byte, b *kvBatch) error {
	d := msgpack.GetDecoder()
	defer msgpack.PutDecoder(d)
	d.Reset(bytes.NewReader(payload))
	n, err := d.DecodeArrayLen()
	if err != nil || n < 2 {
		return fmt.Errorf("%w: batch is not [ts, events]", errKVBatch)
	}
	if err := d.Skip(); err != nil { // ts
		return fmt.Errorf("%w: %v", errKVBatch, err)
	}
	ne, err := d.DecodeArrayLen()
	if err != nil || ne > kvMaxEvents {
		return fmt.Errorf("%w: events is not an array of at most %d", errKVBatch, kvMaxEvents)
	}
	b.events = b.events[:0]
	for range max(ne, 0) {
		if len(b.events) < cap(b.events) {
			b.events = b.events[:len(b.events)+1]
		} else {
			b.events = append(b.events, kvEvent{})
		}
		ev := &b.events[len(b.events)-1]
		*ev = kvEvent{hashes: ev.hashes[:0], tokens: ev.tokens[:0]} // an earlier batch's slices
		if err := decodeKVEvent(d, ev); err != nil {
			return err
		}
	}
	return nil
}

func decodeKVEvent(d *msgpack.Decoder, ev *kvEvent) error {
	n, err := d.DecodeArrayLen()
	if err != nil || n < 1 {
		return fmt.Errorf("%w: event is not a tagged array", errKVBatch)
	}
	tag, err := d.DecodeString()
	if err != nil {
		return fmt.Errorf("%w: event tag: %v", errKVBatch, err)
	}
	fields := n - 1
	field := func() bool { // whether one more field is present; counts it
		if fields == 0 {
			return false
		}
		fields--
		return true
	}
	switch tag {
	case kvTagStored:
		ev.kind = kvStored
		if !field() {
			return fmt.Errorf("%w: BlockStored without block_hashes", errKVBatch)
		}
		if ev.hashes, err = decodeKVHashes(d, ev.hashes); err != nil {
			return err
		}
		if field() {
			if ev.parent, ev.hasParent, err = decodeKVHash(d, true); err != nil {
				return err
			}
		}
		if !field() {
			return fmt.Errorf("%w: BlockStored without token_ids", errKVBatch)
		}
		nt, err := d.DecodeArrayLen()
		if err != nil || nt > kvMaxTokens {
			return fmt.Errorf("%w: token_ids is not an array of at most %d", errKVBatch, kvMaxTokens)
		}
		for range max(nt, 0) {
			t, err := d.DecodeUint64()
			if err != nil {
				return fmt.Errorf("%w: token id: %v", errKVBatch, err)
			}
			ev.tokens = append(ev.tokens, t)
		}
		if !field() {
			return fmt.Errorf("%w: BlockStored without block_size", errKVBatch)
		}
		bs, err := d.DecodeInt64()
		if err != nil || bs < 1 || bs > kvMaxTokens {
			return fmt.Errorf("%w: block_size must be a positive integer", errKVBatch)
		}
		ev.blockSize = int(bs)
		if field() { // lora_id
			if ev.skip, err = notNil(d); err != nil {
				return err
			}
		}
		if field() {
			if err := decodeKVMedium(d, ev); err != nil {
				return err
			}
		}
	case kvTagRemoved:
		ev.kind = kvRemoved
		if !field() {
			return fmt.Errorf("%w: BlockRemoved without block_hashes", errKVBatch)
		}
		if ev.hashes, err = decodeKVHashes(d, ev.hashes); err != nil {
			return err
		}
		if field() {
			if err := decodeKVMedium(d, ev); err != nil {
				return err
			}
		}
	case kvTagCleared:
		ev.kind = kvCleared
	default:
		return fmt.Errorf("%w: unknown event %q", errKVBatch, tag)
	}
	for ; fields > 0; fields-- { // fields of a later engine version
		if err := d.Skip(); err != nil {
			return fmt.Errorf("%w: %v", errKVBatch, err)
		}
	}
	return nil
}

// notNil reads one value and reports whether it was anything but nil.
func notNil(d *msgpack.Decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, fmt.Errorf("%w: %v", errKVBatch, err)
	}
	if err := d.Skip(); err != nil {
		return false, fmt.Errorf("%w: %v", errKVBatch, err)
	}
	return c != msgpcode.Nil, nil
}

// decodeKVMedium marks ev skipped unless its medium is nil or "GPU" (vLLM's default cache).
func decodeKVMedium(d *msgpack.Decoder, ev *kvEvent) error {
	c, err := d.PeekCode()
	if err != nil {
		return fmt.Errorf("%w: %v", errKVBatch, err)
	}
	if c == msgpcode.Nil {
		return d.Skip()
	}
	m, err := d.DecodeString()
	if err != nil {
		return fmt.Errorf("%w: medium: %v", errKVBatch, err)
	}
	if m != "GPU" {
		ev.skip = true
	}
	return nil
}

func decodeKVHashes(d *msgpack.Decoder, dst []uint64) ([]uint64, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n > kvMaxHashes {
		return dst, fmt.Errorf("%w: block_hashes is not an array of at most %d", errKVBatch, kvMaxHashes)
	}
	for range max(n, 0) {
		h, _, err := decodeKVHash(d, false)
		if err != nil {
			return dst, err
		}
		dst = append(dst, h)
	}
	return dst, nil
}

// decodeKVHash reads one engine block hash (an integer or bytes; nil only where orNil, then ok
// is false) as a key.
func decodeKVHash(d *msgpack.Decoder, orNil bool) (key uint64, ok bool, err error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, fmt.Errorf("%w: %v", errKVBatch, err)
	}
	switch {
	case c == msgpcode.Nil && orNil:
		return 0, false, d.Skip()
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		n, err := d.DecodeBytesLen()
		var buf [64]byte
		if err != nil || n < 1 || n > len(buf) {
			return 0, false, fmt.Errorf("%w: block hash of bytes must hold 1 to 64 of them", errKVBatch)
		}
		if err := d.ReadFull(buf[:n]); err != nil {
			return 0, false, fmt.Errorf("%w: %v", errKVBatch, err)
		}
		h := uint64(14695981039346656037)
		for _, b := range buf[:n] {
			h = (h ^ uint64(b)) * 1099511628211
		}
		return h, true, nil
	default:
		u, err := d.DecodeUint64() // a negative integer keeps its two's complement bits
		if err != nil {
			return 0, false, fmt.Errorf("%w: block hash: %v", errKVBatch, err)
		}
		return u, true, nil
	}
}

// kvIndex is what one worker's engine holds in its KV cache, from its events: each held block
// under OUR chained hash of its token ids (chainHash of the parent's and the block's tokens), so
// the engine's own hash function (seeded, versioned, salted) never needs reproducing; the
// engine's hashes map to ours, for the parents of later stores and for removals.
//
// Memory is bounded: past maxBlocks, the blocks stored first are forgotten first (an engine
// evicts least recently used, which the index approximates by insertion order). A kvIndex is not
// safe for concurrent use; kvWorker guards it.
type kvIndex struct {
	blockSize int // of the engine; 0 until the first BlockStored
	// fixed: blockSize was configured; stores of another size are dropped, not adopted.
	fixed     bool
	maxBlocks int
	// byEngine maps an engine block hash to our hash and the insertion number of that mapping.
	byEngine map[uint64]kvEntry
	// held counts, for each of our hashes, the engine blocks holding that content.
	held map[uint64]int32
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
	return &kvIndex{
		blockSize: blockSize,
		fixed:     blockSize > 0,
		maxBlocks: maxBlocks,
		byEngine:  make(map[uint64]kvEntry),
		held:      make(map[uint64]int32),
	}
}

// kvRoot is the chain hash before a prompt's first block.
const kvRoot uint64 = 0x6a09e667f3bcc908

// kvMix folds v into h with a 64-bit finalizer, so every input bit spreads.
func kvMix(h, v uint64) uint64 {
	h ^= v + 0x9e3779b97f4a7c15 + (h << 6) + (h >> 2)
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return h
}

// chainHash is our hash of a block of tokens after the block whose hash is parent: equal hashes
// mean equal whole prefixes (to 64 bits).
func chainHash(parent uint64, tokens []uint64) uint64 {
	h := kvMix(parent, uint64(len(tokens)))
	for _, t := range tokens {
		h = kvMix(h, t)
	}
	return h
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
		e, ok := x.byEngine[ev.parent]
		if !ok {
			x.orphans += int64(len(ev.hashes))
			return
		}
		parent = e.ours
	}
	bs := ev.blockSize
	for i, h := range ev.hashes {
		if (i+1)*bs > len(ev.tokens) {
			x.orphans += int64(len(ev.hashes) - i)
			return
		}
		ours := chainHash(parent, ev.tokens[i*bs:(i+1)*bs])
		if old, dup := x.byEngine[h]; dup {
			if old.ours == ours {
				parent = ours
				continue
			}
			x.remove(h)
		}
		x.next++
		x.byEngine[h] = kvEntry{ours: ours, n: x.next}
		x.held[ours]++
		x.order = append(x.order, kvOrder{key: h, n: x.next})
		parent = ours
	}
	for len(x.byEngine) > x.maxBlocks {
		o := x.order[x.head]
		x.order[x.head] = kvOrder{}
		x.head++
		if e, ok := x.byEngine[o.key]; ok && e.n == o.n {
			x.remove(o.key)
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
		if e, ok := x.byEngine[o.key]; ok && e.n == o.n {
			live = append(live, o)
		}
	}
	clear(x.order[len(live):])
	x.order, x.head = live, 0
}

func (x *kvIndex) remove(h uint64) {
	e, ok := x.byEngine[h]
	if !ok {
		return
	}
	delete(x.byEngine, h)
	if x.held[e.ours]--; x.held[e.ours] <= 0 {
		delete(x.held, e.ours)
	}
}

func (x *kvIndex) clear() {
	clear(x.byEngine)
	clear(x.held)
	x.order, x.head = nil, 0
}

// blocks returns the number of engine blocks indexed.
func (x *kvIndex) blocks() int { return len(x.byEngine) }

// match returns the number of leading full blocks of tokens the worker holds. Costs one hash per
// token of the matched blocks and one map lookup per block, and allocates nothing.
func (x *kvIndex) match(tokens []uint64) int {
	bs := x.blockSize
	if bs <= 0 {
		return 0
	}
	h := kvRoot
	n := 0
	for (n+1)*bs <= len(tokens) {
		h = chainHash(h, tokens[n*bs:(n+1)*bs])
		if x.held[h] == 0 {
			break
		}
		n++
	}
	return n
}
