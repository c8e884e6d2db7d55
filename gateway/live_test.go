package gateway

import (
	"net/http"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
)

func TestPercentile(t *testing.T) {
	ms := func(n ...int) []time.Duration {
		var out []time.Duration
		for _, v := range n {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p99 of 100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p50 of 100", ms(hundred...), 0.5, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := percentile(tt.sorted, tt.p); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTrafficWindow(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	tr := &traffic{now: func() time.Time { return now }}
	// 20 standard requests a second for 10 s, one in four shed; then the current second's.
	for s := 0; s < 10; s++ {
		for i := 0; i < 20; i++ {
			status, ttft := http.StatusOK, time.Duration(i+1)*time.Millisecond
			if i%4 == 0 {
				status, ttft = http.StatusTooManyRequests, 0
			}
			tr.observe(queue.Standard, status, ttft)
		}
		now = now.Add(time.Second)
	}
	tr.observe(queue.Standard, http.StatusOK, time.Second)
	got := tr.class(queue.Standard)
	if got.rate != 20 {
		t.Errorf("rate: got %v, want 20 (the whole seconds of the last 10 s)", got.rate)
	}
	if got.requests != 201 || got.shed != 50 || len(got.ttft) != 151 {
		t.Errorf("window: got %d requests, %d shed, %d TTFTs; want 201, 50, 151", got.requests, got.shed, len(got.ttft))
	}
	if other := tr.class(queue.Interactive); other.requests != 0 {
		t.Errorf("interactive: got %d requests, want 0", other.requests)
	}
	now = now.Add(trafficWindow)
	if got := tr.class(queue.Standard); got.requests != 0 || got.rate != 0 {
		t.Errorf("a minute later: got %+v, want nothing", got)
	}
}

func BenchmarkTrafficObserve(b *testing.B) {
	tr := &traffic{now: time.Now}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			tr.observe(queue.Standard, http.StatusOK, 10*time.Millisecond)
		}
	})
}
