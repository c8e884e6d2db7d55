package tenants

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/usherllm/usher/test/redistest"
)

// judged records calls of tenant in class with the given verdicts, one a minute from hour0.
func judged(l *Ledger, tenant, class string, verdicts ...[2]Verdict) {
	for i, v := range verdicts {
		l.Record(UsageRecord{Tenant: tenant, Key: "k", Model: "m", Class: class, At: hour0.Add(time.Duration(i) * time.Minute),
			PromptTokens: 3, CompletionTokens: 7, TTFT: v[0], TPOT: v[1]})
	}
}

var (
	met       = [2]Verdict{VerdictMet, VerdictMet}
	ttftLate  = [2]Verdict{VerdictMissed, VerdictMet}
	unjudged  = [2]Verdict{VerdictUnjudged, VerdictUnjudged}
	onlyTTFT  = [2]Verdict{VerdictMet, VerdictUnjudged}
	tpotSlow  = [2]Verdict{VerdictMet, VerdictMissed}
	window    = AttainmentQuery{From: hour0, To: hour0.Add(time.Hour)}
	adminRead = Actor{Name: "admin", Admin: true}
)

func TestAttainment(t *testing.T) {
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			testAttainment(t, d.open(t))
		})
	}
}

func testAttainment(t *testing.T, s *Store) {
	ctx := context.Background()
	a, _ := newAdminFixtureOn(t, s, AdminConfig{Token: "admin-token-0123456789"})
	l := NewLedger(UsageConfig{FlushInterval: time.Hour}, s, LedgerOptions{})
	judged(l, "acme", ClassInteractive, met, met, ttftLate, tpotSlow, onlyTTFT)
	judged(l, "acme", ClassStandard, met)
	judged(l, "cfg", ClassInteractive, met, onlyTTFT)
	judged(l, "sus", ClassBatch, unjudged, unjudged)
	l.Flush(ctx)

	got := total(t, s, UsageQuery{Tenant: "acme", Class: ClassInteractive})
	want := UsageCounts{Requests: 5, PromptTokens: 15, CompletionTokens: 35,
		TTFTMet: 4, TTFTMissed: 1, TPOTMet: 3, TPOTMissed: 1, ObjectivesMet: 3, ObjectivesMissed: 2}
	if got != want {
		t.Errorf("acme's interactive ledger rows: got %+v, want %+v", got, want)
	}

	rows, err := a.Attainment(ctx, adminRead, window)
	if err != nil {
		t.Fatal(err)
	}
	wantOrder := []struct {
		tenant, class, tier string
		share               float64 // -1: nothing judged
		kept                bool
	}{
		{"acme", ClassInteractive, "pro", 0.6, false}, // the worst first
		{"acme", ClassStandard, "pro", 1, true},
		{"cfg", ClassInteractive, "pro", 1, true},
		{"sus", ClassBatch, "free", -1, false}, // unjudged last
	}
	if len(rows) != len(wantOrder) {
		t.Fatalf("got %d rows %+v, want %d", len(rows), rows, len(wantOrder))
	}
	for i, w := range wantOrder {
		r := rows[i]
		share := -1.0
		if r.Share != nil {
			share = *r.Share
		}
		if r.Tenant != w.tenant || r.Class != w.class || r.Tier != w.tier || share != w.share || r.Kept != w.kept || r.Percentile != DefaultPercentile {
			t.Errorf("row %d: got %+v (share %v), want %s %s of tier %s, share %v, kept %v, percentile 99", i, r, share, w.tenant, w.class, w.tier, w.share, w.kept)
		}
	}

	if rows, err := a.Attainment(ctx, adminRead, AttainmentQuery{Tier: "free", From: window.From, To: window.To}); err != nil || len(rows) != 1 || rows[0].Tenant != "sus" {
		t.Errorf("tier free: got %+v, %v; want sus only", rows, err)
	}
	if rows, err := a.Attainment(ctx, adminRead, AttainmentQuery{From: hour0.Add(time.Hour), To: hour0.Add(2 * time.Hour)}); err != nil || len(rows) != 0 {
		t.Errorf("the next hour: got %+v, %v; want nothing", rows, err)
	}
	tenant := Actor{Name: "acme-key", TenantID: "cfg"}
	if rows, err := a.Attainment(ctx, tenant, window); err != nil || len(rows) != 1 || rows[0].Tenant != "cfg" {
		t.Errorf("a tenant's credential: got %+v, %v; want its own row only", rows, err)
	}
	if _, err := a.Attainment(ctx, tenant, AttainmentQuery{Tenant: "acme", From: window.From, To: window.To}); !errors.Is(err, ErrNotFound) {
		t.Errorf("a tenant's credential asking for another: got %v, want ErrNotFound", err)
	}
	if _, err := a.Attainment(ctx, adminRead, AttainmentQuery{From: window.To, To: window.From}); err == nil {
		t.Errorf("from after to: got no error")
	}
}

func TestLedgerWithRedisCountsVerdicts(t *testing.T) {
	srv := redistest.Start(t)
	s := openSQLite(t)
	l := NewLedger(UsageConfig{FlushInterval: 10 * time.Millisecond}, s, LedgerOptions{Redis: newRedisClient(t, srv)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.Run(ctx) }()
	judged(l, "acme", ClassInteractive, met, ttftLate, tpotSlow, unjudged)
	waitFor(t, "every request in the store", func() bool { return total(t, s, UsageQuery{}).Requests == 4 })
	cancel()
	<-done
	got := total(t, s, UsageQuery{})
	if got.TTFTMet != 2 || got.TTFTMissed != 1 || got.TPOTMet != 2 || got.TPOTMissed != 1 || got.ObjectivesMet != 1 || got.ObjectivesMissed != 2 {
		t.Errorf("got %+v, want ttft 2 met 1 missed, tpot 2 met 1 missed, both 1 met 2 missed", got)
	}
}
