package tenants

import (
	"context"
	"errors"
	"math"
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
// the reservations never exceeds the bucket. Redis gets a round-trip bound far above any
// machine's stall: 50 admissions at once on a loaded 2-core CI machine took some past the
// default 100 ms, and those the local buckets decided, as they should when Redis is slow
// (TestLimiterFallsBackWhenRedisFails tests that), so this test, about Redis's
// own atomicity, saw 23 admitted.
func TestLimiterConcurrentAdmissionsCannotOverrun(t *testing.T) {
	kinds := map[string]func(t testing.TB) *Limiter{
		"local": func(testing.TB) *Limiter { return NewLimiter(LimitsConfig{}, LimiterOptions{Now: newFakeClock().Now}) },
		"redis": func(t testing.TB) *Limiter {
			return NewLimiter(LimitsConfig{RedisTimeout: 30 * time.Second},
				LimiterOptions{Now: newFakeClock().Now, Redis: newRedisClient(t, redistest.Start(t))})
		},
	}
	for name, newLimiter := range kinds {
		t.Run(name, func(t *testing.T) {
			l := newLimiter(t)
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

// TestLimiterHugeDemandsSaturate is issue 10's item 6: max_tokens = 2^63-1 once wrapped the
// estimate to a negative number that passed tokens_per_minute. Every sum saturates now, the
// request is refused, and no remaining count in the quota goes negative.
func TestLimiterHugeDemandsSaturate(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			p := limitedPrincipal("acme", Tier{Name: "pro", RequestsPerMinute: 100, TokensPerMinute: 1000})
			ctx := context.Background()
			for _, d := range []Demand{
				{Model: "m", PromptTokens: 10, MaxOutputTokens: math.MaxInt64},
				{Model: "m", PromptTokens: math.MaxInt64, MaxOutputTokens: math.MaxInt64},
				{Model: "m", PromptTokens: math.MaxInt64, MaxOutputTokens: -1},
				{Model: "m", PromptTokens: math.MinInt64, MaxOutputTokens: math.MaxInt64 - 5},
			} {
				_, err := l.Admit(ctx, p, d)
				var le *LimitError
				if !errors.As(err, &le) || le.Limit != LimitTokens {
					t.Errorf("%+v: got %v, want refused by tokens_per_minute", d, err)
					continue
				}
				if le.Quota.RemainingTokens < 0 || le.Quota.RemainingRequests < 0 || le.RetryAfter < 0 {
					t.Errorf("%+v: got quota %+v, retry after %v; want nothing negative", d, le.Quota, le.RetryAfter)
				}
			}
			a, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 10, MaxOutputTokens: 10})
			if err != nil {
				t.Fatal(err)
			}
			a.Done(math.MaxInt64) // a worker reporting absurd usage: one bucket of debt, no wrap
			_, err = l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 1, MaxOutputTokens: 1})
			var le *LimitError
			if !errors.As(err, &le) {
				t.Fatalf("after absurd usage: got %v, want refused", err)
			}
			if q := le.Quota; q.RemainingTokens < 0 || q.RemainingTokens > q.LimitTokens || q.ResetTokens < 0 || q.ResetTokens > 2*time.Minute {
				t.Errorf("after absurd usage: got quota %+v; want 0 <= remaining <= limit and a reset of at most 2m", q)
			}
		})
	}
}

// TestLimiterLoweredTierHasItsOwnCounters is issue 10's item 11: a credential that lowers the
// tenant to a smaller tier (a JWT tier claim) used to share the tenant's counters with its
// traffic at the full tier, and was starved by it. Counters are per tenant and tier now.
func TestLimiterLoweredTierHasItsOwnCounters(t *testing.T) {
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			full := limitedPrincipal("acme", Tier{Name: "enterprise", MaxConcurrent: 10, RequestsPerMinute: 10})
			lowered := limitedPrincipal("acme", Tier{Name: "free", MaxConcurrent: 2, RequestsPerMinute: 5})
			ctx := context.Background()
			for i := range 10 {
				if _, err := l.Admit(ctx, full, Demand{Model: "m"}); err != nil {
					t.Fatalf("full tier, request %d: got %v, want admitted", i, err)
				}
			}
			for i := range 2 {
				if _, err := l.Admit(ctx, lowered, Demand{Model: "m"}); err != nil {
					t.Fatalf("lowered tier beside a busy full tier, request %d: got %v, want admitted", i, err)
				}
			}
			var le *LimitError
			if _, err := l.Admit(ctx, lowered, Demand{Model: "m"}); !errors.As(err, &le) || le.Limit != LimitConcurrency {
				t.Errorf("lowered tier, third at once: got %v, want its own max_concurrent of 2", err)
			}
		})
	}
}

// loweredPrincipal is p of tenant at tier lower, below its tenant's tier full, as Directory
// builds it for a key minted at lower or a JWT tier claim.
func loweredPrincipal(tenant string, full, lower Tier) Principal {
	p := limitedPrincipal(tenant, lower)
	p.TenantTier = limitedPrincipal(tenant, full).TierSpec
	return p
}

