package routing

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
)

// hashRing is a consistent-hash ring over one model's workers: VirtualNodes points per worker,
// placed by a hash of the worker's ID alone, so every gateway with the same workers builds the
// same ring and sends a key to the same worker. Immutable once built.
type hashRing struct {
	workers []*Worker          // the snapshot it was built from
	points  []ringPoint        // sorted by hash
	byID    map[string]*Worker // the same workers
}

type ringPoint struct {
	hash   uint64
	worker int32 // index into workers
}

func newHashRing(workers []*Worker, vnodes int) *hashRing {
	pts := make([]ringPoint, 0, len(workers)*vnodes)
	byID := make(map[string]*Worker, len(workers))
	var buf []byte
	for i, w := range workers {
		byID[w.spec.ID] = w
		for v := range vnodes {
			buf = strconv.AppendInt(append(append(buf[:0], w.spec.ID...), '#'), int64(v), 10)
			pts = append(pts, ringPoint{hash: xxhash.Sum64(buf), worker: int32(i)})
		}
	}
	slices.SortFunc(pts, func(a, b ringPoint) int { return cmp.Compare(a.hash, b.hash) })
	return &hashRing{workers: workers, points: pts, byID: byID}
}

// pick walks the ring clockwise from key and returns the first eligible worker whose in-flight
// requests stay within bounded load: at most ceil(loadFactor x (all in flight + 1) / workers),
// so an idle worker always qualifies (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
// with Bounded Loads"). spilled says the owner of key was passed over. Cost: a binary search,
// plus a sum over the workers only when the owner already has work.
func (h *hashRing) pick(r choice, key uint64, loadFactor float64) (w *Worker, spilled bool) {
	n := len(h.points)
	if n == 0 {
		return nil, false
	}
	start, _ := slices.BinarySearchFunc(h.points, key, func(p ringPoint, k uint64) int { return cmp.Compare(p.hash, k) })
	capacity := int64(-1)
	var seen visitSet
	for step := range n {
		pt := h.points[(start+step)%n]
		if !seen.add(pt.worker, len(h.workers)) {
			continue
		}
		w := h.workers[pt.worker]
		if !r.Eligible(w) {
			continue
		}
		if load := w.InFlight(); load > 0 {
			if capacity < 0 {
				capacity = h.capacity(loadFactor)
			}
			if load+1 > capacity {
				continue
			}
		}
		return w, seen.count > 1
	}
	// Every eligible worker is over the bound (the bound is a mean, and the mean moves while
	// requests end): the key spills to the least loaded eligible one rather than to no worker.
	var least *Worker
	for _, w := range h.workers {
		if r.Eligible(w) && (least == nil || w.InFlight() < least.InFlight()) {
			least = w
		}
	}
	return least, least != nil
}

// capacity is the bound of bounded load: loadFactor times the mean load, one more request
// included, over the workers that take requests (healthy, not draining, circuit closed). Workers
// that are down or drained count in neither the load nor the mean: counting them would lower
// the bound below what the working ones carry and refuse requests while they have room.
func (h *hashRing) capacity(loadFactor float64) int64 {
	var total, up int64
	for _, w := range h.workers {
		if w.takesRequests() {
			total += w.InFlight()
			up++
		}
	}
	return int64(math.Ceil(loadFactor * float64(total+1) / float64(max(up, 1))))
}

// visitSet remembers the workers a ring walk has met: the first few inline, then in a bitset, so
// the common short walk allocates nothing.
type visitSet struct {
	small [8]int32
	count int
	bits  []uint64
}

// add records i and reports whether it was new; n is the number of workers.
func (s *visitSet) add(i int32, n int) bool {
	if s.bits == nil {
		for _, j := range s.small[:min(s.count, len(s.small))] {
			if j == i {
				return false
			}
		}
		if s.count < len(s.small) {
			s.small[s.count] = i
			s.count++
			return true
		}
		s.bits = make([]uint64, (n+63)/64)
		for _, j := range s.small {
			s.bits[j/64] |= 1 << (j % 64)
		}
	}
	if s.bits[i/64]&(1<<(i%64)) != 0 {
		return false
	}
	s.bits[i/64] |= 1 << (i % 64)
	s.count++
	return true
}

// ringCache holds the ring of a model's current snapshot. WorkersChanged builds it ahead of the
// snapshot being published; a pick that meets another snapshot (the old one, for a moment, or a
// test's own slice) builds a ring for it and caches that instead.
type ringCache struct {
	vnodes int
	cur    atomic.Pointer[hashRing]
}

// WorkersChanged implements workersObserver.
func (c *ringCache) WorkersChanged(workers []*Worker) {
	c.cur.Store(newHashRing(workers, c.vnodes))
}

func (c *ringCache) get(workers []*Worker) *hashRing {
	if h := c.cur.Load(); h != nil && sameSnapshot(h.workers, workers) {
		return h
	}
	h := newHashRing(workers, c.vnodes)
	c.cur.Store(h)
	return h
}

// sameSnapshot reports whether a and b are the same snapshot slice (not merely equal ones).
func sameSnapshot(a, b []*Worker) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}
