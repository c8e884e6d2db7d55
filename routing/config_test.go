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
