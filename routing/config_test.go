package routing

import (
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr []string // substrings; none means valid
	}{
		{name: "empty is valid", yaml: `{}`},
		{name: "full", yaml: `
workers:
  - {id: a, url: "http://127.0.0.1:9001", models: [m1, m2], max_concurrency: 8}
  - {id: b, url: "https://gpu-2.internal:8000/", models: [m1], priority_handoff: true}
policy: round_robin
models:
  m2: {policy: random}
health: {interval: 2s, timeout: 500ms, path: /healthz, healthy_threshold: 1, unhealthy_threshold: 3}
`},
		{name: "relative url", yaml: `workers: [{id: a, url: "127.0.0.1:9001", models: [m]}]`,
			wantErr: []string{"routing.workers[0].url: must be an absolute http(s) URL"}},
		{name: "url with query", yaml: `workers: [{id: a, url: "http://h/?x=1", models: [m]}]`,
			wantErr: []string{"routing.workers[0].url: must not carry a query"}},
		{name: "duplicate id", yaml: `workers: [{id: a, url: "http://h:1", models: [m]}, {id: a, url: "http://h:2", models: [m]}]`,
			wantErr: []string{`routing.workers[1].id: duplicate id "a" (also workers[0])`}},
		{name: "no models", yaml: `workers: [{id: a, url: "http://h:1"}]`,
			wantErr: []string{"routing.workers[0].models: a worker must serve at least one model"}},
		{name: "bad id", yaml: `workers: [{id: "a b", url: "http://h:1", models: [m]}]`,
			wantErr: []string{"routing.workers[0].id: must be 1 to 128"}},
		{name: "unknown default policy", yaml: `policy: fastest`,
			wantErr: []string{`routing.policy: unknown policy "fastest"`}},
		{name: "unknown model policy", yaml: `models: {m: {policy: fastest}}`,
			wantErr: []string{`routing.models["m"].policy: unknown policy "fastest"`}},
		{name: "negative caps", yaml: `workers: [{id: a, url: "http://h:1", models: [m], max_concurrency: -1, max_tokens_in_flight: -2}]`,
			wantErr: []string{"routing.workers[0].max_concurrency: must not be negative", "routing.workers[0].max_tokens_in_flight: must not be negative"}},
		{name: "timeout above interval", yaml: `health: {interval: 1s, timeout: 2s}`,
			wantErr: []string{"routing.health.timeout: must be positive and at most health.interval"}},
		{name: "bad health path", yaml: `health: {path: health}`,
			wantErr: []string{"routing.health.path: must start with '/'"}},
		{name: "every policy parameter", yaml: `
models:
  a: {policy: consistent_hash, consistent_hash: {virtual_nodes: 50, load_factor: 1.5}}
  b: {policy: prefix_hash, prefix_hash: {prefix_tokens: 64}}
  c: {policy: bucket, bucket: {recut: 10s, decay: 0.8, balance_abs: 2, balance_rel: 2}}
  d: {policy: sticky_session, sticky_session: {fallback: prefix_hash}, pins: {ttl: 30m, timeout: 20ms}}
  e: {policy: manual, manual: {assign: min_group, recount: 30s}}
scrape: {interval: 1s, timeout: 500ms, path: /metrics, max_age: 5s}
breaker: {failures: 3, cooldown: 30s}
drain_sync: 1s
`},
		{name: "bad policy parameters", yaml: `
models:
  m:
    consistent_hash: {load_factor: 0.9}
    prefix_hash: {prefix_tokens: -1, virtual_nodes: 20000}
    bucket: {decay: 1.5, balance_rel: 0.5}
    sticky_session: {fallback: manual}
    manual: {assign: nearest}
    pins: {ttl: 10ms}
`, wantErr: []string{
			`routing.models["m"].consistent_hash.load_factor: must be above 1`,
			`routing.models["m"].prefix_hash.prefix_tokens: must be at least 1`,
			`routing.models["m"].prefix_hash.virtual_nodes: must be between 1 and 10000`,
			`routing.models["m"].bucket.decay: must be between 0 and 1`,
			`routing.models["m"].bucket.balance_rel: must be at least 1`,
			`routing.models["m"].sticky_session.fallback: must name a policy other than sticky_session and manual`,
			`routing.models["m"].manual.assign: must be random, min_load or min_group`,
			`routing.models["m"].pins.ttl: must be at least 1s`,
		}},
		{name: "bad scrape, breaker and drain sync", yaml: `
scrape: {interval: 2s, max_age: 1s}
breaker: {failures: -1, cooldown: -1s}
drain_sync: -1s
`, wantErr: []string{"routing.scrape.max_age: must be at least scrape.interval", "routing.breaker.failures:", "routing.breaker.cooldown:", "routing.drain_sync:"}},
		{name: "several problems at once", yaml: `
policy: nope
workers: [{id: "", url: "ftp://h", models: []}]`,
			wantErr: []string{"routing.policy:", "routing.workers[0].id:", "routing.workers[0].url:", "routing.workers[0].models:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg Config
			if err := yaml.Unmarshal([]byte(tt.yaml), &cfg); err != nil {
				t.Fatalf("parse: %v", err)
			}
			cfg.SetDefaults()
			err := cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("got error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("got no error, want %q", tt.wantErr)
			}
			for _, want := range tt.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("got error %q, want it to contain %q", err, want)
				}
			}
		})
	}
}

func TestConfigSetDefaults(t *testing.T) {
	var cfg Config
	cfg.SetDefaults()
	want := Config{
		Policy: DefaultPolicy, MaxConcurrency: DefaultMaxConcurrency, MaxTokensInFlight: DefaultMaxTokensInFlight,
		Health: HealthConfig{Interval: 5 * time.Second, Timeout: 2 * time.Second, Path: "/health", HealthyThreshold: 2, UnhealthyThreshold: 2},
	}
	if cfg.Policy != want.Policy || cfg.MaxConcurrency != want.MaxConcurrency || cfg.MaxTokensInFlight != want.MaxTokensInFlight || cfg.Health != want.Health {
		t.Errorf("got %+v, want %+v", cfg, want)
	}
	short := Config{Health: HealthConfig{Interval: time.Second}}
	short.SetDefaults()
	if short.Health.Timeout != time.Second {
		t.Errorf("timeout with a 1s interval: got %s, want 1s", short.Health.Timeout)
	}
}
