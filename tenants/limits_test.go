package tenants

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/usherllm/usher/test/redistest"
)

func limitedPrincipal(tenant string, tier Tier) Principal {
	tier.setDefaults()
	return Principal{TenantID: tenant, Tier: tier.Name, TierSpec: &tier}
}

// limiterKinds runs a test against the local limiter and against one backed by a real
// redis-server.
var limiterKinds = []struct {
	name string
	new  func(t testing.TB, clock *fakeClock) *Limiter
}{
	{"local", func(t testing.TB, clock *fakeClock) *Limiter {
		return NewLimiter(LimitsConfig{}, LimiterOptions{Now: clock.Now})
	}},
	{"redis", func(t testing.TB, clock *fakeClock) *Limiter {
		return NewLimiter(LimitsConfig{}, LimiterOptions{Now: clock.Now, Redis: newRedisClient(t, redistest.Start(t))})
	}},
}

func newRedisClient(t testing.TB, srv *redistest.Server) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

func TestLimiterRequestsPerMinute(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			clock := newFakeClock()
			l := kind.new(t, clock)
			p := limitedPrincipal("acme", Tier{Name: "free", RequestsPerMinute: 3})
			ctx := context.Background()
			for i := range 3 {
				a, err := l.Admit(ctx, p, Demand{Model: "m"})
				if err != nil {
					t.Fatalf("request %d: got %v, want admitted", i, err)
				}
				if got := a.Quota.RemainingRequests; got != int64(2-i) {
					t.Errorf("request %d: remaining requests got %d, want %d", i, got, 2-i)
				}
				a.Done(10)
			}
			_, err := l.Admit(ctx, p, Demand{Model: "m"})
			var le *LimitError
			if !errors.As(err, &le) || !errors.Is(err, ErrRateLimited) || le.Limit != LimitRequests {
				t.Fatalf("got %v, want a requests_per_minute LimitError", err)
			}
			if le.RetryAfter < 19*time.Second || le.RetryAfter > 20*time.Second {
				t.Errorf("retry after: got %v, want 20s (one request of 3/min)", le.RetryAfter)
			}
			clock.Advance(le.RetryAfter)
			if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err != nil {
				t.Errorf("after retry-after: got %v, want admitted", err)
			}
		})
	}
}

func TestLimiterTokensReserveAndReconcile(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			clock := newFakeClock()
			l := kind.new(t, clock)
			p := limitedPrincipal("acme", Tier{Name: "pro", TokensPerMinute: 1000})
			ctx := context.Background()
			a, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 500})
			if err != nil {
				t.Fatal(err)
			}
			if a.Quota.RemainingTokens != 400 {
				t.Errorf("remaining tokens: got %d, want 400", a.Quota.RemainingTokens)
			}
			// The reservation holds: a second request of the same estimate does not fit.
			_, err = l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 500})
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != LimitTokens {
				t.Fatalf("got %v, want a tokens_per_minute LimitError", err)
			}
			if want := 12 * time.Second; le.RetryAfter < want-time.Second || le.RetryAfter > want {
				t.Errorf("retry after: got %v, want %v (200 tokens at 1000/min)", le.RetryAfter, want)
			}
			// Reconcile: only 150 tokens were really used, so 850 are left.
			a.Done(150)
			a.Done(150) // a second Done is ignored
			b, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 500})
			if err != nil {
				t.Fatalf("after reconcile: got %v, want admitted", err)
			}
			if b.Quota.RemainingTokens != 250 {
				t.Errorf("remaining tokens: got %d, want 250 (1000 - 150 used - 600 reserved)", b.Quota.RemainingTokens)
			}
			b.Done(2000) // more than reserved and more than the bucket: debt
			if _, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 1}); !errors.Is(err, ErrRateLimited) {
				t.Errorf("after overuse: got %v, want rate limited", err)
			}
			if _, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 800, MaxOutputTokens: 300}); err == nil {
				t.Error("estimate above tokens_per_minute: got admitted, want refused")
			}
		})
	}
}

func TestLimiterConcurrency(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			p := limitedPrincipal("acme", Tier{Name: "pro", MaxConcurrent: 2})
			ctx := context.Background()
			a1, err1 := l.Admit(ctx, p, Demand{Model: "m"})
			_, err2 := l.Admit(ctx, p, Demand{Model: "m"})
			if err1 != nil || err2 != nil {
				t.Fatalf("got %v, %v; want two admitted", err1, err2)
			}
			_, err := l.Admit(ctx, p, Demand{Model: "m"})
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != LimitConcurrency {
				t.Fatalf("third: got %v, want a max_concurrent LimitError", err)
			}
			a1.Done(0)
			if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err != nil {
				t.Errorf("after one finished: got %v, want admitted", err)
			}
			other := limitedPrincipal("globex", Tier{Name: "pro", MaxConcurrent: 2})
			if _, err := l.Admit(ctx, other, Demand{Model: "m"}); err != nil {
				t.Errorf("another tenant: got %v, want admitted", err)
			}
		})
	}
}

