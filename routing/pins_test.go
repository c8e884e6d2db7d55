package routing

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/usherllm/usher/test/redistest"
)

func newRedisClient(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestPinStores holds both PinStore implementations to one contract.
func TestPinStores(t *testing.T) {
	stores := []struct {
		name string
		new  func(t *testing.T) PinStore
	}{
		{name: "memory", new: func(*testing.T) PinStore { return NewMemoryPinStore(nil, 0) }},
		{name: "redis", new: func(t *testing.T) PinStore { return NewRedisStore(newRedisClient(t, redistest.Start(t)), 0) }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			ctx := context.Background()
			s := st.new(t)
			k := PinKey{Model: "org/m:7b", Tenant: "acme:eu", Key: "sess%1"}
			if got, err := s.Get(ctx, k, time.Hour); err != nil || got != "" {
				t.Fatalf("Get of a missing pin: got %q, %v; want \"\", nil", got, err)
			}
			if got, err := s.Claim(ctx, k, "", "w1", time.Hour); err != nil || got != "w1" {
				t.Fatalf("first Claim: got %q, %v; want w1", got, err)
			}
			if got, _ := s.Claim(ctx, k, "", "w2", time.Hour); got != "w1" {
				t.Errorf("Claim of a pinned key expecting none: got %q, want the existing w1", got)
			}
			if got, _ := s.Claim(ctx, k, "w1", "w2", time.Hour); got != "w2" {
				t.Errorf("Claim moving w1 to w2: got %q, want w2", got)
			}
			if got, _ := s.Get(ctx, k, time.Hour); got != "w2" {
				t.Errorf("Get: got %q, want w2", got)
			}
			other := PinKey{Model: "org/m:7b", Tenant: "beta", Key: "k"}
			if err := s.Set(ctx, other, "w1", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := s.Set(ctx, PinKey{Model: "n", Tenant: "acme:eu", Key: "k"}, "w2", time.Minute); err != nil {
				t.Fatal(err)
			}
			filters := []struct {
				f    PinFilter
				want []string // keys as tenant/key
			}{
				{f: PinFilter{}, want: []string{"acme:eu/sess%1", "beta/k", "acme:eu/k"}},
				{f: PinFilter{Model: "org/m:7b"}, want: []string{"acme:eu/sess%1", "beta/k"}},
				{f: PinFilter{Tenant: "acme:eu"}, want: []string{"acme:eu/k", "acme:eu/sess%1"}},
				{f: PinFilter{Worker: "w1"}, want: []string{"beta/k"}},
			}
			for _, ft := range filters {
				pins, err := s.List(ctx, ft.f)
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for _, p := range pins {
					got = append(got, p.Tenant+"/"+p.Key)
					if p.TTL <= 0 || p.TTL > time.Hour {
						t.Errorf("pin %v: got TTL %s, want within (0, 1h]", p.PinKey, p.TTL)
					}
				}
				if !sameSet(got, ft.want) {
					t.Errorf("List(%+v): got %v, want %v", ft.f, got, ft.want)
				}
			}
			if err := s.Delete(ctx, k); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.Get(ctx, k, time.Hour); got != "" {
				t.Errorf("Get after Delete: got %q, want none", got)
			}
		})
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	m := map[string]int{}
	for _, s := range a {
		m[s]++
	}
	for _, s := range b {
		m[s]--
	}
	for _, n := range m {
		if n != 0 {
			return false
		}
	}
	return true
}

func TestMemoryPinStoreSlidingTTL(t *testing.T) {
	clock := newFakeClock()
	s := NewMemoryPinStore(clock.Now, 0)
	ctx := context.Background()
	k := PinKey{Model: "m", Tenant: "t", Key: "s"}
	_ = s.Set(ctx, k, "w1", time.Minute)
	for range 5 {
		clock.Advance(50 * time.Second)
		if got, _ := s.Get(ctx, k, time.Minute); got != "w1" {
			t.Fatalf("pin used every 50s with a 1m TTL: got %q, want w1", got)
		}
	}
	clock.Advance(time.Minute)
	if got, _ := s.Get(ctx, k, time.Minute); got != "" {
		t.Errorf("after a minute unused: got %q, want expired", got)
	}
}

func TestRedisPinKeyRoundTrip(t *testing.T) {
	for _, k := range []PinKey{{"m", "t", "k"}, {"a:b", "%3A", "::"}, {"", "", ""}} {
		got, ok := parseRedisPinKey(redisPinKey(k))
		if !ok || got != k {
			t.Errorf("key %+v: got %+v (ok=%v) back", k, got, ok)
		}
	}
}

// TestPinStoresPage holds both stores to the paging contract: pages in order, none missed or
// repeated, a worker filter that leaves a store page short still fills the page, and the key
// filter.
func TestPinStoresPage(t *testing.T) {
	stores := []struct {
		name string
		new  func(t *testing.T) PinStore
	}{
		{name: "memory", new: func(*testing.T) PinStore { return NewMemoryPinStore(nil, 0) }},
		{name: "redis", new: func(t *testing.T) PinStore { return NewRedisStore(newRedisClient(t, redistest.Start(t)), 0) }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			ctx := context.Background()
			s := st.new(t)
			const n = 1000 // w1 holds every tenth pin: 100 of them
			for i := range n {
				w := "w2"
				if i%10 == 0 {
					w = "w1"
				}
				if err := s.Set(ctx, PinKey{Model: "m", Tenant: "t", Key: fmt.Sprintf("s%04d", i)}, w, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range []struct {
				worker string
				want   int
			}{{"", n}, {"w1", n / 10}} {
				var seen []string
				f := PinFilter{Worker: c.worker, Limit: 30} // 30 of w1 span more than one store page (256 keys)
				for pages := 0; ; pages++ {
					if pages > n {
						t.Fatal("paging does not end")
					}
					page, err := s.List(ctx, f)
					if err != nil {
						t.Fatal(err)
					}
					if len(page) > f.Limit {
						t.Fatalf("a page of %d pins, limit %d", len(page), f.Limit)
					}
					for _, p := range page {
						seen = append(seen, p.Key)
					}
					if len(page) < f.Limit {
						break
					}
					f.After = &page[len(page)-1].PinKey
				}
				if len(seen) != c.want || !slices.IsSorted(seen) || len(slices.Compact(slices.Clone(seen))) != c.want {
					t.Errorf("worker %q: paged through %d pins (sorted %v), want %d distinct in order", c.worker, len(seen), slices.IsSorted(seen), c.want)
				}
			}
			got, err := s.List(ctx, PinFilter{Key: "s0420"})
			if err != nil || len(got) != 1 || got[0].Worker != "w1" {
				t.Errorf("List by key: got %v, %v; want s0420 on w1", got, err)
			}
		})
	}
}

// A tenant's pins are bounded (issue 26, weak spot: 100,000 distinct session ids held 89 MB for
// the pin TTL): past MaxPinsPerTenant, every model's together, a new pin replaces that tenant's
// least recently used one; another tenant's pins stay.
func TestPinsPerTenantAreBounded(t *testing.T) {
	const bound = 50
	stores := []struct {
		name string
		new  func(t *testing.T) PinStore
	}{
		{name: "memory", new: func(*testing.T) PinStore { return NewMemoryPinStore(nil, bound) }},
		{name: "redis", new: func(t *testing.T) PinStore { return NewRedisStore(newRedisClient(t, redistest.Start(t)), bound) }},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			ctx := context.Background()
			s := st.new(t)
			victim := PinKey{Model: "m", Tenant: "victim", Key: "s"}
			if err := s.Set(ctx, victim, "w1", time.Hour); err != nil {
				t.Fatal(err)
			}
			used := PinKey{Model: "m", Tenant: "a", Key: "used"}
			if _, err := s.Claim(ctx, used, "", "w1", time.Hour); err != nil {
				t.Fatal(err)
			}
			for i := range 2000 {
				k := PinKey{Model: []string{"m", "n"}[i%2], Tenant: "a", Key: fmt.Sprintf("s%d", i)}
				if i%2 == 0 {
					_, err := s.Claim(ctx, k, "", "w2", time.Hour)
					if err != nil {
						t.Fatal(err)
					}
				} else if err := s.Set(ctx, k, "w2", time.Hour); err != nil {
					t.Fatal(err)
				}
				if i%10 == 0 {
					if got, err := s.Get(ctx, used, time.Hour); err != nil || got != "w1" {
						t.Fatalf("the tenant's session in use: got %q, %v; want w1", got, err)
					}
				}
			}
			pins, err := s.List(ctx, PinFilter{Tenant: "a"})
			if err != nil {
				t.Fatal(err)
			}
			if len(pins) != bound {
				t.Fatalf("tenant a holds %d pins after 2,001, want %d", len(pins), bound)
			}
			kept := map[string]bool{}
			for _, p := range pins {
				kept[p.Key] = true
			}
			if !kept["used"] || !kept["s1999"] || kept["s0"] {
				t.Errorf("kept %v: want the session in use and the newest, not the oldest", slices.Sorted(maps.Keys(kept)))
			}
			if got, _ := s.Get(ctx, victim, time.Hour); got != "w1" {
				t.Errorf("another tenant's pin: got %q, want w1", got)
			}
			if err := s.Delete(ctx, used); err != nil {
				t.Fatal(err)
			}
			if got, _ := s.Get(ctx, used, time.Hour); got != "" {
				t.Errorf("a deleted pin: got %q, want none", got)
			}
		})
	}
}
