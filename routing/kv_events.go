package routing

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
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
	// kvMaxDepth bounds the nesting of a value skipped unread (a field of a later version).
	kvMaxDepth = 32
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
	// tokens are the token ids, 8 little-endian bytes each: the bytes our block keys hash
	// (kvBlockKey), so a store hashes them as they are.
	tokens    []byte
	blockSize int
	// skip: the blocks are not the worker's GPU cache of the base model (a LoRA adapter's, or
	// another medium's such as CPU offload), which a prompt of the base model does not hit.
	skip bool
}

// kvBatch is one decoded batch; decodeKVBatch reuses its slices.
type kvBatch struct {
	events []kvEvent
}

// decodeKVBatch decodes payload into b, reusing b's slices. It bounds every length it reads,
// and allocates only to grow b's slices past the largest batch seen. Costs O(len(payload)).
func decodeKVBatch(payload []byte, b *kvBatch) error {
	d := kvDecoder{buf: payload}
	n, err := d.arrayLen()
	if err != nil || n < 2 {
		return fmt.Errorf("%w: batch is not [ts, events]", errKVBatch)
	}
	if err := d.skip(0); err != nil { // ts
		return err
	}
	ne, err := d.arrayLen()
	if err != nil || ne > kvMaxEvents {
		return fmt.Errorf("%w: events is not an array of at most %d", errKVBatch, kvMaxEvents)
	}
	b.events = b.events[:0]
	for range ne {
		if len(b.events) < cap(b.events) {
			b.events = b.events[:len(b.events)+1]
		} else {
			b.events = append(b.events, kvEvent{})
		}
		ev := &b.events[len(b.events)-1]
		*ev = kvEvent{hashes: ev.hashes[:0], tokens: ev.tokens[:0]} // an earlier batch's slices
		if err := d.event(ev); err != nil {
			return err
		}
	}
	return nil
}

func (d *kvDecoder) event(ev *kvEvent) error {
	n, err := d.arrayLen()
	if err != nil || n < 1 {
		return fmt.Errorf("%w: event is not a tagged array", errKVBatch)
	}
	tag, err := d.bytes()
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
	switch string(tag) {
	case kvTagStored:
		ev.kind = kvStored
		if !field() {
			return fmt.Errorf("%w: BlockStored without block_hashes", errKVBatch)
		}
		if ev.hashes, err = d.hashes(ev.hashes); err != nil {
			return err
		}
		if field() {
			if ev.parent, ev.hasParent, err = d.hash(true); err != nil {
				return err
			}
		}
		if !field() {
			return fmt.Errorf("%w: BlockStored without token_ids", errKVBatch)
		}
		nt, err := d.arrayLen()
		if err != nil || nt > kvMaxTokens {
			return fmt.Errorf("%w: token_ids is not an array of at most %d", errKVBatch, kvMaxTokens)
		}
		if ev.tokens, err = d.tokenBytes(ev.tokens, nt); err != nil {
			return fmt.Errorf("%w: token id: %v", errKVBatch, err)
		}
		if !field() {
			return fmt.Errorf("%w: BlockStored without block_size", errKVBatch)
		}
		bs, err := d.uint()
		if err != nil || bs < 1 || bs > kvMaxTokens {
			return fmt.Errorf("%w: block_size must be a positive integer", errKVBatch)
		}
		ev.blockSize = int(bs)
		if field() { // lora_id
			if ev.skip, err = d.notNil(); err != nil {
				return err
			}
		}
		if field() {
			if err := d.medium(ev); err != nil {
				return err
			}
		}
	case kvTagRemoved:
		ev.kind = kvRemoved
		if !field() {
			return fmt.Errorf("%w: BlockRemoved without block_hashes", errKVBatch)
		}
		if ev.hashes, err = d.hashes(ev.hashes); err != nil {
			return err
		}
		if field() {
			if err := d.medium(ev); err != nil {
				return err
			}
		}
	case kvTagCleared:
		ev.kind = kvCleared
	default:
		return fmt.Errorf("%w: unknown event %q", errKVBatch, tag)
	}
	for ; fields > 0; fields-- { // fields of a later engine version
		if err := d.skip(0); err != nil {
			return err
		}
	}
	return nil
}

// notNil reads one value and reports whether it was anything but nil.
func (d *kvDecoder) notNil() (bool, error) {
	c, err := d.peek()
	if err != nil {
		return false, err
	}
	return c != mpNil, d.skip(0)
}

// medium marks ev skipped unless its medium is nil or "GPU" (vLLM's default cache).
func (d *kvDecoder) medium(ev *kvEvent) error {
	c, err := d.peek()
	if err != nil {
		return err
	}
	if c == mpNil {
		d.pos++
		return nil
	}
	m, err := d.bytes()
	if err != nil {
		return fmt.Errorf("%w: medium: %v", errKVBatch, err)
	}
	if string(m) != "GPU" {
		ev.skip = true
	}
	return nil
}

