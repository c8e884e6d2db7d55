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

// clear empties the heap, keeping its backing array.
func (h *heap[T]) clear() {
	var zero T
	for i, x := range h.items {
		h.setIndex(x, -1)
		h.items[i] = zero
	}
	h.items = h.items[:0]
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
