package tenants

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/test/redistest"
)

var hour0 = time.Date(2026, 11, 20, 13, 0, 0, 0, time.UTC)

func usageKey(tenant, key string, start time.Time) UsageKey {
	return UsageKey{Tenant: tenant, Key: key, Model: "m", Class: "standard", Start: start}
}

// total sums the rows q selects.
func total(t *testing.T, s *Store, q UsageQuery) UsageCounts {
	t.Helper()
	rows, err := s.Usage(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	var sum UsageCounts
	for _, r := range rows {
		sum.Add(r.UsageCounts)
	}
	return sum
}

func TestUsageStore(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			t.Run("add, batches, query", func(t *testing.T) { testUsageAdd(t, d.open(t)) })
			t.Run("rollup", func(t *testing.T) { testUsageRollUp(t, d.open(t)) })
		})
	}
}

func testUsageAdd(t *testing.T, s *Store) {
	ctx := context.Background()
	a := usageKey("acme", "k1", hour0)
	b := usageKey("beta", "k2", hour0.Add(time.Hour))
	batch := map[UsageKey]UsageCounts{
		a: {Requests: 2, PromptTokens: 10, CachedTokens: 4, CompletionTokens: 20, Estimated: 1},
		b: {Requests: 1, RefusedLimit: 1},
	}
	for range 2 {
		if err := s.AddUsage(ctx, "", batch); err != nil {
			t.Fatal(err)
		}
	}
	// A named batch counts once, however often it is added.
	for range 3 {
		if err := s.AddUsage(ctx, "redis:abc", map[UsageKey]UsageCounts{a: {Requests: 1, CompletionTokens: 5}}); err != nil {
			t.Fatal(err)
		}
	}
	got := total(t, s, UsageQuery{Tenant: "acme"})
	want := UsageCounts{Requests: 5, PromptTokens: 20, CachedTokens: 8, CompletionTokens: 45, Estimated: 2}
	if got != want {
		t.Errorf("acme: got %+v, want %+v", got, want)
	}
	if got := total(t, s, UsageQuery{From: hour0.Add(time.Hour)}); got != (UsageCounts{Requests: 2, RefusedLimit: 2}) {
		t.Errorf("from the second hour: got %+v, want beta's two refusals", got)
	}
	if got := total(t, s, UsageQuery{To: hour0.Add(time.Hour), Key: "k2"}); got != (UsageCounts{}) {
		t.Errorf("k2 before the second hour: got %+v, want nothing", got)
	}
	rows, err := s.Usage(ctx, UsageQuery{Limit: 1})
	if err != nil || len(rows) != 1 || rows[0].Tenant != "beta" || rows[0].Period != PeriodHour || !rows[0].Start.Equal(b.Start) {
		t.Errorf("newest row: got %+v, %v; want beta's hour", rows, err)
	}
}

