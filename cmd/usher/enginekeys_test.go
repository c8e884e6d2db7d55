package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEngineKeysAndAliasesFromTheConfig(t *testing.T) {
	env := map[string]string{"ENGINE_KEY": "from-env", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	const worker = "routing:\n  workers:\n    - id: w1\n      url: http://127.0.0.1:9001\n      models: [m]\n"
	tests := []struct {
		name, yaml string
		key        string   // the key loaded, when valid
		literal    []string // literalEngineKeys, when valid
		wantErr    string
	}{
		{"key from the environment", worker + "      api_key_env: ENGINE_KEY\n", "from-env", nil, ""},
		{"key in the file", worker + "      api_key: in-file\n", "in-file", []string{"routing.workers[0].api_key"}, ""},
		{"no key", worker, "", nil, ""},
		{"unset variable", worker + "      api_key_env: NOPE\n", "", nil,
			"routing.workers[0].api_key_env: the environment variable NOPE is not set"},
		{"empty variable", worker + "      api_key_env: EMPTY\n", "", nil,
			"routing.workers[0].api_key_env: the environment variable EMPTY is not set"},
		{"both", worker + "      api_key: x\n      api_key_env: ENGINE_KEY\n", "", nil,
			"routing.workers[0]: set api_key or api_key_env, not both"},
		{"alias", worker + "      model_aliases: {m: org/m-instruct}\n", "", nil, ""},
		{"alias of a model not served", worker + "      model_aliases: {other: org/m}\n", "", nil,
			`routing.workers[0].model_aliases["other"]: "other" is not one of the worker's models`},
		{"discovery key", "routing:\n  discovery:\n    - name: vllm.local\n      port: 8000\n      models: [m]\n      api_key_env: NOPE\n", "", nil,
			"routing.discovery[0].api_key_env: the environment variable NOPE is not set"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "usher.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg, err := loadConfig(path, lookup)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Routing.Workers[0].APIKey; got != tt.key {
				t.Fatalf("api key %q, want %q", got, tt.key)
			}
			if got := literalEngineKeys(cfg.Routing); !slices.Equal(got, tt.literal) {
				t.Fatalf("literal keys %v, want %v", got, tt.literal)
			}
		})
	}
}
