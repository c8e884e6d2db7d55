package routing

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// BenchmarkPick measures Pool.Pick plus Lease.Release for every registered policy on a fleet of
// 1,000 workers of one model, some of them busy, with requests varying in key, session and prompt.
// It also reports the 99th percentile of Pick alone (timed per call, so it includes a clock read).
func BenchmarkPick(b *testing.B) {
	reqs := make([]Request, 256)
	prompt := "you are a helpful assistant. answer briefly and cite your sources. "
	for i := range reqs {
		reqs[i] = Request{
			Model:        "m",
			Tenant:       fmt.Sprint("t", i%8),
			SessionID:    fmt.Sprint("s", i%64),
			RoutingKey:   fmt.Sprint("k", i%32),
			Prompt:       fmt.Sprintf("%s group %d question %d", prompt, i%16, i),
			PromptTokens: 64 + i*97%8000,
			Tokens:       512 + i*97%8000,
		}
	}
	benchmarkPicks(b, reqs)
}

// BenchmarkPickBesideInteractive is BenchmarkPick with interactive traffic present: every
// fourth request is interactive, so the others pick under the prefill budget and, when long,
// in pieces, and the interactive ones steer off workers prefilling a whole prompt (the
// protections of choice.go).
func BenchmarkPickBesideInteractive(b *testing.B) {
	reqs := make([]Request, 256)
	for i := range reqs {
		reqs[i] = Request{
			Model:        "m",
			Tenant:       fmt.Sprint("t", i%8),
			SessionID:    fmt.Sprint("s", i%64),
			Prompt:       fmt.Sprintf("you are a helpful assistant. group %d question %d", i%16, i),
			PromptTokens: 64 + i*97%8000,
			Tokens:       512 + i*97%8000,
			Interactive:  i%4 == 0,
		}
	}
	benchmarkPicks(b, reqs)
}

// benchmarkPicks runs Pool.Pick plus Lease.Release over reqs, in turn, for every registered
// policy on a fleet of 1,000 workers of one model, some of them busy, and reports the 99th
// percentile of Pick alone (timed per call, so it includes a clock read). Each policy picks its
// own copy of reqs, prepared once before the timed loop as the gateway prepares a request
// before it waits: Prepare's I/O is the policy's cost per request, not per pick.
func benchmarkPicks(b *testing.B, reqs []Request) {
	const fleet = 1000
	for _, name := range conformancePolicies() {
		b.Run(name, func(b *testing.B) {
			p, _ := newTestPool(b, Config{Policy: name, Workers: testWorkers(fleet, "m")})
			for i, w := range modelWorkers(b, p, "m") {
				w.inFlight.Store(int64(i % 7))
			}
			ctx := context.Background()
			reqs := slices.Clone(reqs)
			for i := range reqs {
				p.Prepare(ctx, &reqs[i])
			}
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				start := time.Now()
				l, err := p.Pick(ctx, &reqs[i%len(reqs)])
				if err != nil {
					b.Fatal(err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
				l.Release(Outcome{})
				i++
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-pick-ns")
		})
	}
}
