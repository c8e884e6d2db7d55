package bench_test

import (
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/usherllm/usher/test/bench"
)

const sampleMetrics = `# HELP vllm:prefix_cache_hits_total Prefix cache hits, in tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 100
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000 1700000000000
vllm:num_requests_running{model_name="m"} 3
vllm:prefix_cache_queries_created{model_name="m"} 1.7e9
`

func TestPrefixCacheCounters(t *testing.T) {
	hits, queries, err := bench.PrefixCacheCounters(strings.NewReader(sampleMetrics))
	if err != nil || hits != 400 || queries != 1000 {
		t.Errorf("got %v, %v, %v; want 400, 1000, nil", hits, queries, err)
	}
}

func TestParseSample(t *testing.T) {
	tests := []struct {
		line   string
		name   string
		value  float64
		wantOK bool
	}{
		{`up 1`, "up", 1, true},
		{`a{b="c d}"} 2.5 123`, "a", 2.5, true},
		{`x_total{} +Inf`, "x_total", math.Inf(1), true},
		{`# HELP up x`, "", 0, false},
		{``, "", 0, false},
		{`up`, "", 0, false},
		{`up{a="b" 1`, "", 0, false},
		{`up one`, "", 0, false},
		{`up 1 2 3`, "", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.line, func(t *testing.T) {
			name, v, ok := bench.ParseSample(tc.line)
			if ok != tc.wantOK || name != tc.name || v != tc.value {
				t.Errorf("got %q %v %v, want %q %v %v", name, v, ok, tc.name, tc.value, tc.wantOK)
			}
		})
	}
}

func FuzzParseSample(f *testing.F) {
	for _, line := range strings.Split(sampleMetrics, "\n") {
		f.Add(line)
	}
	f.Fuzz(func(t *testing.T, line string) {
		name, _, ok := bench.ParseSample(line)
		if ok && (name == "" || strings.ContainsAny(name, "{ \t")) {
			t.Fatalf("line %q: got metric name %q", line, name)
		}
	})
}

// countingWorker serves OpenAI streams and /metrics whose prefix-cache counters grow by one
// query of 10 tokens, hitTokens of them cached, per completion request.
type countingWorker struct {
	engine    *fakeEngine
	hitTokens int64
	served    atomic.Int64
}

func (c *countingWorker) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		n := c.served.Load()
		fmt.Fprintf(w, "vllm:prefix_cache_hits_total{model_name=\"m\"} %d\nvllm:prefix_cache_queries_total{model_name=\"m\"} %d\n",
			1000+n*c.hitTokens, 5000+n*10)
		return
	}
	c.served.Add(1)
	c.engine.ServeHTTP(w, r)
}

func TestRunScrapesPrefixCacheCounters(t *testing.T) {
	w1 := &countingWorker{engine: &fakeEngine{tokens: 1}, hitTokens: 5}
	w2 := &countingWorker{engine: &fakeEngine{tokens: 1}, hitTokens: 0}
	s1, s2 := httptest.NewServer(w1), httptest.NewServer(w2)
	t.Cleanup(s1.Close)
	t.Cleanup(s2.Close)
	cfg := smallRandom(s1.URL, 6)
	cfg.Scrape = []string{s1.URL, s2.URL + "/metrics", "http://127.0.0.1:1"}
	rep := run(t, cfg)
	sc := rep.Scrape
	if sc == nil || len(sc.Workers) != 3 {
		t.Fatalf("scrape: got %+v, want three workers", sc)
	}
	if w := sc.Workers[0]; w.Hits != 30 || w.Queries != 60 || w.HitRate != 0.5 {
		t.Errorf("worker 1: got %+v, want 30 hits of 60 queries", w)
	}
	if w := sc.Workers[1]; w.Hits != 0 || w.Queries != 0 || w.Error != "" {
		t.Errorf("worker 2 (idle): got %+v, want no change", w)
	}
	if sc.Workers[2].Error == "" {
		t.Error("unreachable worker: got no error")
	}
	if sc.Hits != 30 || sc.Queries != 60 || sc.HitRate != 0.5 {
		t.Errorf("fleet: got %v/%v = %v, want 30/60 = 0.5", sc.Hits, sc.Queries, sc.HitRate)
	}
}
