package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// fakePool records what a reload asks of the pool.
type fakePool struct {
	specs   map[string]routing.WorkerSpec
	retired []string
	calls   []string
}

func (p *fakePool) Add(s routing.WorkerSpec) error {
	if s.URL == "http://refused" {
		return errors.New("worker.url: refused")
	}
	if _, ok := p.specs[s.ID]; ok {
		return fmt.Errorf("worker %q: %w", s.ID, routing.ErrWorkerExists)
	}
	p.specs[s.ID] = s
	p.calls = append(p.calls, "add "+s.ID)
	return nil
}

func (p *fakePool) Replace(s routing.WorkerSpec) error {
	if _, ok := p.specs[s.ID]; !ok {
		return routing.ErrUnknownWorker
	}
	p.specs[s.ID] = s
	p.retired = slices.DeleteFunc(p.retired, func(id string) bool { return id == s.ID })
	p.calls = append(p.calls, "replace "+s.ID)
	return nil
}

func (p *fakePool) Retire(id string) error {
	p.retired = append(p.retired, id)
	p.calls = append(p.calls, "retire "+id)
	return nil
}

// fakeTiers refuses a set without the tier "pro".
type fakeTiers struct{ tiers []tenants.Tier }

func (f *fakeTiers) SetTiers(tiers []tenants.Tier, _ string) error {
	if !slices.ContainsFunc(tiers, func(t tenants.Tier) bool { return t.Name == "pro" }) {
		return errors.New(`tenant "cfg": tier "pro" is not declared`)
	}
	f.tiers = tiers
	return nil
}

func TestReloaderApply(t *testing.T) {
	w := func(id, url string) routing.WorkerSpec {
		return routing.WorkerSpec{ID: id, URL: url, Models: []string{"m"}}
	}
	cfgWith := func(tiers []string, workers ...routing.WorkerSpec) Config {
		var c Config
		for _, name := range tiers {
			c.Tenants.Tiers = append(c.Tenants.Tiers, tenants.Tier{Name: name})
		}
		c.Routing.Workers = workers
		return c
	}
	start := cfgWith([]string{"pro"}, w("a", "http://a"), w("b", "http://b"))
	tests := []struct {
		name      string
		next      []Config
		wantCalls []string
		wantTiers int
		wantLog   string
	}{
		{"nothing changed", []Config{start}, nil, 1, "workers_added=0"},
		{"add, change, remove", []Config{cfgWith([]string{"pro", "free"}, w("a", "http://a2"), w("c", "http://c"))},
			[]string{"replace a", "add c", "retire b"}, 2, "workers_retired=1"},
		{"tiers refused: nothing changes", []Config{cfgWith([]string{"free"}, w("c", "http://c"))},
			nil, 1, "config reload refused"},
		{"removed then declared again", []Config{cfgWith([]string{"pro"}, w("a", "http://a")), start},
			[]string{"retire b", "replace b"}, 1, "workers_added=1"},
		{"a worker refused is tried again at the next reload", []Config{cfgWith([]string{"pro"}, w("a", "http://a"), w("b", "http://b"), w("c", "http://refused")),
			cfgWith([]string{"pro"}, w("a", "http://a"), w("b", "http://b"), w("c", "http://c"))},
			[]string{"add c"}, 1, `worker not added" worker=c`},
		{"other sections wait for a restart", []Config{func() Config { c := start; c.Server.Listen = "x:1"; return c }()},
			nil, 1, "sections=[server]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := &fakePool{specs: map[string]routing.WorkerSpec{"a": w("a", "http://a"), "b": w("b", "http://b")}}
			tiers := &fakeTiers{tiers: start.Tenants.Tiers}
			var logs bytes.Buffer
			r := &reloader{running: start, pool: pool, tiers: tiers, logger: slog.New(slog.NewTextHandler(&logs, nil))}
			for _, next := range tt.next {
				r.apply(next)
			}
			if !slices.Equal(pool.calls, tt.wantCalls) {
				t.Errorf("pool calls: got %v, want %v", pool.calls, tt.wantCalls)
			}
			if len(tiers.tiers) != tt.wantTiers {
				t.Errorf("tiers: got %d, want %d", len(tiers.tiers), tt.wantTiers)
			}
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("logs do not contain %q:\n%s", tt.wantLog, logs.String())
			}
		})
	}
}
