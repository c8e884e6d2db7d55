package routing

import (
	"bytes"
	"slices"
	"strings"
)

// radixTree is the approximate prefix tree of the cache_aware policy: for one model, which prompt
// prefixes each worker has prefilled lately, the way SGLang's router mirrors its workers' radix
// caches. There is one tree for all workers of the model; every node records which workers hold
// the prefix that ends at it, with each worker's last access.
//
// Prefixes are kept apart by cache scope (see CacheScope): each scope's prompts descend from a
// root of their own and never match another scope's prefixes, however alike the bytes. The
// global scope ("") has the tree's own root; every other scope gets a root with its first
// prefix and loses it with its last, so the roots cost nothing beyond the entries. A worker's
// entries of every scope are in its one LRU list and its one byte count, as they share its one
// engine cache.
//
// Tokens are bytes of the prompt. A byte tree needs no tokenizing pass and no token buffer (edge
// labels are compared as substrings of the prompt with the runtime's vectorised equality), it is exact about a shared
// prefix that ends inside a word, and a byte count tracks the worker's KV cache in model tokens
// closely enough (about 4 bytes a token) for a match ratio and a memory bound. SGLang's tree is
// keyed by characters for the same reasons.
//
// Invariants:
//   - A worker that holds a node holds every ancestor of it (holding is prefix-closed).
//   - A node held by no worker is not in the tree; so a node's holders are never empty and a
//     childless node is a leaf of somebody.
//   - In each worker's LRU list an ancestor is always more recent than its descendants, so the
//     least recent entry is a leaf for that worker and can be evicted alone.
//
// A radixTree is not safe for concurrent use: CacheAware serialises every access with its mutex.
// The zero value is not usable; call newRadixTree.
type radixTree struct {
	root    node             // the global scope's: label "", end 0, never held
	scopes  map[string]*node // the root of every other scope with prefixes, by its namespace
	none    node             // the root of a scope with no prefixes yet: never gets children
	slots   map[string]int32 // worker ID -> index in workers
	workers []*treeWorker    // by slot; nil for a released slot
	free    []int32          // released slots, reused before workers grows
	gen     uint64           // bumped when a slot is released, so cached slot maps are rebuilt
	limited int              // workers with a learned limit
	nodes   int              // nodes in the tree, root excluded
	labels  int64            // label bytes of those nodes (each counted once, however many hold it)
}

// treeWorker is the per-worker state of a radixTree.
type treeWorker struct {
	id    string
	bytes int64  // label bytes of the nodes this worker holds: what MaxBytesPerWorker bounds
	lru   holder // sentinel of a ring: lru.next is the most recent entry, lru.prev the least
	// absentSince is when CacheAware first found the worker missing from its snapshot (Unix
	// nanoseconds), 0 while it is present.
	absentSince int64
	// limit is the bytes the worker's engine was found to keep (CacheAware.learn), at most
	// MaxBytesPerWorker; 0 until the engine first proves the ceiling too large.
	limit int64
	// horizon: the worker's entries last accessed before it (Unix nanoseconds) are past its
	// limit, dropped by its engine; they are kept only as where their prefixes used to live.
	// 0 while limit is 0.
	horizon int64
}

// node is one edge of the tree and the prefix that ends with it.
type node struct {
	// label is the bytes of the edge from parent, never empty; a root (parent nil) has no
	// edge, and its label is the namespace of its scope, so the root can leave scopes with its
	// last child.
	label    string
	end      int // length of the prefix that ends with label
	parent   *node
	keys     []byte    // first byte of each child's label, in the order of children
	children []*node   // distinct first bytes
	slots    []int32   // slot of each holder, in the order of holders (scanned without a pointer chase)
	holders  []*holder // the workers that hold this prefix

	// Room for the first holder, so that a new node costs one allocation besides its label.
	slot0   [1]int32
	holder0 [1]*holder
	h0      holder // in use while h0.node != nil
}

func newNode(label string, end int, parent *node) *node {
	n := &node{label: label, end: end, parent: parent}
	n.slots, n.holders = n.slot0[:0], n.holder0[:0]
	return n
}

// hold records that slot holds n, last accessed at last, and returns the new holder, which the
// caller links into the worker's LRU list.
func (n *node) hold(slot int32, last int64) *holder {
	h := &n.h0
	if h.node != nil {
		h = new(holder)
	}
	*h = holder{node: n, last: last, slot: slot}
	n.slots = append(n.slots, slot)
	n.holders = append(n.holders, h)
	return h
}

// holder records that one worker holds one node.
type holder struct {
	node       *node
	last       int64 // last access by this worker, Unix nanoseconds
	prev, next *holder
	slot       int32
}

func newRadixTree() *radixTree {
	return &radixTree{slots: make(map[string]int32), scopes: make(map[string]*node)}
}

