//go:build unix

package routing

import (
	"context"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The benchmark fixture: a cache_aware tree of 100,000 cached prompts of about 4 KB over 8
// workers: 100 documents of ~3.5 KB (system prompts, RAG contexts), each followed by 1,000
// distinct questions of 300 to 700 bytes. It is built once, by Pick, and shared by the
// benchmarks of this file.
const (
	benchDocs      = 100
	benchQuestions = 1000 // per document
	benchWorkers   = 8
)

type cacheBench struct {
	c             *CacheAware
	ws            []*Worker
	docs          []string
	hits          []string // cached prompts, for pure hits
	heapPerPrefix float64  // heap bytes per cached prompt
	labelBytes    int64
	nodes         int
}

var (
	benchOnce    sync.Once
	benchFixture *cacheBench
	// benchSeq numbers the new prompts of every run, so that a rerun (-count, b.N growth) on the
	// shared fixture still meets prompts the tree has never seen.
	benchSeq atomic.Int64
)

func benchWords(rnd *rand.Rand, sb *strings.Builder, n int) {
	vocab := []string{"the", "model", "answers", "questions", "about", "retrieval", "augmented", "generation",
		"with", "a", "context", "of", "documents", "and", "policies", "for", "tenants", "in", "production",
		"latency", "throughput", "cache", "prefix", "tokens", "worker", "gateway", "priority", "queue"}
	for sb.Len() < n {
		sb.WriteString(vocab[rnd.IntN(len(vocab))])
		sb.WriteByte(' ')
	}
}

func benchQuestion(rnd *rand.Rand, doc string, q int) string {
	var sb strings.Builder
	sb.Grow(len(doc) + 720)
	sb.WriteString(doc)
	sb.WriteString("\nQuestion ")
	sb.WriteString(strconv.Itoa(q))
	sb.WriteString(": ")
	benchWords(rnd, &sb, len(doc)+300+rnd.IntN(400))
	return sb.String()
}

func cacheFixture(b *testing.B) *cacheBench {
	benchOnce.Do(func() {
		rnd := rand.New(rand.NewPCG(1, 1))
		f := &cacheBench{ws: cacheWorkers(b, benchWorkers)}
		for range benchDocs {
			var sb strings.Builder
			benchWords(rnd, &sb, 3300+rnd.IntN(400))
			f.docs = append(f.docs, sb.String())
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		// Room for the whole fixture: the benchmarks measure a tree of 100,000 prompts.
		c, err := NewCacheAware(CacheAwareConfig{MaxBytesPerWorker: 1 << 30}, time.Now)
		if err != nil {
			b.Fatal(err)
		}
		for q := range benchQuestions {
			for d, doc := range f.docs {
				p := benchQuestion(rnd, doc, q)
				c.Pick(context.Background(), choice{Request: &Request{Model: "m", Prompt: p}}, f.ws)
				if q%100 == 0 && d%10 == 0 {
					f.hits = append(f.hits, p)
				}
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		f.c = c
		_, f.nodes, f.labelBytes = c.CachedBytes("")
		f.heapPerPrefix = float64(after.HeapAlloc-before.HeapAlloc) / (benchDocs * benchQuestions)
		b.Logf("fixture: %d prompts, %d nodes, %d label bytes, %.0f heap bytes per cached prompt (%.0f of them label bytes)",
			benchDocs*benchQuestions, f.nodes, f.labelBytes, f.heapPerPrefix, float64(f.labelBytes)/(benchDocs*benchQuestions))
		benchFixture = f
	})
	if benchFixture == nil {
		b.Fatal("fixture failed")
	}
	return benchFixture
}

func reportFixture(b *testing.B, f *cacheBench) {
	b.ReportMetric(f.heapPerPrefix, "heapB/prefix")
}

// cpuTime is the CPU time of the process so far, garbage collection included. On a shared machine
// it says more about the cost of an operation than the wall clock does.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process CPU time per op since start as cpu-ns/op.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// BenchmarkCacheAwarePickHit: a 4 KB prompt the tree already holds whole for the chosen worker:
// descent, choice and the touch of the path.
func BenchmarkCacheAwarePickHit(b *testing.B) {
	f := cacheFixture(b)
	reqs := make([]Request, len(f.hits))
	for i, p := range f.hits {
		reqs[i] = Request{Model: "m", Prompt: p}
	}
	b.ReportAllocs()
	cpu := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		if w, route := f.c.Pick(context.Background(), choice{Request: &reqs[i%len(reqs)]}, f.ws); w == nil || route != RouteCacheHit {
			b.Fatalf("got %v by %s, want a cache hit", w, route)
		}
	}
	reportCPU(b, cpu)
	reportFixture(b, f)
}

// mutablePrompt is a prompt whose bytes a benchmark rewrites between Picks, so each Pick sees a
// new prompt without building a string per op. Sound here: the tree copies what it keeps.
type mutablePrompt struct {
	buf []byte
	at  int // where the 8 counter digits go
}

func (m *mutablePrompt) next() string {
	n := benchSeq.Add(1)
	for i := m.at + 7; i >= m.at; i-- {
		m.buf[i] = byte('0' + n%10)
		n /= 10
	}
	return unsafe.String(&m.buf[0], len(m.buf))
}

// BenchmarkCacheAwarePickNewQuestion: a 4 KB prompt whose document is cached but whose question is
// new: the descent ends inside a leaf, which is split, and a new leaf is added.
func BenchmarkCacheAwarePickNewQuestion(b *testing.B) {
	f := cacheFixture(b)
	base := []byte(f.hits[0])
	at := len(f.docs[0]) + len("\nQuestion ")
	m := &mutablePrompt{buf: slices.Concat(base[:at], []byte("00000000"), base[at:]), at: at}
	r := &Request{Model: "m"}
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		r.Prompt = m.next()
		if w, route := f.c.Pick(context.Background(), choice{Request: r}, f.ws); w == nil || route != RouteCacheHit {
			b.Fatalf("got %v by %s, want a cache hit on the document", w, route)
		}
	}
	reportCPU(b, cpu)
	reportFixture(b, f)
}

// BenchmarkCacheAwarePickCold: a 4 KB prompt that shares nothing but a short header with the
// tree: a cache miss that copies the whole prompt into a new leaf.
func BenchmarkCacheAwarePickCold(b *testing.B) {
	f := cacheFixture(b)
	m := &mutablePrompt{buf: []byte("cold 00000000 " + f.hits[1]), at: 5}
	r := &Request{Model: "m"}
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		r.Prompt = m.next()
		if w, route := f.c.Pick(context.Background(), choice{Request: r}, f.ws); w == nil || route != RouteCacheMiss {
			b.Fatalf("got %v by %s, want a cache miss", w, route)
		}
	}
	reportCPU(b, cpu)
	reportFixture(b, f)
}

// BenchmarkCacheAwarePick1000Workers: cached 4 KB prompts picked among 1,000 workers (the 8 that
// hold the tree among them), with the p99 of single Picks.
func BenchmarkCacheAwarePick1000Workers(b *testing.B) {
	f := cacheFixture(b)
	ws := cacheWorkers(b, 1000)
	for i, w := range ws {
		w.inFlight.Store(int64(i % 7))
	}
	reqs := make([]Request, len(f.hits))
	for i, p := range f.hits {
		reqs[i] = Request{Model: "m", Prompt: p}
	}
	lat := make([]time.Duration, 0, 1<<16)
	b.ReportAllocs()
	cpu := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		w, _ := f.c.Pick(context.Background(), choice{Request: &reqs[i%len(reqs)]}, ws)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
		if w == nil {
			b.Fatal("got no worker")
		}
	}
	reportCPU(b, cpu)
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkCacheAwarePickParallel: cache hits from every P at once, through the one mutex.
func BenchmarkCacheAwarePickParallel(b *testing.B) {
	f := cacheFixture(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			r := Request{Model: "m", Prompt: f.hits[i%len(f.hits)]}
			f.c.Pick(context.Background(), choice{Request: &r}, f.ws)
			i++
		}
	})
}

