package queue_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/usherllm/usher/queue"
)

// value returns the value of the series name{labels}, summed over series that match.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !matches(m, labels) {
				continue
			}
			switch {
			case m.Gauge != nil:
				sum += m.GetGauge().GetValue()
			case m.Counter != nil:
				sum += m.GetCounter().GetValue()
			case m.Histogram != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func matches(m *dto.Metric, labels map[string]string) bool {
	n := 0
	for _, lp := range m.GetLabel() {
		if v, ok := labels[lp.GetName()]; ok {
			if v != lp.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(labels)
}

func TestMetrics(t *testing.T) {
	q, clk, reg := newQueue(t, queue.Config{MaxQueuedPerTenant: 2}, queue.Capacity{Requests: 1})
	g := granted(t, enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Interactive, MaxTokens: 5}))
	enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Batch, MaxTokens: 5})
	enqueue(t, q, queue.Request{Tenant: "a", Class: queue.Batch, MaxTokens: 5, Deadline: clk.Now().Add(1)})
	cancelled := enqueue(t, q, queue.Request{Tenant: "b", Class: queue.Standard, MaxTokens: 5})
	if _, err := q.Enqueue(queue.Request{Tenant: "a", Class: queue.Batch}); err == nil {
		t.Fatalf("fourth request of tenant a admitted, want queue_full")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cancelled.Wait(ctx)
	clk.Advance(1)
	g.Done(queue.Usage{PromptTokens: 3, CompletionTokens: 4})

	m := map[string]string{"model": "m"}
	with := func(kv ...string) map[string]string {
		l := map[string]string{"model": "m"}
		for i := 0; i < len(kv); i += 2 {
			l[kv[i]] = kv[i+1]
		}
		return l
	}
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"batch depth", "usher_queue_depth", with("class", "batch"), 0},
		{"dispatched interactive", "usher_queue_dispatched_total", with("class", "interactive"), 1},
		{"dispatched batch", "usher_queue_dispatched_total", with("class", "batch"), 1},
		{"dispatched all", "usher_queue_dispatched_total", m, 2},
		{"waits observed", "usher_queue_wait_seconds", m, 2},
		{"queue full", "usher_queue_shed_total", with("reason", "queue_full"), 1},
		{"canceled", "usher_queue_shed_total", with("reason", "canceled", "class", "standard"), 1},
		{"deadline exceeded", "usher_queue_shed_total", with("reason", "deadline_exceeded"), 1},
		{"tokens served", "usher_queue_tokens_served_total", with("tenant", "a"), 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := value(t, reg, tt.metric, tt.labels); got != tt.want {
				t.Fatalf("%s%v = %v, want %v", tt.metric, tt.labels, got, tt.want)
			}
		})
	}
}

// TestQueuesShareARegistry checks that queues of several models register side by side and that
// Close frees a model's series for a new queue.
func TestQueuesShareARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := queue.New(queue.Config{}, queue.Options{Model: "a", Registerer: reg})
	if err != nil {
		t.Fatalf("New a: %v", err)
	}
	b, err := queue.New(queue.Config{}, queue.Options{Model: "b", Registerer: reg})
	if err != nil {
		t.Fatalf("New b: %v", err)
	}
	defer b.Close()
	if _, err := queue.New(queue.Config{}, queue.Options{Model: "a", Registerer: reg}); err == nil {
		t.Fatalf("second queue for model a registered, want an error")
	}
	a.Close()
	again, err := queue.New(queue.Config{}, queue.Options{Model: "a", Registerer: reg})
	if err != nil {
		t.Fatalf("New a after Close: %v", err)
	}
	again.Close()
}

// seriesOf counts the series of name.
func seriesOf(t *testing.T, reg *prometheus.Registry, name string) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return len(mf.GetMetric())
		}
	}
	return 0
}

// Per-tenant series go with their tenant (issue 10, item 11: 10,294 series were left after 10k
// tenants came and went): after 10,000 tenants served and forgotten, the series count is back
// where it was.
func TestForgetTenantRemovesItsSeries(t *testing.T) {
	q, _, reg := newQueue(t, queue.Config{}, queue.Capacity{Requests: 4})
	const served = "usher_queue_tokens_served_total"
	granted(t, enqueue(t, q, queue.Request{Tenant: "stays", Class: queue.Standard, MaxTokens: 5})).
		Done(queue.Usage{PromptTokens: 1, CompletionTokens: 1})
	baseline := seriesOf(t, reg, served)
	for i := range 10_000 {
		name := fmt.Sprintf("tenant-%d", i)
		granted(t, enqueue(t, q, queue.Request{Tenant: name, Class: queue.Standard, MaxTokens: 5})).
			Done(queue.Usage{PromptTokens: 2, CompletionTokens: 3})
		q.ForgetTenant(name)
	}
	if got := seriesOf(t, reg, served); got != baseline {
		t.Fatalf("series after 10,000 tenants forgotten: got %d, want the baseline %d", got, baseline)
	}

	// A tenant forgotten while its request is in flight is charged nothing more, and goes
	// when the request ends; one of the same id coming back has a series again.
	g := granted(t, enqueue(t, q, queue.Request{Tenant: "busy", Class: queue.Standard, MaxTokens: 5}))
	q.ForgetTenant("busy")
	g.Done(queue.Usage{PromptTokens: 2, CompletionTokens: 3})
	if got := seriesOf(t, reg, served); got != baseline {
		t.Fatalf("series after an in-flight tenant was forgotten: got %d, want %d", got, baseline)
	}
	granted(t, enqueue(t, q, queue.Request{Tenant: "busy", Class: queue.Standard, MaxTokens: 5})).
		Done(queue.Usage{PromptTokens: 2, CompletionTokens: 3})
	if got := value(t, reg, served, map[string]string{"tenant": "busy"}); got != 5 {
		t.Fatalf("the returning tenant's tokens: got %v, want 5", got)
	}
	if got := len(q.Snapshot().Tenants); got != 0 {
		t.Fatalf("tenants in the snapshot with nothing queued or in flight: %d", got)
	}
}