// TestLimiterLoweredKeysShareTheTenantsLimits is issue 26's item 9: counters were per tenant
// and tier, so a pro tenant with max_concurrent 2 and self-minted keys at two lower tiers ran 6
// requests at once. A lowered credential counts against its tenant's limits too, and keeps its
// own (issue 10's item 11, TestLimiterLoweredTierHasItsOwnCounters): the tenant's traffic at
// its full tier does not use up the lowered tier's counters.
func TestLimiterLoweredKeysShareTheTenantsLimits(t *testing.T) {
	pro := Tier{Name: "pro", MaxConcurrent: 2, RequestsPerMinute: 100}
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			ctx := context.Background()
			credentials := []Principal{
				limitedPrincipal("acme", pro),
				loweredPrincipal("acme", pro, Tier{Name: "free", MaxConcurrent: 2, RequestsPerMinute: 60}),
				loweredPrincipal("acme", pro, Tier{Name: "small", MaxConcurrent: 1, RequestsPerMinute: 10}),
			}
			admitted := 0
			var holds []*Hold
			for range 2 {
				for _, p := range credentials {
					h, err := l.Admit(ctx, p, Demand{Model: "m"})
					var le *LimitError
					switch {
					case err == nil:
						admitted++
						holds = append(holds, h)
					case !errors.As(err, &le) || le.Limit != LimitConcurrency:
						t.Fatalf("%s: got %v, want admitted or refused by max_concurrent", p.Tier, err)
					}
				}
			}
			if admitted != 2 {
				t.Errorf("pro tenant (max_concurrent 2) with keys at three tiers: %d at once, want 2", admitted)
			}
			for _, h := range holds {
				h.Done(0)
			}

			// The tenant's full-tier traffic leaves the lowered tier's own counters alone; the
			// lowered tier's own limit still binds while the tenant has room, and a request it
			// refuses gives back what it took of the tenant's requests per minute.
			full := limitedPrincipal("globex", Tier{Name: "enterprise", MaxConcurrent: 10, RequestsPerMinute: 8})
			lowered := loweredPrincipal("globex", *full.TierSpec, Tier{Name: "free", MaxConcurrent: 2, RequestsPerMinute: 100})
			for i := range 4 {
				if _, err := l.Admit(ctx, full, Demand{Model: "m"}); err != nil {
					t.Fatalf("full tier, request %d: got %v, want admitted", i, err)
				}
			}
			for i := range 2 {
				if _, err := l.Admit(ctx, lowered, Demand{Model: "m"}); err != nil {
					t.Fatalf("lowered tier beside 4 of the tenant's 10, request %d: got %v, want admitted", i, err)
				}
			}
			var le *LimitError
			for i := range 5 {
				if _, err := l.Admit(ctx, lowered, Demand{Model: "m"}); !errors.As(err, &le) || le.Limit != LimitConcurrency || le.Quota.LimitRequests != 100 {
					t.Fatalf("lowered tier, third at once (try %d): got %v, want its own max_concurrent of 2", i, err)
				}
			}
			for i := range 2 {
				if _, err := l.Admit(ctx, full, Demand{Model: "m"}); err != nil {
					t.Fatalf("full tier, request %d of its 8 a minute: got %v, want admitted (the refused lowered requests gave theirs back)", 7+i, err)
				}
			}
			if _, err := l.Admit(ctx, full, Demand{Model: "m"}); !errors.As(err, &le) || le.Limit != LimitRequests {
				t.Errorf("full tier, request 9 of 8 a minute: got %v, want requests_per_minute", err)
			}
		})
	}
}

// TestLimiterOutageEnforcesReplicaShare shows the documented Redis-outage behaviour: each
// replica enforces the limit divided by the replicas it last saw through Redis, so two replicas
// cut from Redis admit the limit between them, not twice the limit.
func TestLimiterOutageEnforcesReplicaShare(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	clock := newFakeClock()
	newReplica := func(id string) *Limiter {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
		t.Cleanup(func() { rdb.Close() })
		return NewLimiter(LimitsConfig{}, LimiterOptions{Now: clock.Now, Redis: rdb, ReplicaID: id})
	}
	replicas := []*Limiter{newReplica("a"), newReplica("b")}
	p := limitedPrincipal("acme", Tier{Name: "free", RequestsPerMinute: 10})
	ctx := context.Background()
	for range 2 { // the second round lets each replica count the other
		for _, l := range replicas {
			if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err != nil {
				t.Fatal(err)
			}
		}
		clock.Advance(time.Second)
	}
	for i, l := range replicas {
		if got := l.replicas.Load(); got != 2 {
			t.Fatalf("replica %d: got %d replicas seen, want 2", i, got)
		}
	}
	proxy.Cut()
	admitted := 0
	for i, l := range replicas {
		n := 0
		for range 20 {
			if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err == nil {
				n++
			}
		}
		if n != 5 {
			t.Errorf("replica %d during the outage: got %d admitted, want 5 (10 per minute / 2 replicas)", i, n)
		}
		admitted += n
	}
	if admitted > 10 {
		t.Errorf("fleet during the outage: got %d admitted, want at most the limit of 10", admitted)
	}
}

