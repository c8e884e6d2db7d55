package bench_test

import (
	"flag"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/test/bench"
)

func TestParseTenant(t *testing.T) {
	tests := []struct {
		in      string
		want    bench.Tenant
		wantErr string
	}{
		{in: "acme=sk-1", want: bench.Tenant{Name: "acme", Key: "sk-1"}},
		{in: "acme=sk-1:3:interactive", want: bench.Tenant{Name: "acme", Key: "sk-1", Share: 3, Class: "interactive"}},
		{in: "bulk=sk-2::batch:50:2000", want: bench.Tenant{Name: "bulk", Key: "sk-2", Class: "batch", Rate: 50, DeadlineMs: 2000}},
		{in: "anon=", want: bench.Tenant{Name: "anon"}},
		{in: "nokey", wantErr: "want name=KEY"},
		{in: "=k", wantErr: "want name=KEY"},
		{in: "a=k:x", wantErr: "share"},
		{in: "a=k:1::fast", wantErr: "rate"},
		{in: "a=k:1:::soon", wantErr: "deadline_ms"},
		{in: "bulk=sk-2::batch:50::whole", want: bench.Tenant{Name: "bulk", Key: "sk-2", Class: "batch", Rate: 50, Whole: true}},
		{in: "a=k:1:batch:1:1:sometimes", wantErr: "answer"},
		{in: "a=k:1:batch:1:1:whole:extra", wantErr: "too many fields"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := bench.ParseTenant(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRegisterFlags(t *testing.T) {
	var cfg bench.Config
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	err := fs.Parse([]string{
		"--url", "http://127.0.0.1:1/v1", "--model", "m", "--workload", "trace", "--trace", "t.jsonl",
		"--time-scale", "10", "--token-scale", "8", "--trace-limit", "100", "--rate", "inf",
		"--tenant", "a=k1:2:interactive", "--tenant", "b=k2::batch", "--scrape", "http://127.0.0.1:2",
		"--scrape", "http://127.0.0.1:3", "--window", "5s", "--max-inflight", "64", "--deadline-ms", "3000",
	})
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	want := bench.Config{
		URL: "http://127.0.0.1:1/v1", Model: "m", Workload: "trace", Rate: math.Inf(1),
		Trace:       bench.TraceConfig{File: "t.jsonl", TimeScale: 10, TokenScale: 8, Limit: 100},
		Tenants:     []bench.Tenant{{Name: "a", Key: "k1", Share: 2, Class: "interactive"}, {Name: "b", Key: "k2", Class: "batch"}},
		Scrape:      []string{"http://127.0.0.1:2", "http://127.0.0.1:3"},
		Window:      5 * time.Second,
		MaxInflight: 64,
		DeadlineMs:  3000,
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
}

func TestValidate(t *testing.T) {
	good := func() bench.Config {
		return bench.Config{URL: "http://127.0.0.1:8080/v1", Model: "m", Requests: 10}
	}
	tests := []struct {
		name string
		edit func(*bench.Config)
		want string // "" for valid
	}{
		{"minimal", func(*bench.Config) {}, ""},
		{"shared prefix needs no bound", func(c *bench.Config) { c.Workload = bench.WorkloadSharedPrefix; c.Requests = 0 }, ""},
		{"no url", func(c *bench.Config) { c.URL = "" }, "bench.url: must be an absolute http(s) URL"},
		{"relative url", func(c *bench.Config) { c.URL = "127.0.0.1:8080" }, "bench.url"},
		{"no model", func(c *bench.Config) { c.Model = "" }, "bench.model: required"},
		{"local address", func(c *bench.Config) { c.LocalAddr = "127.0.0.2" }, ""},
		{"local address not an IP", func(c *bench.Config) { c.LocalAddr = "localhost" }, "bench.local_addr: not an IP address"},
		{"endpoint", func(c *bench.Config) { c.Endpoint = "embeddings" }, "bench.endpoint"},
		{"workload", func(c *bench.Config) { c.Workload = "replay" }, "bench.workload"},
		{"random unbounded", func(c *bench.Config) { c.Requests = 0 }, "bench.duration: the random workload needs"},
		{"trace without file", func(c *bench.Config) { c.Workload = bench.WorkloadTrace }, "bench.trace.file: required"},
		{"trace extension", func(c *bench.Config) { c.Workload = bench.WorkloadTrace; c.Trace.File = "t.txt" }, "bench.trace.file: must end in"},
		{"negative rate", func(c *bench.Config) { c.Rate = -1 }, "bench.rate"},
		{"tenant class", func(c *bench.Config) { c.Tenants = []bench.Tenant{{Name: "a"}, {Name: "b", Class: "urgent"}} }, "bench.tenants[1].class"},
		{"tenant name", func(c *bench.Config) { c.Tenants = []bench.Tenant{{Name: "a"}, {Name: "a"}} }, `bench.tenants[1].name: duplicate tenant "a"`},
		{"tenant share", func(c *bench.Config) { c.Tenants = []bench.Tenant{{Name: "a", Share: -1}} }, "bench.tenants[0].share"},
		{"tenant rate with trace", func(c *bench.Config) {
			c.Workload = bench.WorkloadTrace
			c.Trace.File = "t.csv"
			c.Tenants = []bench.Tenant{{Name: "a", Rate: 5}}
		}, "bench.tenants[0].rate: a tenant rate needs a synthetic workload"},
		{"infinite rate unbounded", func(c *bench.Config) { c.Rate = math.Inf(1); c.Requests = 0; c.Duration = time.Second }, "bench.requests: an infinite rate"},
		{"infinite tenant rate unbounded", func(c *bench.Config) {
			c.Requests = 0
			c.Duration = time.Second
			c.Tenants = []bench.Tenant{{Name: "a", Rate: math.Inf(1)}}
		}, "bench.requests: an infinite rate"},
		{"spread", func(c *bench.Config) { c.Random.Spread = 2 }, "bench.random.spread"},
		{"gsp groups", func(c *bench.Config) { c.SharedPrefix.Groups = -1 }, "bench.shared_prefix.groups"},
		{"token scale", func(c *bench.Config) { c.Trace.TokenScale = 0.5 }, "bench.trace.token_scale"},
		{"time scale", func(c *bench.Config) { c.Trace.TimeScale = -2 }, "bench.trace.time_scale"},
		{"scrape url", func(c *bench.Config) { c.Scrape = []string{"worker-1"} }, "bench.scrape[0]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := good()
			tc.edit(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
