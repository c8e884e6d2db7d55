package tenants

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/usherllm/usher/test/redistest"
)

func budgetPrincipal(b Budget) Principal {
	t := &Tier{Name: "metered", Budget: b}
	t.setDefaults()
	return Principal{TenantID: "acme", Tier: t.Name, TierSpec: t}
}

// spendAll admits and charges requests of tokens each until one is refused; it returns the
// tokens charged and the refusal.
func spendAll(t *testing.T, bs []*Budgets, p Principal, tokens int64) (int64, *BudgetError) {
	t.Helper()
	var charged int64
	for i := 0; i < 1000; i++ {
		s, err := bs[i%len(bs)].Check(context.Background(), p)
		var be *BudgetError
		if errors.As(err, &be) {
			return charged, be
		}
		if err != nil || s == nil {
			t.Fatalf("check %d: %v, %v", i, s, err)
		}
		s.Done(tokens)
		charged += tokens
	}
	t.Fatal("never refused")
	return 0, nil
}

func TestBudgetStopsATenantAtItsCapUntilThePeriodEnds(t *testing.T) {
	for _, withRedis := range []bool{false, true} {
		name := "local"
		if withRedis {
			name = "redis"
		}
		t.Run(name, func(t *testing.T) {
			store := openSQLite(t)
			now := time.Date(2026, 11, 23, 15, 30, 0, 0, time.UTC)
			opts := BudgetsOptions{Store: store, Now: func() time.Time { return now }}
			replicas := []*Budgets{NewBudgets(opts)}
			if withRedis { // two replicas on one Redis, taking turns
				srv := redistest.Start(t)
				opts.Redis = newRedisClient(t, srv)
				replicas = []*Budgets{NewBudgets(opts), NewBudgets(opts)}
			}
			p := budgetPrincipal(Budget{TokensPerDay: 1000, RequestsPerMonth: 500})
			charged, be := spendAll(t, replicas, p, 30)
			if charged < 1000 || charged >= 1000+30 {
				t.Errorf("charged %d tokens before the refusal, want within one request (30) over 1000", charged)
			}
			if be.Cap != "tokens_per_day" || !be.Reset.Equal(time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)) || be.RetryAfter != 8*time.Hour+30*time.Minute {
				t.Errorf("refusal: got %+v, want tokens_per_day resetting at midnight UTC", be)
			}
			crossed := 0.0
			for _, b := range replicas {
				crossed += testutil.ToFloat64(b.softCrossed.WithLabelValues("tokens_per_day"))
			}
			if crossed != 1 {
				t.Errorf("soft threshold metric: got %v in all, want 1", crossed)
			}
			page, err := store.Audit(context.Background(), AuditQuery{TenantID: "acme"})
			if err != nil || len(page.Entries) != 1 || page.Entries[0].Action != "budget.soft_threshold" {
				t.Errorf("audit: got %+v, %v; want one budget.soft_threshold entry", page, err)
			}
			// The next day the day's cap is whole again; the month's requests still count.
			now = now.Add(9 * time.Hour)
			if s, err := replicas[len(replicas)-1].Check(context.Background(), p); err != nil || s == nil {
				t.Fatalf("the next day: %v, %v; want admitted", s, err)
			}
		})
	}
}

func TestBudgetStartsFromTheLedger(t *testing.T) {
	store := openSQLite(t)
	now := time.Date(2026, 11, 23, 15, 30, 0, 0, time.UTC)
	ctx := context.Background()
	rows := map[UsageKey]UsageCounts{
		{Tenant: "acme", Key: "k", Model: "m", Class: "standard", Start: hourOf(now)}:                   {Requests: 3, PromptTokens: 100, CompletionTokens: 900},
		{Tenant: "acme", Key: "k", Model: "m", Class: "standard", Start: hourOf(now.AddDate(0, 0, -1))}: {Requests: 1, CompletionTokens: 5000},
	}
	if err := store.AddUsage(ctx, "", rows); err != nil {
		t.Fatal(err)
	}
	b := NewBudgets(BudgetsOptions{Store: store, Now: func() time.Time { return now }})
	if _, err := b.Check(ctx, budgetPrincipal(Budget{TokensPerDay: 1000})); !errors.Is(err, ErrBudgetExceeded) {
		t.Errorf("1000 tokens in today's ledger, cap 1000: got %v, want ErrBudgetExceeded", err)
	}
	if _, err := b.Check(ctx, budgetPrincipal(Budget{TokensPerDay: 1001})); err != nil {
		t.Errorf("cap 1001: got %v, want admitted (yesterday does not count)", err)
	}
	if _, err := b.Check(ctx, budgetPrincipal(Budget{TokensPerMonth: 6000})); !errors.Is(err, ErrBudgetExceeded) {
		t.Errorf("6000 tokens this month, cap 6000: got %v, want ErrBudgetExceeded", err)
	}
}

func TestNoBudgetCostsNothing(t *testing.T) {
	b := NewBudgets(BudgetsOptions{})
	if s, err := b.Check(context.Background(), budgetPrincipal(Budget{})); s != nil || err != nil {
		t.Errorf("no budget: got %v, %v; want nil, nil", s, err)
	}
	var s *Spend
	s.Done(10) // nil-safe
}