func (d *kvDecoder) hashes(dst []uint64) ([]uint64, error) {
	n, err := d.arrayLen()
	if err != nil || n > kvMaxHashes {
		return dst, fmt.Errorf("%w: block_hashes is not an array of at most %d", errKVBatch, kvMaxHashes)
	}
	var le [8 * 32]byte // integers (vLLM's default) a chunk at a time, through putUints
	for n > 0 {
		chunk := le[:8*min(n, len(le)/8)]
		put, next := putUints(chunk, d.buf, d.pos)
		d.pos, n = next, n-put/8
		for i := 0; i < put; i += 8 {
			dst = append(dst, binary.LittleEndian.Uint64(le[i:i+8]))
		}
		if put < len(chunk) { // bytes, or the end of the payload
			h, _, err := d.hash(false)
			if err != nil {
				return dst, err
			}
			dst = append(dst, h)
			n--
		}
	}
	return dst, nil
}

// hash reads one engine block hash (an integer or bytes; nil only where orNil, then ok is
// false) as a key.
func (d *kvDecoder) hash(orNil bool) (key uint64, ok bool, err error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c == mpNil && orNil:
		d.pos++
		return 0, false, nil
	case isMPBytes(c):
		b, err := d.bytes()
		if err != nil || len(b) < 1 || len(b) > 64 {
			return 0, false, fmt.Errorf("%w: block hash of bytes must hold 1 to 64 of them", errKVBatch)
		}
		h := uint64(14695981039346656037)
		for _, c := range b {
			h = (h ^ uint64(c)) * 1099511628211
		}
		return h, true, nil
	default:
		u, err := d.uint() // a negative integer keeps its two's complement bits
		if err != nil {
			return 0, false, fmt.Errorf("%w: block hash: %v", errKVBatch, err)
		}
		return u, true, nil
	}
}

// kvDecoder reads msgpack from buf, the few types the events use, without copying: it is a
// cursor, and every method bounds what it reads by what is left.
type kvDecoder struct {
	buf []byte
	pos int
}

// msgpack type codes (github.com/msgpack/msgpack/blob/master/spec.md).
const (
	mpNil     = 0xc0
	mpFalse   = 0xc2
	mpTrue    = 0xc3
	mpBin8    = 0xc4
	mpBin16   = 0xc5
	mpBin32   = 0xc6
	mpExt8    = 0xc7
	mpExt16   = 0xc8
	mpExt32   = 0xc9
	mpFloat32 = 0xca
	mpFloat64 = 0xcb
	mpUint8   = 0xcc
	mpUint16  = 0xcd
	mpUint32  = 0xce
	mpUint64  = 0xcf
	mpInt8    = 0xd0
	mpInt16   = 0xd1
	mpInt32   = 0xd2
	mpInt64   = 0xd3
	mpFixExt1 = 0xd4
	mpStr8    = 0xd9
	mpStr16   = 0xda
	mpStr32   = 0xdb
	mpArray16 = 0xdc
	mpArray32 = 0xdd
	mpMap16   = 0xde
	mpMap32   = 0xdf
)

var errKVShort = fmt.Errorf("%w: truncated", errKVBatch)

func isMPBytes(c byte) bool {
	return c >= 0xa0 && c <= 0xbf || c >= mpBin8 && c <= mpBin32 || c >= mpStr8 && c <= mpStr32
}

func (d *kvDecoder) peek() (byte, error) {
	if d.pos >= len(d.buf) {
		return 0, errKVShort
	}
	return d.buf[d.pos], nil
}

