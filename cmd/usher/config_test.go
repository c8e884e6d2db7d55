package main

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func noEnv(string) (string, bool) { return "", false }

func TestLoadConfigFiles(t *testing.T) {
	tests := []struct {
		file    string
		wantErr string // substring; "" means the file is valid
	}{
		{"good_minimal.yaml", ""},
		{"good_full.yaml", ""},
		{"bad_yaml.yaml", "parse:"},
		{"bad_unknown_key.yaml", "server.listne: unknown key (line 2)"},
		{"bad_listen.yaml", "server.listen"},
		{"bad_worker_url.yaml", "routing.workers[0].url"},
		{"bad_key_hash.yaml", "tenants[0].keys[0].sha256"},
		{"bad_duration.yaml", "server.upstream_connect_timeout: want a duration such as 500ms or 2s, got `soon` (line 2)"},
		{"bad_log_level.yaml", "log.level"},
		{"bad_discovery.yaml", "routing.discovery[0].port"},
		{"bad_admin_ui.yaml", "admin_ui.sign_in.global_per_minute"},
		{"bad_connections.yaml", "server.max_connections_per_client"},
		{"bad_cache_scope.yaml", "routing.cache_scope"},
		{"bad_body_bounds.yaml", "server.max_body_bytes_per_tenant: must be from max_body_bytes"},
		{"bad_body_bounds.yaml", "server.max_json_depth: must be at least 5"},
		{"bad_connections.yaml", `server.trusted_proxies[1]: "not-an-address"`},
		{"bad_usage.yaml", "usage.retention: must be at least usage.hourly_retention"},
		{"bad_budget.yaml", "tiers[0].budget.soft_threshold"},
		{"good_disaggregated.yaml", ""},
		{"bad_disaggregation.yaml", `routing.workers[0].role: must be prefill, decode or both, got "prefiller"`},
		{"bad_disaggregation.yaml", "routing.disaggregation.decode_policy: sticky_session pins a key to one worker"},
		{"bad_disaggregation.yaml", `routing.disaggregation.protocol: must be vllm or sglang, got "nixl"`},
		{"does_not_exist.yaml", "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			_, err := loadConfig(filepath.Join("testdata", "config", tt.file), noEnv)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("got error %v, want none", err)
			case tt.wantErr != "" && err == nil:
				t.Fatalf("got no error, want one containing %q", tt.wantErr)
			case tt.wantErr != "" && !strings.Contains(err.Error(), tt.wantErr):
				t.Fatalf("got error %q, want it to contain %q", err, tt.wantErr)
			}
		})
	}
}

