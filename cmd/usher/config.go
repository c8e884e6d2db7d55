package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strconv"
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
	if err := decodeConfig(data, &cfg); err != nil {
		return cfg, err
	}
	if err := applyEnv(&cfg, lookup); err != nil {
		return cfg, err
	}
	if err := resolveEngineKeys(&cfg.Routing, lookup); err != nil {
		return cfg, err
	}
	cfg.SetDefaults()
	return cfg, cfg.Validate()
}

// decodeConfig decodes the YAML document data into cfg. Unknown keys are errors. A key or value
// of the wrong type is named by its YAML path and line ("server.listne: unknown key (line 2)"),
// never by the Go type that holds it; syntax errors say "parse:" and the line.
func decodeConfig(data []byte, cfg *Config) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	err := dec.Decode(cfg)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return fmt.Errorf("parse: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return fmt.Errorf("parse: %s", strings.TrimPrefix(err.Error(), "yaml: "))
	}
	nodes := yamlPaths(&doc, "", nil)
	errs := make([]error, len(te.Errors))
	for i, msg := range te.Errors {
		errs[i] = errors.New(namePath(msg, nodes))
	}
	return errors.Join(errs...)
}

// yamlNode is one key or value of a YAML document with the path that leads to it
// ("routing.workers[0].url").
type yamlNode struct {
	path  string
	line  int
	key   bool   // a mapping key, not a value
	tag   string // !!str, !!int, !!seq, !!map, ...
	value string // a scalar's text
}

// yamlPaths lists n and every node below it, in document order, with their paths below path.
func yamlPaths(n *yaml.Node, path string, out []yamlNode) []yamlNode {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			out = yamlPaths(c, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			out = append(out, yamlNode{path: p, line: k.Line, key: true, value: k.Value})
			out = append(out, yamlNode{path: p, line: v.Line, tag: v.ShortTag(), value: v.Value})
			out = yamlPaths(v, p, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			out = append(out, yamlNode{path: p, line: c.Line, tag: c.ShortTag(), value: c.Value})
			out = yamlPaths(c, p, out)
		}
	}
	return out
}

// The decoder's messages that name a key or a value (yaml.TypeError.Errors).
var (
	unknownFieldMessage = regexp.MustCompile(`^line (\d+): field (.+) not found in type \S+$`)
	lineMessage         = regexp.MustCompile(`^line (\d+): (.*)$`)
	cannotUnmarshal     = regexp.MustCompile("^cannot unmarshal !!(\\w+)(?: `([^`]*)`)? into (\\S+)$")
)

// namePath rewrites one decoder message to start with the YAML path of the node it is about:
// the key an unknown-field message names, else the value on that line of the type and text a
// type error names, else the last value on that line. A message it cannot place stays as it is.
func namePath(msg string, nodes []yamlNode) string {
	if m := unknownFieldMessage.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		for _, n := range nodes {
			if n.key && n.line == line && n.value == m[2] {
				return fmt.Sprintf("%s: unknown key (line %d)", n.path, line)
			}
		}
		return msg
	}
	m := lineMessage.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	line, _ := strconv.Atoi(m[1])
	// The node it is about: on that line, of the tag and with the value the message names; the
	// deepest such, since a block mapping starts on the line of its first key.
	var tag, value string
	if c := cannotUnmarshal.FindStringSubmatch(m[2]); c != nil {
		tag, value = "!!"+c[1], c[2]
	}
	path := ""
	for _, n := range nodes {
		if !n.key && n.line == line && (tag == "" || n.tag == tag) && sameValue(n.value, value) {
			path = n.path
		}
	}
	if path == "" {
		return msg
	}
	return fmt.Sprintf("%s: %s (line %d)", path, plainTypeError(m[2]), line)
}

// sameValue says whether a node's text is the value a decoder message quotes: "" quotes none,
// and the decoder cuts long values to their first 7 bytes and "...".
func sameValue(text, quoted string) bool {
	if short, ok := strings.CutSuffix(quoted, "..."); ok && len(text) > 10 {
		return strings.HasPrefix(text, short)
	}
	return quoted == "" || text == quoted
}

// plainTypeError says a decoder's "cannot unmarshal !!str `soon` into time.Duration" in the
// file's terms: "want a duration such as 500ms or 2s, got `soon`". Other messages stay.
func plainTypeError(msg string) string {
	m := cannotUnmarshal.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	var want string
	switch goType := m[3]; {
	case goType == "time.Duration":
		want = "a duration such as 500ms or 2s"
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "uint"):
		want = "an integer"
	case strings.HasPrefix(goType, "float"):
		want = "a number"
	case goType == "bool":
		want = "true or false"
	case goType == "string":
		want = "a string"
	case strings.HasPrefix(goType, "[]"):
		want = "a list"
	default: // maps and the structs of the sections
		want = "a mapping of keys"
	}
	got := "`" + m[2] + "`"
	switch {
	case m[1] == "seq":
		got = "a list"
	case m[1] == "map":
		got = "a mapping"
	case m[2] == "":
		got = "!!" + m[1]
	}
	return fmt.Sprintf("want %s, got %s", want, got)
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
