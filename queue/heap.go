package queue

// heap is a binary min-heap whose elements record their own position (an intrusive index), so
// an element can be removed or re-sorted in O(log n) without a search. It never allocates once its
// backing slice has grown. The zero value is unusable: less and setIndex must be set.
type heap[T any] struct {
	items    []T
	less     func(a, b T) bool
	setIndex func(x T, i int) // told every new position; -1 when x leaves the heap
}

func (h *heap[T]) len() int { return len(h.items) }

// peek returns the least element; the heap must not be empty.
func (h *heap[T]) peek() T { return h.items[0] }

func (h *heap[T]) push(x T) {
	h.items = append(h.items, x)
	i := len(h.items) - 1
	h.setIndex(x, i)
	h.up(i)
}

// remove takes out the element at position i and returns it.
func (h *heap[T]) remove(i int) T {
	n := len(h.items) - 1
	x := h.items[i]
	if i != n {
		h.swap(i, n)
	}
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	h.setIndex(x, -1)
	return x
}

// fix restores the order after the key of the element at position i changed.
func (h *heap[T]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *heap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.setIndex(h.items[i], i)
	h.setIndex(h.items[j], j)
}

func (h *heap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(h.items[i], h.items[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts the element at i towards the leaves and reports whether it moved.
func (h *heap[T]) down(i0 int) bool {
	i, n := i0, len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(h.items[r], h.items[l]) {
			m = r
		}
		if !h.less(h.items[m], h.items[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > i0
}

// ticketHeap orders a flow's requests by deadline, then arrival. Keys are kept inline so that
// sifting reads one contiguous array instead of chasing pointers into scattered Tickets, and
// sifting moves a hole rather than swapping, so each level writes one position (flowIdx)
// through a Ticket pointer instead of two.
type ticketHeap []ticketEntry

type ticketEntry struct {
	deadline int64
	seq      uint64
	t        *Ticket
}

func (a *ticketEntry) before(b *ticketEntry) bool {
	return a.deadline < b.deadline || a.deadline == b.deadline && a.seq < b.seq
}

func (h *ticketHeap) push(t *Ticket) {
	*h = append(*h, ticketEntry{})
	h.place(ticketEntry{deadline: t.deadline, seq: t.seq, t: t}, len(*h)-1)
}

// remove takes out the ticket at position i.
func (h *ticketHeap) remove(i int) {
	s := *h
	n := len(s) - 1
	s[i].t.flowIdx = -1
	last := s[n]
	s[n] = ticketEntry{}
	*h = s[:n]
	if i != n {
		h.place(last, i)
	}
}

// place puts e into the hole at position i and sifts it to where it belongs.
func (h ticketHeap) place(e ticketEntry, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.before(&h[p]) {
			break
		}
		h[i] = h[p]
		h[i].t.flowIdx = i
		i = p
	}
	for n := len(h); ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&e) {
			break
		}
		h[i] = h[m]
		h[i].t.flowIdx = i
		i = m
	}
	h[i] = e
	e.t.flowIdx = i
}

// flowHeap orders a class's backlogged flows by virtual token counter, then by stamp (round
// robin among equal counters). Like ticketHeap it keeps the keys inline and sifts a hole; each
// flow records its position in idx. A flow's key is read when it is pushed or fixed.
type flowHeap []flowEntry

type flowEntry struct {
	fairShare float64
	stamp     uint64
	f         *flow
}

func (a *flowEntry) before(b *flowEntry) bool {
	return a.fairShare < b.fairShare || a.fairShare == b.fairShare && a.stamp < b.stamp
}

func (h flowHeap) len() int { return len(h) }

// peek returns the flow with the least counter; the heap must not be empty.
func (h flowHeap) peek() *flow { return h[0].f }

func (h *flowHeap) push(f *flow) {
	*h = append(*h, flowEntry{})
	h.place(flowEntry{fairShare: f.fairShare, stamp: f.stamp, f: f}, len(*h)-1)
}

// remove takes out the flow at position i.
func (h *flowHeap) remove(i int) {
	s := *h
	n := len(s) - 1
	s[i].f.idx = -1
	last := s[n]
	s[n] = flowEntry{}
	*h = s[:n]
	if i != n {
		h.place(last, i)
	}
}

// fix re-reads the key of the flow at position i after its counter or stamp changed.
func (h flowHeap) fix(i int) {
	f := h[i].f
	h.place(flowEntry{fairShare: f.fairShare, stamp: f.stamp, f: f}, i)
}

// place puts e into the hole at position i and sifts it to where it belongs.
func (h flowHeap) place(e flowEntry, i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.before(&h[p]) {
			break
		}
		h[i] = h[p]
		h[i].f.idx = i
		i = p
	}
	for n := len(h); ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(&h[l]) {
			m = r
		}
		if !h[m].before(&e) {
			break
		}
		h[i] = h[m]
		h[i].f.idx = i
		i = m
	}
	h[i] = e
	e.f.idx = i
}