func testUsageRollUp(t *testing.T, s *Store) {
	ctx := context.Background()
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	rows := map[UsageKey]UsageCounts{}
	for h := range 30 { // 24 hours of one day, 6 of the next
		rows[usageKey("acme", "k", day.Add(time.Duration(h)*time.Hour))] = UsageCounts{Requests: 1, CompletionTokens: 10}
	}
	rows[usageKey("acme", "k", day.AddDate(0, 0, -30))] = UsageCounts{Requests: 7}
	if err := s.AddUsage(ctx, "", rows); err != nil {
		t.Fatal(err)
	}
	before := total(t, s, UsageQuery{From: day})
	// Hours before the second day roll up; days before the first one are deleted.
	if err := s.RollUp(ctx, day.AddDate(0, 0, 1), day); err != nil {
		t.Fatal(err)
	}
	if err := s.RollUp(ctx, day.AddDate(0, 0, 1), day); err != nil { // nothing left to do
		t.Fatal(err)
	}
	if after := total(t, s, UsageQuery{From: day}); after != before {
		t.Errorf("after the rollup: got %+v, want %+v", after, before)
	}
	got, err := s.Usage(ctx, UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	days, hours := 0, 0
	for _, r := range got {
		switch r.Period {
		case PeriodDay:
			days++
			if !r.Start.Equal(day) || r.Requests != 24 || r.CompletionTokens != 240 {
				t.Errorf("day row: got %+v, want the first day's 24 hours", r)
			}
		case PeriodHour:
			hours++
		}
	}
	if days != 1 || hours != 6 {
		t.Errorf("got %d day rows and %d hour rows, want 1 and 6 (the old day deleted)", days, hours)
	}
}

func record(l *Ledger, tenant string, n int) {
	for i := range n {
		l.Record(UsageRecord{Tenant: tenant, Key: "k", Model: "m", Class: "standard", At: hour0.Add(time.Duration(i) * time.Minute),
			PromptTokens: 3, CompletionTokens: 7, Estimated: i%2 == 0})
	}
}

func TestLedgerWithoutRedisWritesOnFlushAndAtTheEnd(t *testing.T) {
	s := openSQLite(t)
	l := NewLedger(UsageConfig{FlushInterval: time.Hour}, s, LedgerOptions{})
	record(l, "acme", 10)
	l.Flush(context.Background())
	if got := total(t, s, UsageQuery{}); got != (UsageCounts{Requests: 10, PromptTokens: 30, CompletionTokens: 70, Estimated: 5}) {
		t.Fatalf("after Flush: got %+v", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	record(l, "acme", 4)
	cancel()
	<-done
	if got := total(t, s, UsageQuery{}); got.Requests != 14 {
		t.Fatalf("after Run ended: got %d requests, want 14", got.Requests)
	}
}

func TestLedgerKeepsWhatTheStoreRefused(t *testing.T) {
	s := openSQLite(t)
	l := NewLedger(UsageConfig{}, s, LedgerOptions{})
	record(l, "acme", 3)
	s.Close() // every write fails now
	l.Flush(context.Background())
	l.mu.Lock()
	kept := len(l.pending)
	l.mu.Unlock()
	if kept != 1 {
		t.Fatalf("after a failed write: %d rows pending, want 1", kept)
	}
}

func TestLedgerWithRedisFoldsEveryReplicaOnce(t *testing.T) {
	srv := redistest.Start(t)
	s := openSQLite(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ledgers []*Ledger
	for range 3 {
		l := NewLedger(UsageConfig{FlushInterval: 10 * time.Millisecond}, s, LedgerOptions{Redis: newRedisClient(t, srv)})
		ledgers = append(ledgers, l)
		wg.Go(func() { l.Run(ctx) })
	}
	var rec sync.WaitGroup
	for i, l := range ledgers {
		rec.Go(func() { record(l, fmt.Sprintf("t%d", i%2), 200) })
	}
	rec.Wait()
	waitFor(t, "every request in the store", func() bool { return total(t, s, UsageQuery{}).Requests == 600 })
	cancel()
	wg.Wait()
	if got := total(t, s, UsageQuery{}); got != (UsageCounts{Requests: 600, PromptTokens: 1800, CompletionTokens: 4200, Estimated: 300}) {
		t.Errorf("got %+v, want each of the 600 requests once", got)
	}
	if got := total(t, s, UsageQuery{Tenant: "t1"}); got.Requests != 200 {
		t.Errorf("t1: got %d requests, want 200", got.Requests)
	}
}

// A replica that died after adding a batch to the store and before deleting it from Redis leaves
// the batch pending: the next fold recognises it and does not add it again.
func TestLedgerFoldsAPendingBatchOnce(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newRedisClient(t, srv)
	s := openSQLite(t)
	ctx := context.Background()
	l := NewLedger(UsageConfig{RedisTimeout: 20 * time.Millisecond}, s, LedgerOptions{Redis: rdb}) // no writer: each Record waits this long
	record(l, "acme", 5)
	if err := l.push(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Rename(ctx, l.liveKey(), l.pendingKey()).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, l.pendingKey(), batchField, "redis:dead")
	if err := s.AddUsage(ctx, "redis:dead", map[UsageKey]UsageCounts{usageKey("acme", "k", hour0): {Requests: 5}}); err != nil {
		t.Fatal(err)
	}
	record(l, "acme", 2)
	if err := l.push(ctx); err != nil {
		t.Fatal(err)
	}
	l.Flush(ctx) // the pending batch: recognised, deleted
	l.Flush(ctx) // the live hash
	if got := total(t, s, UsageQuery{}).Requests; got != 7 {
		t.Errorf("got %d requests, want 7 (the pending batch once)", got)
	}
	if n, _ := rdb.Exists(ctx, l.pendingKey(), l.liveKey()).Result(); n != 0 {
		t.Errorf("%d ledger keys left in Redis, want 0", n)
	}
}

func TestLedgerWritesToTheStoreWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	s := openSQLite(t)
	l := NewLedger(UsageConfig{RedisTimeout: 200 * time.Millisecond}, s, LedgerOptions{Redis: newRedisClient(t, srv)})
	srv.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.pushLoop(ctx) }()
	record(l, "acme", 4)
	waitFor(t, "Redis known down", l.redisDown.Load)
	record(l, "acme", 1) // may wake the writer once more; whatever it fails goes back
	cancel()
	<-done
	l.Flush(context.Background())
	if got := total(t, s, UsageQuery{}).Requests; got != 5 {
		t.Errorf("got %d requests in the store, want 5", got)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not true after 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkLedgerRecord is the cost a request pays to be metered (issue 12: under 5µs).
func BenchmarkLedgerRecord(b *testing.B) {
	l := NewLedger(UsageConfig{}, nil, LedgerOptions{})
	at := time.Now()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			l.Record(UsageRecord{Tenant: "acme", Key: "k", Model: "m", Class: "standard", At: at,
				PromptTokens: int64(i % 100), CompletionTokens: 50})
		}
	})
}