// big reads an n-byte big-endian unsigned integer (n of 1, 2, 4 or 8).
func (d *kvDecoder) big(n int) (uint64, error) {
	if len(d.buf)-d.pos < n {
		return 0, errKVShort
	}
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

// uint reads an integer of any width; a negative one keeps its two's complement bits.
func (d *kvDecoder) uint() (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	d.pos++
	switch {
	case c <= 0x7f:
		return uint64(c), nil
	case c >= 0xe0:
		return uint64(int64(int8(c))), nil
	case c >= mpUint8 && c <= mpUint64:
		return d.big(1 << (c - mpUint8))
	case c >= mpInt8 && c <= mpInt64:
		n := 1 << (c - mpInt8)
		u, err := d.big(n)
		if err != nil {
			return 0, err
		}
		shift := 64 - 8*n // sign-extend
		return uint64(int64(u<<shift) >> shift), nil
	}
	d.pos--
	return 0, fmt.Errorf("%w: want an integer, got code %#x", errKVBatch, c)
}

// tokenBytes appends n integers to dst, 8 little-endian bytes each: putUints's widths in its
// tight loop, any other (negative ones, the last few bytes of the payload) through uint.
func (d *kvDecoder) tokenBytes(dst []byte, n int) ([]byte, error) {
	if n > len(d.buf)-d.pos { // each takes a byte at least
		return dst, errKVShort
	}
	base := len(dst)
	dst = slices.Grow(dst, 8*n)[:base+8*n]
	for out := dst[base:]; len(out) > 0; out = out[8:] {
		var put int
		put, d.pos = putUints(out, d.buf, d.pos)
		if out = out[put:]; len(out) == 0 {
			break
		}
		v, err := d.uint()
		if err != nil {
			return dst[:len(dst)-len(out)], err
		}
		binary.LittleEndian.PutUint64(out, v)
	}
	return dst, nil
}

// putUints reads integers from buf at pos into out, 8 little-endian bytes each, while they are
// of the widths msgpack encoders give ids and hashes (positive fixint, uint8 to uint64), 9
// bytes at least are left in buf (so that no width can run past its end), and out has room; it
// returns the bytes put and the position after the last integer read. It is the inner loop of
// reading token ids: no call in it, one bounds check an integer (a helper returning one
// integer, inlined, took 1.7 times as long).
func putUints(out, buf []byte, pos int) (put, next int) {
	for ; put+8 <= len(out) && pos >= 0 && len(buf)-pos >= 9; put += 8 {
		b := (*[9]byte)(buf[pos:])
		var v uint64
		switch b[0] {
		case mpUint16:
			v = uint64(b[1])<<8 | uint64(b[2])
			pos += 3
		case mpUint32:
			v = uint64(binary.BigEndian.Uint32(b[1:5]))
			pos += 5
		case mpUint8:
			v = uint64(b[1])
			pos += 2
		case mpUint64:
			v = binary.BigEndian.Uint64(b[1:9])
			pos += 9
		default:
			if b[0] > 0x7f {
				return put, pos
			}
			v = uint64(b[0])
			pos++
		}
		binary.LittleEndian.PutUint64(out[put:put+8], v)
	}
	return put, pos
}

func (d *kvDecoder) arrayLen() (int, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c >= 0x90 && c <= 0x9f:
		d.pos++
		return int(c - 0x90), nil
	case c == mpArray16 || c == mpArray32:
		d.pos++
		return d.length(2 << (c - mpArray16))
	}
	return 0, fmt.Errorf("%w: want an array, got code %#x", errKVBatch, c)
}

// length reads a w-byte length and checks that as many bytes are left at least (every element
// or byte takes one).
func (d *kvDecoder) length(w int) (int, error) {
	n, err := d.big(w)
	if err != nil {
		return 0, err
	}
	if n > uint64(len(d.buf)-d.pos) {
		return 0, errKVShort
	}
	return int(n), nil
}

// bytes reads a str or bin value and returns it, not copied.
func (d *kvDecoder) bytes() ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c >= 0xa0 && c <= 0xbf:
		d.pos++
		n = int(c - 0xa0)
	case c >= mpStr8 && c <= mpStr32:
		d.pos++
		n, err = d.length(1 << (c - mpStr8))
	case c >= mpBin8 && c <= mpBin32:
		d.pos++
		n, err = d.length(1 << (c - mpBin8))
	default:
		return nil, fmt.Errorf("%w: want a string, got code %#x", errKVBatch, c)
	}
	if err != nil {
		return nil, err
	}
	if len(d.buf)-d.pos < n {
		return nil, errKVShort
	}
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

// skip passes over one value of any type, nested at most kvMaxDepth deep.
func (d *kvDecoder) skip(depth int) error {
	if depth > kvMaxDepth {
		return fmt.Errorf("%w: nested deeper than %d", errKVBatch, kvMaxDepth)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	var elems, size int // values to skip after the header, bytes to pass
	switch {
	case c <= 0x7f || c >= 0xe0 || c == mpNil || c == mpFalse || c == mpTrue:
		d.pos++
		return nil
	case c >= 0x80 && c <= 0x8f:
		d.pos++
		elems = 2 * int(c-0x80)
	case c >= 0x90 && c <= 0x9f:
		d.pos++
		elems = int(c - 0x90)
	case c == mpArray16 || c == mpArray32 || c == mpMap16 || c == mpMap32:
		d.pos++
		w := 2
		if c == mpArray32 || c == mpMap32 {
			w = 4
		}
		if elems, err = d.length(w); err != nil {
			return err
		}
		if c == mpMap16 || c == mpMap32 {
			elems *= 2
		}
	case isMPBytes(c):
		_, err := d.bytes()
		return err
	case c == mpFloat32:
		d.pos++
		size = 4
	case c == mpFloat64:
		d.pos++
		size = 8
	case c >= mpUint8 && c <= mpUint64 || c >= mpInt8 && c <= mpInt64:
		_, err := d.uint()
		return err
	case c >= mpFixExt1 && c <= mpFixExt1+4:
		d.pos++
		size = 1 + 1<<(c-mpFixExt1)
	case c >= mpExt8 && c <= mpExt32:
		d.pos++
		n, err := d.length(1 << (c - mpExt8))
		if err != nil {
			return err
		}
		size = 1 + n
	default:
		return fmt.Errorf("%w: unknown code %#x", errKVBatch, c)
	}
	if len(d.buf)-d.pos < size {
		return errKVShort
	}
	d.pos += size
	for range elems {
		if err := d.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
