package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	adminui "github.com/usherllm/usher/admin-ui"
	"github.com/usherllm/usher/gateway"
	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// Config is the whole configuration file. Each section belongs to the package that uses it;
// this type only puts them together.
type Config struct {
	Server  gateway.Config `yaml:"server"`
	Routing routing.Config `yaml:"routing"`
	Queue   queue.Config   `yaml:"queue"`
	AdminUI adminui.Config `yaml:"admin_ui"`
	// The tenant sections (tenants, tiers, ...) sit at the top level of the file.
	Tenants tenants.Config `yaml:",inline"`
	Redis   RedisConfig    `yaml:"redis"`
	Log     LogConfig      `yaml:"log"`
}

// RedisConfig names the Redis that gateway replicas share (sticky pins, drain state, rate
// limit counters, key revocations). Without it one gateway keeps all of that in process.
type RedisConfig struct {
	// URL is a redis:// or rediss:// URL, e.g. redis://127.0.0.1:6379/0. Empty: no Redis.
	URL string `yaml:"url"`
}

// LogConfig sets the process's log output (always stderr).
type LogConfig struct {
	// Level is debug, info, warn or error. Default info.
	Level string `yaml:"level"`
	// Format is text or json. Default text.
	Format string `yaml:"format"`
}

// SetDefaults fills every zero field of every section.
func (c *Config) SetDefaults() {
	c.Server.SetDefaults()
	c.Routing.SetDefaults()
	c.Tenants.SetDefaults()
	c.AdminUI.SetDefaults()
	if c.Log.Level == "" {
		c.Log.Level = "info"
	}
	if c.Log.Format == "" {
		c.Log.Format = "text"
	}
}

// Validate reports every problem of every section, each naming its field.
func (c Config) Validate() error {
	errs := []error{c.Server.Validate(), c.Routing.Validate(), c.Queue.Validate(), c.Tenants.Validate(), c.AdminUI.Validate()}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.Log.Level)); err != nil {
		errs = append(errs, fmt.Errorf("log.level: %q is not one of debug, info, warn, error", c.Log.Level))
	}
	if c.Redis.URL != "" {
		if _, err := redis.ParseURL(c.Redis.URL); err != nil {
			errs = append(errs, fmt.Errorf("redis.url: %v", err))
		}
	}
	if c.Log.Format != "text" && c.Log.Format != "json" {
		errs = append(errs, fmt.Errorf("log.format: %q is not one of text, json", c.Log.Format))
	}
	return errors.Join(errs...)
}

// loadConfig reads the YAML file at path, applies USHER_* environment overrides, fills defaults
// and validates. Unknown keys are errors, so a typo never silently falls back to a default.
func loadConfig(path string, lookup func(string) (string, bool)) (Config, error) {
	var cfg Config
	data, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return cfg, fmt.Errorf("parse: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if err := applyEnv(&cfg, lookup); err != nil {
		return cfg, err
	}
	cfg.SetDefaults()
	return cfg, cfg.Validate()
}

func newLogger(c LogConfig, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
