package routing

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeResolver answers from a table that tests change; safe for concurrent use.
type fakeResolver struct {
	mu      sync.Mutex // guards answers and lookups
	answers map[string][]string
	err     error // returned instead of an answer when set
	lookups int
}

func (r *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lookups++
	if r.err != nil {
		return nil, r.err
	}
	addrs, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(addrs), nil
}

func (r *fakeResolver) set(host string, addrs []string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if addrs == nil {
		delete(r.answers, host)
	} else {
		r.answers[host] = addrs
	}
	r.err = err
}

func workerIDs(p *Pool) []string {
	var ids []string
	for _, w := range p.Workers() {
		ids = append(ids, w.ID+":"+string(w.State))
	}
	slices.Sort(ids)
	return ids
}

func TestDiscoveryFollowsDNS(t *testing.T) {
	const name = "vllm.inference.svc.cluster.local"
	res := &fakeResolver{answers: map[string][]string{}}
	dc := DiscoveryConfig{Name: name, Port: 8000, Models: []string{"m"}}
	p, err := NewPool(Config{Discovery: []DiscoveryConfig{dc}, Workers: testWorkers(1, "m")}, Options{Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	d := &discovery{cfg: p.cfg.Discovery[0], found: map[string]bool{}}
	var held *Lease
	steps := []struct {
		name   string
		addrs  []string
		err    error
		before func(t *testing.T)
		want   []string
	}{
		{"two pods", []string{"10.0.0.1", "10.0.0.2"}, nil, nil,
			[]string{"vllm-8000-10.0.0.1:healthy", "vllm-8000-10.0.0.2:healthy", "w0:healthy"}},
		{"DNS down: nothing changes", nil, errors.New("i/o timeout"), nil,
			[]string{"vllm-8000-10.0.0.1:healthy", "vllm-8000-10.0.0.2:healthy", "w0:healthy"}},
		{"one pod gone while busy: drained, kept until empty", []string{"10.0.0.2", "fd00::3"}, nil, func(t *testing.T) {
			held, err = p.Pick(context.Background(), &Request{Model: "m", TargetWorker: "vllm-8000-10.0.0.1"})
			if err != nil {
				t.Fatal(err)
			}
		}, []string{"vllm-8000-10.0.0.1:draining", "vllm-8000-10.0.0.2:healthy", "vllm-8000-fd00__3:healthy", "w0:healthy"}},
		{"back before it was removed: kept", []string{"10.0.0.1", "10.0.0.2", "fd00::3"}, nil, nil,
			[]string{"vllm-8000-10.0.0.1:healthy", "vllm-8000-10.0.0.2:healthy", "vllm-8000-fd00__3:healthy", "w0:healthy"}},
		{"name gone: all drained, removed once empty", nil, nil, func(t *testing.T) {
			held.Release(Outcome{})
		}, []string{"w0:healthy"}},
		{"back again: added afresh", []string{"10.0.0.2"}, nil, nil,
			[]string{"vllm-8000-10.0.0.2:healthy", "w0:healthy"}},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			if st.before != nil {
				st.before(t)
			}
			res.set(name, st.addrs, st.err)
			p.discover(context.Background(), d)
			p.removeRetired(context.Background())
			if got := workerIDs(p); !slices.Equal(got, st.want) {
				t.Fatalf("workers: got %v, want %v", got, st.want)
			}
		})
	}
	if w, _ := p.Worker("vllm-8000-10.0.0.2"); w.URL != "http://10.0.0.2:8000" {
		t.Fatalf("URL: got %q, want http://10.0.0.2:8000", w.URL)
	}
}

func TestDiscoveryRunsUnderPoolRun(t *testing.T) {
	res := &fakeResolver{answers: map[string][]string{"workers.local": {"127.0.0.1"}}}
	cfg := Config{Discovery: []DiscoveryConfig{{Name: "workers.local", Port: 1, Models: []string{"m"}, Interval: 10 * time.Millisecond}}}
	p, err := NewPool(cfg, Options{Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx) }()
	waitFor(t, "the worker found", func() bool { return p.Serves("m") })
	res.set("workers.local", nil, nil)
	waitFor(t, "the worker removed", func() bool { return !p.Serves("m") })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its ctx ended")
	}
	res.mu.Lock()
	n := res.lookups
	res.mu.Unlock()
	time.Sleep(30 * time.Millisecond)
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.lookups != n {
		t.Fatalf("lookups after Run returned: got %d more, want none", res.lookups-n)
	}
}

func TestDiscoveryConfigValidate(t *testing.T) {
	ok := DiscoveryConfig{Name: "vllm.ns.svc", Port: 8000, Models: []string{"m"}}
	tests := []struct {
		name    string
		entries []DiscoveryConfig
		want    string // "" means valid
	}{
		{"valid", []DiscoveryConfig{ok}, ""},
		{"no name", []DiscoveryConfig{{Port: 1, Models: []string{"m"}}}, "routing.discovery[0].name: must be a DNS name"},
		{"url as name", []DiscoveryConfig{{Name: "http://x", Port: 1, Models: []string{"m"}}}, "routing.discovery[0].name"},
		{"bad port", []DiscoveryConfig{{Name: "x", Port: 70000, Models: []string{"m"}}}, "routing.discovery[0].port"},
		{"bad scheme", []DiscoveryConfig{{Name: "x", Port: 1, Scheme: "ftp", Models: []string{"m"}}}, "routing.discovery[0].scheme"},
		{"no models", []DiscoveryConfig{{Name: "x", Port: 1}}, "routing.discovery[0].models: a worker must serve at least one model"},
		{"negative cap", []DiscoveryConfig{{Name: "x", Port: 1, Models: []string{"m"}, MaxConcurrency: -1}}, "routing.discovery[0].max_concurrency"},
		{"label unfit for an ID", []DiscoveryConfig{{Name: "*.svc", Port: 1, Models: []string{"m"}}}, "routing.discovery[0].name: its first label"},
		{"negative interval", []DiscoveryConfig{{Name: "x", Port: 1, Models: []string{"m"}, Interval: -time.Second}}, "routing.discovery[0].interval"},
		{"clashing IDs", []DiscoveryConfig{ok, {Name: "vllm.other.svc", Port: 8000, Models: []string{"n"}}}, "routing.discovery[1].name: the first label and port (vllm-8000)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Discovery: tt.entries}
			c.SetDefaults()
			err := c.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("got %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