// BenchmarkCacheAwarePickPredicted: cached 4 KB prompts picked by predicted TTFT (every worker's
// cost model has learnt) among 8 and 1,000 loaded workers: the descent, one walk up the matched
// path and, per worker, its eligibility test and one Predict. ns/candidate is the CPU time of a
// Pick over the number of workers.
func BenchmarkCacheAwarePickPredicted(b *testing.B) {
	f := cacheFixture(b)
	f.c.cfg.Placement = PlacementPredictedTTFT
	for _, n := range []int{benchWorkers, 1000} {
		b.Run(strconv.Itoa(n)+"workers", func(b *testing.B) {
			ws := cacheWorkers(b, n)
			rng := rand.New(rand.NewPCG(1, 2))
			for i, w := range ws {
				for range 2 * costMinAnswers {
					pl := randomPlacement(rng)
					w.cost.observe(pl, pl.running, steps.answer(rng, 16+rng.IntN(3000), 0, 20, pl, 0.05))
				}
				w.slots.Store(4)
				w.inFlight.Store(int64(i % 7))
			}
			reqs := make([]Request, len(f.hits))
			for i, p := range f.hits {
				reqs[i] = Request{Model: "m", Prompt: p, PromptTokens: len(p) / 4}
			}
			b.ReportAllocs()
			cpu := cpuTime(b)
			for i := 0; b.Loop(); i++ {
				if w, route := f.c.Pick(context.Background(), choice{Request: &reqs[i%len(reqs)]}, ws); w == nil || route != RoutePredictedTTFT {
					b.Fatalf("got %v by %s, want a pick by predicted TTFT", w, route)
				}
			}
			b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/float64(n), "cpu-ns/candidate")
		})
	}
}
