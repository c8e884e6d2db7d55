package routing

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

const vllmMetrics = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1234
`

func TestParseLoad(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		want  LoadReport
		found bool
	}{
		{name: "vllm", text: vllmMetrics, want: LoadReport{Running: 10, Waiting: 4, KVUsage: 0.5}, found: true},
		{name: "sglang", text: "sglang:num_running_reqs{model_name=\"m\"} 5\nsglang:num_queue_reqs{model_name=\"m\"} 2\nsglang:token_usage{model_name=\"m\"} 0.75\n",
			want: LoadReport{Running: 5, Waiting: 2, KVUsage: 0.75}, found: true},
		{name: "llama.cpp", text: "# HELP llamacpp:requests_processing x\nllamacpp:requests_processing 1\nllamacpp:requests_deferred 6\nllamacpp:kv_cache_usage_ratio 0.125\n",
			want: LoadReport{Running: 1, Waiting: 6, KVUsage: 0.125}, found: true},
		{name: "timestamps and odd labels", text: "vllm:num_requests_waiting{path=\"/a}b\",x=\"y\"} 3 1700000000000\n",
			want: LoadReport{Waiting: 3}, found: true},
		{name: "usage above one is capped", text: "sglang:token_usage 1.5\n", want: LoadReport{KVUsage: 1}, found: true},
		{name: "garbage and NaN skipped", text: "vllm:num_requests_waiting NaN\nvllm:num_requests_running{ 2\nnot a metric\n\nvllm:num_requests_running -1\n", found: false},
		{name: "unknown engine", text: "process_cpu_seconds_total 12\n", found: false},
		{name: "vllm states its KV cache", text: vllmMetrics + "vllm:cache_config_info{block_size=\"16\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",num_gpu_blocks=\"2048\"} 1.0\n",
			want: LoadReport{Running: 10, Waiting: 4, KVUsage: 0.5, KVTokens: 32768}, found: true},
		{name: "the smallest cache of several ranks", text: "vllm:cache_config_info{num_gpu_blocks=\"100\",block_size=\"16\"} 1\nvllm:cache_config_info{num_gpu_blocks=\"90\",block_size=\"16\"} 1\n",
			want: LoadReport{KVTokens: 1440}},
		{name: "sglang states its KV cache", text: "sglang:max_total_num_tokens{model_name=\"m\"} 161721.0\nsglang:token_usage 0.5\n",
			want: LoadReport{KVUsage: 0.5, KVTokens: 161721}, found: true},
		{name: "escaped label values are skipped over, not misread", text: `vllm:cache_config_info{a="x\",block_size=\"99",block_size="16",num_gpu_blocks="4"} 1` + "\n",
			want: LoadReport{KVTokens: 64}},
		{name: "unusable cache configs", text: "vllm:cache_config_info{block_size=\"16\"} 1\nvllm:cache_config_info{block_size=\"0\",num_gpu_blocks=\"5\"} 1\n" +
			"vllm:cache_config_info{block_size=\"9223372036854775807\",num_gpu_blocks=\"9223372036854775807\"} 1\nvllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"-2\"} 1\n" +
			`vllm:cache_config_info{block_size="16",num_gpu_blocks="12} 1` + "\nsglang:max_total_num_tokens 1e300\n",
			want: LoadReport{KVTokens: maxKVTokens}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, found, err := parseLoad(strings.NewReader(tt.text))
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if got != tt.want || found != tt.found {
				t.Errorf("got %+v found=%v, want %+v found=%v", got, found, tt.want, tt.found)
			}
		})
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add(vllmMetrics)
	f.Add("sglang:num_queue_reqs{a=\"}\"} 2 3\n")
	f.Add("llamacpp:requests_deferred 1e308\n")
	f.Add("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"4\"} 1\n")
	f.Fuzz(func(t *testing.T, text string) {
		rep, _, _ := parseLoad(strings.NewReader(text))
		if rep.KVUsage < 0 || rep.KVUsage > 1 {
			t.Errorf("got KV usage %v, want within [0, 1]", rep.KVUsage)
		}
		if rep.KVTokens < 0 || rep.KVTokens > maxKVTokens {
			t.Errorf("got KV tokens %d, want within [0, %d]", rep.KVTokens, int64(maxKVTokens))
		}
	})
}