// TestLimiterConcurrencyComesBackAfterRedisCut is issue 10's item 5: releases lost to a short
// Redis cut left concurrency slots held in Redis, and each refused retry extended their expiry,
// so the tenant got 429 max_concurrent for minutes with nothing in flight. Slots are leases now:
// after a 2 s cut under load, the tenant's whole concurrency is back within 10 s.
func TestLimiterConcurrencyComesBackAfterRedisCut(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { rdb.Close() })
	l := NewLimiter(LimitsConfig{}, LimiterOptions{Redis: rdb}) // default lease TTL, real clock
	const maxc = 4
	p := limitedPrincipal("acme", Tier{Name: "pro", MaxConcurrent: maxc, TokensPerMinute: 1 << 40})
	ctx := context.Background()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range maxc {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if a, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 100}); err == nil {
					time.Sleep(50 * time.Millisecond)
					a.Done(150)
				} else {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	proxy.Cut()
	time.Sleep(2 * time.Second)
	proxy.Restore()
	restored := time.Now()
	close(stop)
	wg.Wait()

	for {
		var held []*Hold
		for range maxc {
			if a, err := l.Admit(ctx, p, Demand{Model: "m", PromptTokens: 100}); err == nil && a.bucket == nil {
				held = append(held, a)
			}
		}
		for _, a := range held {
			a.Done(0)
		}
		if len(held) == maxc {
			t.Logf("all %d slots back through redis %v after the cut ended", maxc, time.Since(restored).Round(10*time.Millisecond))
			return
		}
		if time.Since(restored) > 10*time.Second {
			t.Fatalf("10s after the cut: got %d of %d concurrency slots, want all", len(held), maxc)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLimiterRenewsLeasesOfLongRequests holds a request far longer than the lease TTL: its
// replica renews the lease, so the slot stays taken for every replica until Done.
func TestLimiterRenewsLeasesOfLongRequests(t *testing.T) {
	srv := redistest.Start(t)
	cfg := LimitsConfig{LeaseTTL: time.Second}
	a := NewLimiter(cfg, LimiterOptions{Redis: newRedisClient(t, srv)})
	b := NewLimiter(cfg, LimiterOptions{Redis: newRedisClient(t, srv)})
	p := limitedPrincipal("acme", Tier{Name: "pro", MaxConcurrent: 1})
	ctx := context.Background()
	long, err := a.Admit(ctx, p, Demand{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if _, err := b.Admit(ctx, p, Demand{Model: "m"}); !errors.Is(err, ErrRateLimited) {
		t.Fatalf("3 lease TTLs into a long request: got %v, want its slot still held", err)
	}
	long.Done(0)
	if got, err := b.Admit(ctx, p, Demand{Model: "m"}); err != nil {
		t.Fatalf("after Done: got %v, want admitted", err)
	} else {
		got.Done(0)
	}
	a.leaseMu.Lock()
	defer a.leaseMu.Unlock()
	if len(a.live) != 0 {
		t.Errorf("got %d live leases after Done, want 0", len(a.live))
	}
}

// TestLoweredKeysOfOneTenantShareItsConcurrency is issue 26's item 9 as a tenant does it: a pro
// tenant with max_concurrent 2 mints keys at two lower tiers (each within pro) and a JWT claims
// a third; together they run 2 at once, as the tenant's own key does.
func TestLoweredKeysOfOneTenantShareItsConcurrency(t *testing.T) {
	ctx := context.Background()
	cfg := Config{Tiers: []Tier{
		{Name: "pro", MaxConcurrent: 2, Weight: 4},
		{Name: "free", MaxConcurrent: 2, Weight: 1},
		{Name: "small", MaxConcurrent: 1, Weight: 1},
	}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s := openSQLite(t)
	if _, err := s.CreateTenant(ctx, "test", Tenant{ID: "acme", Tier: "pro"}); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, tier := range []string{"", "free", "small"} {
		_, key, err := s.CreateKey(ctx, "test", "acme", NewKey{Name: "k" + tier, Tier: tier})
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, key)
	}
	dir, err := NewDirectory(ctx, cfg, s, DirectoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range limiterKinds {
		t.Run(kind.name, func(t *testing.T) {
			l := kind.new(t, newFakeClock())
			running := 0
			for range 2 {
				for _, key := range keys {
					p, err := dir.Authenticate(ctx, key)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := l.Admit(ctx, p, Demand{Model: "m"}); err == nil {
						running++
					}
				}
			}
			if running != 2 {
				t.Errorf("a pro tenant (max_concurrent 2) through keys at pro, free and small: %d at once, want 2", running)
			}
		})
	}
}