func TestLimiterModelAndPrompt(t *testing.T) {
	l := NewLimiter(LimitsConfig{}, LimiterOptions{})
	p := limitedPrincipal("acme", Tier{Name: "free", Models: []string{"llama*"}, MaxPromptTokens: 100})
	tests := []struct {
		name string
		d    Demand
		want error
	}{
		{"allowed", Demand{Model: "llama-3", PromptTokens: 100}, nil},
		{"model not allowed", Demand{Model: "gpt-4", PromptTokens: 1}, ErrModelNotAllowed},
		{"prompt too long", Demand{Model: "llama-3", PromptTokens: 101}, ErrPromptTooLong},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := l.Admit(context.Background(), p, tt.d)
			if !errors.Is(err, tt.want) && !(err == nil && tt.want == nil) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}

// TestLimiterConcurrentAdmissionsCannotOverrun admits from many goroutines at once: the sum of
// the reservations never exceeds the bucket.
func TestLimiterConcurrentAdmissionsCannotOverrun(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			p := limitedPrincipal("acme", Tier{Name: "pro", TokensPerMinute: 10_000})
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() {
					if _, err := l.Admit(context.Background(), p, Demand{Model: "m", PromptTokens: 250, MaxOutputTokens: 250}); err == nil {
						admitted.Add(1)
					}
				})
			}
			wg.Wait()
			if got := admitted.Load(); got != 20 {
				t.Errorf("got %d admitted, want 20 (10000 tokens / 500)", got)
			}
		})
	}
}

// TestLimiterSharedByReplicas runs two limiter instances, as two gateways would, against one
// real redis-server: together they admit exactly the tenant's limit.
func TestLimiterSharedByReplicas(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	a := NewLimiter(LimitsConfig{}, LimiterOptions{Now: clock.Now, Redis: newRedisClient(t, srv)})
	b := NewLimiter(LimitsConfig{}, LimiterOptions{Now: clock.Now, Redis: newRedisClient(t, srv)})
	p := limitedPrincipal("acme", Tier{Name: "free", RequestsPerMinute: 10, TokensPerMinute: 1_000_000})
	ctx := context.Background()
	admitted := map[string]int{}
	for i := range 30 {
		l, name := a, "a"
		if i%2 == 1 {
			l, name = b, "b"
		}
		if adm, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 10}); err == nil {
			admitted[name]++
			adm.Done(10)
		} else if !errors.Is(err, ErrRateLimited) {
			t.Fatalf("got %v, want nil or ErrRateLimited", err)
		}
	}
	if admitted["a"]+admitted["b"] != 10 || admitted["a"] == 0 || admitted["b"] == 0 {
		t.Errorf("got %v admitted, want 10 in total from both replicas", admitted)
	}
	if got := counterValue(a.redisFallbacks) + counterValue(b.redisFallbacks); got != 0 {
		t.Errorf("redis fallbacks: got %v, want 0", got)
	}
}

// TestLimiterFallsBackWhenRedisFails kills Redis mid-test: requests keep being decided, by the
// local buckets, and every fallback is counted.
func TestLimiterFallsBackWhenRedisFails(t *testing.T) {
	srv := redistest.Start(t)
	clock := newFakeClock()
	l := NewLimiter(LimitsConfig{RedisTimeout: 200 * time.Millisecond}, LimiterOptions{Now: clock.Now, Redis: newRedisClient(t, srv)})
	p := limitedPrincipal("acme", Tier{Name: "free", RequestsPerMinute: 2, MaxConcurrent: 10})
	ctx := context.Background()
	first, err := l.Admit(ctx, p, Demand{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	first.Done(1) // release fails: counted, not fatal
	for i := range 2 {
		a, err := l.Admit(ctx, p, Demand{Model: "m"})
		if err != nil {
			t.Fatalf("request %d with redis down: got %v, want admitted by the local limiter", i, err)
		}
		a.Done(1)
	}
	if _, err := l.Admit(ctx, p, Demand{Model: "m"}); !errors.Is(err, ErrRateLimited) {
		t.Errorf("third with redis down: got %v, want the local limit to hold", err)
	}
	if got := counterValue(l.redisFallbacks); got != 4 {
		t.Errorf("fallbacks: got %v, want 4 (one release, three decisions)", got)
	}
	srv.Restart()
	if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err != nil {
		t.Errorf("after redis restart: got %v, want admitted (fresh shared counters)", err)
	}
}

func BenchmarkLimiterAdmitDone(b *testing.B) {
	l := NewLimiter(LimitsConfig{}, LimiterOptions{})
	p := limitedPrincipal("acme", Tier{Name: "pro", RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50, MaxConcurrent: 1000})
	ctx := context.Background()
	d := Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 100}
	b.ReportAllocs()
	for b.Loop() {
		a, err := l.Admit(ctx, p, d)
		if err != nil {
			b.Fatal(err)
		}
		a.Done(150)
	}
}

// BenchmarkTenantCheck is the whole per-request tenant check for a cached stored key:
// authenticate, admit, done.
func BenchmarkTenantCheck(b *testing.B) {
	f := newDirectoryFixture(b, openSQLite(b), DirectoryOptions{})
	l := NewLimiter(LimitsConfig{}, LimiterOptions{})
	ctx := context.Background()
	d := Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 100}
	b.ReportAllocs()
	for b.Loop() {
		p, err := f.dir.Authenticate(ctx, f.key)
		if err != nil {
			b.Fatal(err)
		}
		a, err := l.Admit(ctx, p, d)
		if err != nil {
			b.Fatal(err)
		}
		a.Done(150)
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

func BenchmarkLimiterAdmitDoneRedis(b *testing.B) {
	l := NewLimiter(LimitsConfig{}, LimiterOptions{Redis: newRedisClient(b, redistest.Start(b))})
	p := limitedPrincipal("acme", Tier{Name: "pro", RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50, MaxConcurrent: 1000})
	ctx := context.Background()
	d := Demand{Model: "m", PromptTokens: 100, MaxOutputTokens: 100}
	b.ReportAllocs()
	for b.Loop() {
		a, err := l.Admit(ctx, p, d)
		if err != nil {
			b.Fatal(err)
		}
		a.Done(150)
	}
	if n := counterValue(l.redisFallbacks); n != 0 {
		b.Fatalf("got %v redis fallbacks, want 0", n)
	}
}