func TestScrapeAndStaleness(t *testing.T) {
	var body atomic.Value
	body.Store(vllmMetrics)
	var status atomic.Int64
	status.Store(http.StatusOK)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(status.Load()))
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	defer srv.Close()
	clock := newFakeClock()
	specs := []WorkerSpec{{ID: "a", URL: srv.URL, Models: []string{"m"}, MaxConcurrency: 50}}
	p, err := NewPool(Config{Workers: specs, Scrape: ScrapeConfig{Interval: time.Second, MaxAge: 3 * time.Second}}, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w := modelWorkers(t, p, "m")[0]
	maxAge := p.cfg.Scrape.MaxAge
	if got := w.ReportedQueue(clock.Now(), maxAge); got != 0 {
		t.Errorf("never scraped: got queue %d, want 0", got)
	}
	if err := p.scrape(context.Background(), w); err != nil {
		t.Fatalf("scrape: %v", err)
	}
	if got, want := w.Load(), (LoadReport{Running: 10, Waiting: 4, KVUsage: 0.5, At: clock.Now()}); !got.At.Equal(want.At) || got.Running != want.Running || got.Waiting != want.Waiting || got.KVUsage != want.KVUsage {
		t.Errorf("load: got %+v, want %+v", got, want)
	}
	clock.Advance(3 * time.Second)
	if got := w.ReportedQueue(clock.Now(), maxAge); got != 4 {
		t.Errorf("reading at the age bound: got queue %d, want 4", got)
	}
	status.Store(http.StatusInternalServerError)
	if err := p.scrape(context.Background(), w); err == nil {
		t.Errorf("scrape of a 500: got no error, want one")
	}
	clock.Advance(time.Millisecond)
	if got := w.ReportedQueue(clock.Now(), maxAge); got != 50 {
		t.Errorf("stale reading: got queue %d, want 50 (busy: the worker's max concurrency)", got)
	}
	status.Store(http.StatusOK)
	body.Store("process_cpu_seconds_total 1\n")
	if err := p.scrape(context.Background(), w); err == nil {
		t.Errorf("scrape without load metrics: got no error, want one")
	}
}

func TestRunScrapes(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(vllmMetrics))
	}))
	defer srv.Close()
	p, reg := newTestPool(t, Config{
		Workers: []WorkerSpec{{ID: "a", URL: srv.URL, Models: []string{"m"}}},
		Scrape:  ScrapeConfig{Interval: 10 * time.Millisecond},
		Health:  HealthConfig{Interval: time.Hour},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if st, _ := p.Worker("a"); st.Load.Waiting == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no scrape within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if n, err := testutil.GatherAndCount(reg, "usher_routing_worker_reported_waiting"); err != nil || n != 1 {
		t.Errorf("reported waiting series: got %d (%v), want 1", n, err)
	}
}

func TestCachedTokensCounted(t *testing.T) {
	p, _ := newTestPool(t, Config{Policy: "random", Workers: testWorkers(1, "m")})
	for range 3 {
		l, err := p.Pick(context.Background(), &Request{Model: "m"})
		if err != nil {
			t.Fatal(err)
		}
		l.Release(Outcome{PromptTokens: 100, CachedTokens: 60, CompletionTokens: 5})
	}
	st, _ := p.Worker("w0")
	if st.PromptTokens != 300 || st.CachedTokens != 180 {
		t.Errorf("worker status: got %d prompt and %d cached, want 300 and 180", st.PromptTokens, st.CachedTokens)
	}
	if got := testutil.ToFloat64(p.metrics.cachedTokens.WithLabelValues("w0", "random")); got != 180 {
		t.Errorf("usher_routing_cached_tokens_total{worker=w0,policy=random}: got %v, want 180", got)
	}
}

func TestOthersInFlight(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(vllmMetrics)) // 10 running, 4 waiting
	}))
	defer srv.Close()
	clock := newFakeClock()
	specs := []WorkerSpec{{ID: "a", URL: srv.URL, Models: []string{"m"}, MaxConcurrency: 50}}
	p, err := NewPool(Config{Workers: specs, Scrape: ScrapeConfig{Interval: time.Second, MaxAge: 3 * time.Second}}, Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w := modelWorkers(t, p, "m")[0]
	tests := []struct {
		name    string
		own     int // this gateway's requests in flight at the scrape
		advance time.Duration
		want    int64
	}{
		{"never scraped", -1, 0, 0},
		{"alone", 14, 0, 0},
		{"more own than reported (not arrived yet)", 20, 0, 0},
		{"others hold the rest", 4, 0, 10},
		{"stale reading", 4, 3*time.Second + time.Millisecond, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var leases []*Lease
			for range max(tt.own, 0) {
				l, err := p.Pick(context.Background(), &Request{Model: "m"})
				if err != nil {
					t.Fatal(err)
				}
				leases = append(leases, l)
			}
			if tt.own >= 0 {
				if err := p.scrape(context.Background(), w); err != nil {
					t.Fatal(err)
				}
			}
			for _, l := range leases {
				l.Release(Outcome{})
			}
			clock.Advance(tt.advance)
			if got := w.OthersInFlight(clock.Now(), p.cfg.Scrape.MaxAge); got != tt.want {
				t.Fatalf("OthersInFlight: got %d, want %d", got, tt.want)
			}
			if st, _ := p.Worker("a"); st.OthersInFlight != tt.want {
				t.Fatalf("WorkerStatus.OthersInFlight: got %d, want %d", st.OthersInFlight, tt.want)
			}
		})
	}
}