// scopeRoot returns the root of the prefixes of the scope named namespace ("" for the global
// scope). A scope without prefixes gets a new root if create (the caller is about to insert one),
// else the empty t.none, from which nothing matches.
func (t *radixTree) scopeRoot(namespace string, create bool) *node {
	if namespace == "" {
		return &t.root
	}
	if r, ok := t.scopes[namespace]; ok {
		return r
	}
	if !create {
		return &t.none
	}
	r := newNode(namespace, 0, nil)
	t.scopes[namespace] = r
	return r
}

// slot returns the slot of worker id, registering it if it is new.
func (t *radixTree) slot(id string) int32 {
	if s, ok := t.slots[id]; ok {
		return s
	}
	w := &treeWorker{id: id}
	w.lru.prev, w.lru.next = &w.lru, &w.lru
	var s int32
	if n := len(t.free); n > 0 {
		s = t.free[n-1]
		t.free = t.free[:n-1]
		t.workers[s] = w
	} else {
		s = int32(len(t.workers))
		t.workers = append(t.workers, w)
	}
	t.slots[id] = s
	return s
}

// descent is where a prompt leaves the tree: n is the deepest node whose whole prefix starts the
// prompt; child, when not nil, is the child of n that also matches its first into bytes (0 < into
// < len(child.label)).
type descent struct {
	n     *node
	child *node
	into  int
}

// matched is the number of prompt bytes the tree holds.
func (d descent) matched() int {
	if d.child != nil {
		return d.n.end + d.into
	}
	return d.n.end
}

// descend follows prompt down the tree from root (see scopeRoot). It reads and allocates nothing
// but the path: one IndexByte per level and a substring compare of each edge.
func (t *radixTree) descend(root *node, prompt string) descent {
	n := root
	for n.end < len(prompt) {
		rest := prompt[n.end:]
		i := bytes.IndexByte(n.keys, rest[0])
		if i < 0 {
			break
		}
		c := n.children[i]
		k := commonPrefix(c.label, rest)
		if k < len(c.label) {
			return descent{n: n, child: c, into: k}
		}
		n = c
	}
	return descent{n: n}
}

