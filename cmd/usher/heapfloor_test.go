package main

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestHeapFloorGOGC(t *testing.T) {
	const floor = 64 << 20
	for _, tt := range []struct {
		name        string
		live, roots uint64
		want        int
	}{
		{"a byte live", 1, 0, maxFloorGOGC},
		{"2 MiB live: the next collection at 64 MiB", 2 << 20, 0, 3100},
		{"2 MiB live, 2 MiB of stacks and globals", 2 << 20, 2 << 20, 1550},
		{"16 MiB live", 16 << 20, 0, 300},
		{"just under Go's pace", 32<<20 - 1, 0, 100},
		{"Go's pace reaches the floor", 32 << 20, 0, 100},
		{"Go's pace reaches the floor with the roots", 24 << 20, 16 << 20, 100},
		{"more than the floor", 1 << 30, 0, 100},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := heapFloorGOGC(tt.live, tt.roots, floor); got != tt.want {
				t.Errorf("got GOGC %d, want %d", got, tt.want)
			}
		})
	}
}

// recordedGOGC stands in for debug.SetGCPercent: it records what the keeper sets.
type recordedGOGC struct {
	mu  sync.Mutex
	set []int
}

func (r *recordedGOGC) setGCPercent(v int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.set = append(r.set, v)
	return 100
}

func (r *recordedGOGC) values() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.set...)
}

// collectUntil runs collections until ok holds, for at most 10 s.
func collectUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); {
		if time.Now().After(deadline) {
			t.Fatal("not after 10 s of collections")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// The floor follows the collections: a GOGC that puts the next collection at the floor is set
// after one, and Go's pace is set back once the keeper is stopped, after which it sets nothing.
func TestHeapFloorFollowsTheCollections(t *testing.T) {
	const floor = 1 << 40 // far above this test's live heap
	var r recordedGOGC
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	keepHeapFloor(ctx, floor, r.setGCPercent)
	collectUntil(t, func() bool { return len(r.values()) > 0 })
	if got := r.values()[0]; got <= 100 {
		t.Fatalf("after a collection: got GOGC %d, want more than 100 with a live heap far below the floor", got)
	}
	cancel()
	collectUntil(t, func() bool { v := r.values(); return v[len(v)-1] == 100 })
	n := len(r.values())
	for range 3 {
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
	if got := r.values(); len(got) != n {
		t.Errorf("after it stopped: got GOGC set again (%v)", got[n:])
	}
}

// GOGC in the environment is the operator's pace: serve keeps no floor.
func TestHeapFloorLeavesAGOGCOfTheEnvironment(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env := func(key string) (string, bool) {
		if key == "GOGC" {
			return "200", true
		}
		return "", false
	}
	if startHeapFloor(ctx, env) {
		t.Error("GOGC=200 in the environment: got a heap floor kept, want none")
	}
}
