package main

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// The garbage collector's pace under `usher serve`. Go starts a collection once the heap has
// grown GOGC percent (100) over what the last one left live (plus its stacks and globals), and
// never waits past 4 MiB of heap. A gateway's live heap is small (2 MiB in make bench-hop) while
// every request allocates a few KiB, most of it in net/http: at Go's pace usher collected about
// 30 times a second at 4,000 requests a second, and collecting took about 12% of its CPU (perf,
// 2026-11-28). serve keeps a heap floor instead: after each collection it sets GOGC so that the
// next one starts at about heapFloor of heap however little is live, and leaves Go's own pace
// once that reaches the floor. The heap then stays within max(heapFloor, Go's goal): at most
// heapFloor more than at Go's pace, and no more at all once the live heap is half of the
// floor or more. GOGC in the environment is the operator's choice: serve keeps no floor then.
// GOMEMLIMIT applies as ever (a collection starts near the limit whatever GOGC is).
const heapFloor = 32 << 20

// maxFloorGOGC bounds the GOGC heapFloorGOGC returns for an almost empty heap.
const maxFloorGOGC = 100_000

// heapFloorGOGC is the GOGC under which a collection that left live bytes of heap live, and
// found roots bytes of stacks and globals to scan, is followed by the next at floor bytes of heap
// (Go's goal: live + (live + roots) * GOGC / 100); Go's default, 100, once that is no later than
// Go's own pace.
func heapFloorGOGC(live, roots, floor uint64) int {
	if live+(live+roots) >= floor {
		return 100
	}
	return int(min((floor-live)*100/max(live+roots, 1), maxFloorGOGC))
}

// keepHeapFloor keeps a heap floor of floor bytes (see heapFloor) until ctx ends, with set
// setting GOGC (debug.SetGCPercent). It follows the collections themselves, with no goroutine
// and no timer of its own: a cleanup of an object dropped at once runs after each collection
// (on the runtime's cleanup goroutine), reads the live heap the collection left and sets GOGC,
// then drops another. The first collection after ctx ends sets GOGC back to 100 and ends it.
func keepHeapFloor(ctx context.Context, floor uint64, set func(int) int) {
	f := &heapFloorKeeper{ctx: ctx, floor: floor, set: set, gogc: -1,
		samples: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/scan/stack:bytes"}, {Name: "/gc/scan/globals:bytes"}}}
	f.arm()
}

// heapFloorKeeper is keepHeapFloor's state; only the cleanup goroutine touches it once armed.
type heapFloorKeeper struct {
	ctx   context.Context
	floor uint64
	set   func(int) int
	gogc  int // as last set; -1: not set yet
	// samples are the live heap, the stacks and the globals the last collection found.
	samples []metrics.Sample
}

// gcCycle is the object dropped for each collection: 16 bytes, so that it is not packed with
// other small objects (whose block a collection may keep for them).
type gcCycle [16]byte

func (f *heapFloorKeeper) arm() { runtime.AddCleanup(new(gcCycle), (*heapFloorKeeper).collected, f) }

// collected follows one collection.
func (f *heapFloorKeeper) collected() {
	if f.ctx.Err() != nil {
		f.set(100)
		return
	}
	metrics.Read(f.samples)
	var v [3]uint64
	for i, s := range f.samples {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	gogc := 100
	if v[0] > 0 {
		gogc = heapFloorGOGC(v[0], v[1]+v[2], f.floor)
	}
	// Setting the pace costs a lock of the heap; a change under a tenth is not worth it.
	if d := gogc - f.gogc; f.gogc < 0 || d*10 > f.gogc || -d*10 > f.gogc {
		f.set(gogc)
		f.gogc = gogc
	}
	f.arm()
}

// startHeapFloor keeps the heap floor of `usher serve` unless GOGC is set in the environment
// (getenv: os.LookupEnv); it reports whether it does.
func startHeapFloor(ctx context.Context, getenv func(string) (string, bool)) bool {
	if _, set := getenv("GOGC"); set {
		return false
	}
	keepHeapFloor(ctx, heapFloor, debug.SetGCPercent)
	return true
}