// commonPrefix returns the length of the longest common prefix of a and b. Most edges of a
// descent match whole, which one call of the runtime's vectorised string equality settles; the
// edge where the prompt leaves the tree is narrowed down in blocks of 256 and 16 bytes.
func commonPrefix(a, b string) int {
	n := min(len(a), len(b))
	if a[:n] == b[:n] {
		return n
	}
	i := 0
	for i+256 <= n && a[i:i+256] == b[i:i+256] {
		i += 256
	}
	for i+16 <= n && a[i:i+16] == b[i:i+16] {
		i += 16
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// heldBy returns how many leading bytes of the prompt of d slot holds in entries accessed at or
// after horizon, and its last access of the deepest of them (0 when it holds none). Its cost is a
// walk up the matched path, scanning each node's holders.
func (t *radixTree) heldBy(d descent, slot int32, horizon int64) (held int, last int64) {
	if d.child != nil {
		if i := slices.Index(d.child.slots, slot); i >= 0 && d.child.holders[i].last >= horizon {
			return d.matched(), d.child.holders[i].last
		}
	}
	for n := d.n; n.parent != nil; n = n.parent {
		if i := slices.Index(n.slots, slot); i >= 0 && n.holders[i].last >= horizon {
			return n.end, n.holders[i].last
		}
	}
	return 0, 0
}

// horizonScan bounds the entries horizon walks; a limit holding more of them ends its horizon
// early (it counts fewer entries as held than it might).
const horizonScan = 4096

// horizon returns the access time before which slot's entries fall outside its most recent limit
// bytes: a walk of its LRU list from the most recent entry.
func (t *radixTree) horizon(slot int32, limit int64) int64 {
	w := t.workers[slot]
	var b int64
	scanned := 0
	for h := w.lru.next; h != &w.lru; h = h.next {
		b += int64(len(h.node.label))
		scanned++
		if b > limit || scanned > horizonScan {
			// Entries of one insert share its time: all of h's insert is past the horizon.
			return h.last + 1
		}
	}
	return 0
}

// bytesSince returns the bytes of the entries slot accessed after since: a walk of its LRU list
// from the most recent entry, as long as those are.
func (t *radixTree) bytesSince(slot int32, since int64) int64 {
	w := t.workers[slot]
	var b int64
	for h := w.lru.next; h != &w.lru && h.last > since; h = h.next {
		b += int64(len(h.node.label))
	}
	return b
}

// insert makes slot hold all of prompt, using d, the descent of prompt made under the same lock
// from a root scopeRoot created (never t.none), so match and insert cost one descent. It splits
// the partly matched edge, adds a leaf for the unmatched rest and marks the whole path as
// accessed by slot at now. It returns the bytes slot newly holds.
func (t *radixTree) insert(prompt string, d descent, slot int32, now int64) int64 {
	n := d.n
	if d.child != nil {
		n = t.split(d.child, d.into)
	}
	if n.end < len(prompt) {
		leaf := newNode(strings.Clone(prompt[n.end:]), len(prompt), n)
		n.keys = append(n.keys, leaf.label[0])
		n.children = append(n.children, leaf)
		t.nodes++
		t.labels += int64(len(leaf.label))
		n = leaf
	}
	w := t.workers[slot]
	before := w.bytes
	// Leaf first, then up: each ancestor ends up more recent than its descendants.
	for ; n.parent != nil; n = n.parent {
		t.touch(n, slot, w, now)
	}
	return w.bytes - before
}

// touch marks n as held by w (slot) and accessed at now, moving it to the front of w's LRU list.
func (t *radixTree) touch(n *node, slot int32, w *treeWorker, now int64) {
	for i, s := range n.slots {
		if s == slot {
			h := n.holders[i]
			h.last = now
			unlink(h)
			pushFront(&w.lru, h)
			return
		}
	}
	w.bytes += int64(len(n.label))
	pushFront(&w.lru, n.hold(slot, now))
}

// split cuts c after its first k bytes (0 < k < len(c.label)) and returns the new upper node,
// which every holder of c also holds, just more recently than c in its LRU list.
func (t *radixTree) split(c *node, k int) *node {
	p := c.parent
	upper, lower := c.label[:k], c.label[k:]
	// Copy the smaller half; the larger one keeps the array it was cut from, so the bytes a label
	// keeps alive stay within twice its length while copying at most half of it.
	if k <= len(lower) {
		upper = strings.Clone(upper)
	} else {
		lower = strings.Clone(lower)
	}
	up := newNode(upper, c.end-len(lower), p)
	c.label = lower
	c.parent = up
	p.children[bytes.IndexByte(p.keys, upper[0])] = up
	up.keys = []byte{lower[0]}
	up.children = []*node{c}
	for _, h := range c.holders {
		u := up.hold(h.slot, h.last)
		// Just ahead of h: more recent than c, still less recent than up's own ancestors.
		u.prev, u.next = h.prev, h
		h.prev.next = u
		h.prev = u
	}
	t.nodes++
	return up
}

// evict releases the least recently used entries of slot until it holds at most target bytes or
// limit entries were released, and returns how many it released.
func (t *radixTree) evict(slot int32, target int64, limit int) int {
	w := t.workers[slot]
	released := 0
	for w.bytes > target && released < limit && w.lru.prev != &w.lru {
		t.release(w, w.lru.prev)
		released++
	}
	return released
}

// remove drops every entry of worker id and frees its slot. Entries go least recent first, so
// descendants leave before their ancestors.
func (t *radixTree) remove(id string) {
	s, ok := t.slots[id]
	if !ok {
		return
	}
	w := t.workers[s]
	for w.lru.prev != &w.lru {
		t.release(w, w.lru.prev)
	}
	if w.limit > 0 {
		t.limited--
	}
	delete(t.slots, id)
	t.workers[s] = nil
	t.free = append(t.free, s)
	t.gen++
}

// release drops h, w's hold on one node, which must be a leaf for w; a node nobody holds any more
// leaves the tree (it has no children: its holders were a superset of theirs), and a scope's
// root with it when that was its last child.
func (t *radixTree) release(w *treeWorker, h *holder) {
	n := h.node
	unlink(h)
	w.bytes -= int64(len(n.label))
	for i, s := range n.slots {
		if s == h.slot {
			*h = holder{} // frees n.h0 if h is it
			last := len(n.slots) - 1
			n.slots[i], n.holders[i] = n.slots[last], n.holders[last]
			n.holders[last] = nil
			n.slots, n.holders = n.slots[:last], n.holders[:last]
			break
		}
	}
	if len(n.holders) > 0 {
		return
	}
	p := n.parent
	i := bytes.IndexByte(p.keys, n.label[0])
	last := len(p.keys) - 1
	p.keys[i], p.children[i] = p.keys[last], p.children[last]
	p.children[last] = nil
	p.keys, p.children = p.keys[:last], p.children[:last]
	n.parent = nil
	t.nodes--
	t.labels -= int64(len(n.label))
	if p.parent == nil && p != &t.root && len(p.children) == 0 {
		delete(t.scopes, p.label)
	}
}

func unlink(h *holder) {
	h.prev.next = h.next
	h.next.prev = h.prev
	h.prev, h.next = nil, nil
}

func pushFront(sentinel, h *holder) {
	h.prev, h.next = sentinel, sentinel.next
	sentinel.next.prev = h
	sentinel.next = h
}