// TestConfigErrorsNameTheYAMLPath: a key or value the decoder refuses is named by its path in the
// file, never by the Go type behind it, and every such problem of the file is reported.
func TestConfigErrorsNameTheYAMLPath(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // each line of the error
	}{
		{"unknown key in a section", "server:\n  listne: 127.0.0.1:8080\n",
			[]string{"server.listne: unknown key (line 2)"}},
		{"unknown top-level key", "sever:\n  listen: x\n",
			[]string{"sever: unknown key (line 1)"}},
		{"unknown key in a list item", "routing:\n  workers:\n    - id: w1\n      url: http://127.0.0.1:9001\n      models: [m]\n    - id: w2\n      urll: http://127.0.0.1:9002\n",
			[]string{"routing.workers[1].urll: unknown key (line 7)"}},
		{"unknown key in a tier (inline section)", "tiers:\n  - name: pro\n    request_per_minute: 10\n",
			[]string{"tiers[0].request_per_minute: unknown key (line 3)"}},
		{"unknown key in a per-model map", "routing:\n  models:\n    m:\n      polcy: cache_aware\n",
			[]string{"routing.models.m.polcy: unknown key (line 4)"}},
		{"integer", "server:\n  max_attempts: many\n",
			[]string{"server.max_attempts: want an integer, got `many` (line 2)"}},
		{"long value", "server:\n  max_attempts: a-very-long-word\n",
			[]string{"server.max_attempts: want an integer, got `a-very-...` (line 2)"}},
		{"duration in a flow mapping", "routing:\n  health: {interval: 5s, timeout: soon}\n",
			[]string{"routing.health.timeout: want a duration such as 500ms or 2s, got `soon` (line 2)"}},
		{"list for a string", "server:\n  listen: [a, b]\n",
			[]string{"server.listen: want a string, got a list (line 2)"}},
		{"mapping for a list", "routing:\n  workers: {id: w1}\n",
			[]string{"routing.workers: want a list, got a mapping (line 2)"}},
		{"boolean", "queue:\n  fifo: sometimes\n",
			[]string{"queue.fifo: want true or false, got `sometimes` (line 2)"}},
		{"duplicate key", "server:\n  listen: a\n  listen: b\n",
			[]string{`server.listen: mapping key "listen" already defined at line 2 (line 3)`}},
		{"every problem at once", "server:\n  listne: x\n  max_attempts: many\nlog:\n  levl: debug\n",
			[]string{"server.listne: unknown key (line 2)", "server.max_attempts: want an integer, got `many` (line 3)", "log.levl: unknown key (line 5)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg Config
			err := decodeConfig([]byte(tt.yaml), &cfg)
			if err == nil {
				t.Fatal("got no error")
			}
			if got := strings.Split(err.Error(), "\n"); !slices.Equal(got, tt.want) {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "USHER_ADMIN_TOKEN" {
			return "an-admin-token-of-24-characters", true
		}
		return "", false
	}
	cfg, err := loadConfig(filepath.Join("..", "..", "deploy", "usher.example.yaml"), lookup)
	if err != nil {
		t.Fatalf("deploy/usher.example.yaml: %v", err)
	}
	if got := cfg.Tenants.Admin.Token; got != "an-admin-token-of-24-characters" {
		t.Errorf("admin.token from USHER_ADMIN_TOKEN: got %q", got)
	}
	if got, want := len(cfg.Tenants.Tiers), 4; got != want {
		t.Errorf("tiers: got %d, want %d", got, want)
	}
}

func TestLoadConfigDefaultsAndValues(t *testing.T) {
	cfg, err := loadConfig(filepath.Join("testdata", "config", "good_full.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Server.Listen, "0.0.0.0:9090"; got != want {
		t.Errorf("server.listen: got %q, want %q", got, want)
	}
	if got, want := cfg.Server.UpstreamConnectTimeout, 500*time.Millisecond; got != want {
		t.Errorf("server.upstream_connect_timeout: got %v, want %v", got, want)
	}
	if got, want := cfg.Server.IdleTimeout, 120*time.Second; got != want {
		t.Errorf("server.idle_timeout default: got %v, want %v", got, want)
	}
	if got := cfg.Server.MaxConnectionsPerClient; got == nil || *got != 0 {
		t.Errorf("server.max_connections_per_client: 0 (off) did not stay 0: got %v", got)
	}
	if got, want := cfg.Server.MaxConnections, 5000; got != want {
		t.Errorf("server.max_connections: got %d, want %d", got, want)
	}
	minimal, err := loadConfig(filepath.Join("testdata", "config", "good_minimal.yaml"), noEnv)
	if err != nil {
		t.Fatal(err)
	}
	if got := minimal.Server.MaxConnectionsPerClient; got == nil || *got != 256 {
		t.Errorf("server.max_connections_per_client default: got %v, want 256", got)
	}
	if got, want := len(cfg.Routing.Workers), 2; got != want {
		t.Errorf("routing.workers: got %d, want %d", got, want)
	}
}

func TestEnvironmentOverrides(t *testing.T) {
	env := map[string]string{
		"USHER_SERVER_LISTEN":         "127.0.0.1:7777",
		"USHER_SERVER_MAX_ATTEMPTS":   "5",
		"USHER_SERVER_SHUTDOWN_GRACE": "3s",
		"USHER_ROUTING_POLICY":        "random",
		"USHER_LOG_LEVEL":             "warn",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	cfg, err := loadConfig(filepath.Join("testdata", "config", "good_full.yaml"), lookup)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"server.listen", cfg.Server.Listen, "127.0.0.1:7777"},
		{"server.max_attempts", cfg.Server.MaxAttempts, 5},
		{"server.shutdown_grace", cfg.Server.ShutdownGrace, 3 * time.Second},
		{"server.shutdown_settle", cfg.Server.ShutdownSettle, 2 * time.Second},
		{"routing.discovery[0].interval", cfg.Routing.Discovery[0].Interval, 15 * time.Second},
		{"routing.policy", cfg.Routing.Policy, "random"},
		{"log.level", cfg.Log.Level, "warn"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestEnvironmentOverrideErrorsNameTheVariableNotTheValue(t *testing.T) {
	lookup := func(k string) (string, bool) {
		if k == "USHER_SERVER_MAX_ATTEMPTS" {
			return "s3cret-not-a-number", true
		}
		return "", false
	}
	_, err := loadConfig(filepath.Join("testdata", "config", "good_minimal.yaml"), lookup)
	if err == nil {
		t.Fatal("got no error for a non-integer USHER_SERVER_MAX_ATTEMPTS")
	}
	if !strings.Contains(err.Error(), "USHER_SERVER_MAX_ATTEMPTS") {
		t.Errorf("got %q, want the variable named", err)
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("got %q, which repeats the value", err)
	}
}

func TestKeyhash(t *testing.T) {
	var out strings.Builder
	if code := runKeyhash(nil, strings.NewReader("sk-test\n"), &out); code != exitOK {
		t.Fatalf("exit code %d", code)
	}
	if got, want := strings.TrimSpace(out.String()), "f3abf2a6cc4f00987743db5f544ba345b4899ae31f326d8ee9c4816de153c9e0"; got != want {
		t.Fatalf("got %q, want sha256(sk-test) %q", got, want)
	}
	if code := runKeyhash(nil, strings.NewReader(""), &out); code != exitUsage {
		t.Errorf("empty stdin: got exit code %d, want %d", code, exitUsage)
	}
}
