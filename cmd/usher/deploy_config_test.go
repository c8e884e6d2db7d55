package main

import (
	"path/filepath"
	"testing"
)

// The configurations shipped under deploy/ load and validate as `usher serve` would load them,
// with the secrets their environment provides (the compose file's and the Kubernetes Secret's).
func TestDeployConfigsAreValid(t *testing.T) {
	env := map[string]string{
		"USHER_ADMIN_TOKEN":  "an-admin-token-of-24-characters",
		"USHER_DATABASE_URL": "postgres://usher:usher@postgres:5432/usher?sslmode=disable",
	}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tt := range []struct {
		file    string
		workers int
	}{
		{"compose/usher.yaml", 3},
		{"kubernetes/base/usher.yaml", 3},
	} {
		t.Run(tt.file, func(t *testing.T) {
			cfg, err := loadConfig(filepath.Join("..", "..", "deploy", tt.file), lookup)
			if err != nil {
				t.Fatalf("got error %v, want none", err)
			}
			if got, want := cfg.Server.Listen, "0.0.0.0:8080"; got != want {
				t.Errorf("server.listen: got %q, want %q", got, want)
			}
			if got := len(cfg.Routing.Workers); got != tt.workers {
				t.Errorf("routing.workers: got %d, want %d", got, tt.workers)
			}
			if cfg.Redis.URL == "" {
				t.Errorf("redis.url: empty, want the Redis the replicas share")
			}
			if got, want := cfg.Tenants.Database.URL, env["USHER_DATABASE_URL"]; got != want {
				t.Errorf("database.url: got %q, want %q from USHER_DATABASE_URL", got, want)
			}
		})
	}
}
