package main

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// configurationReference is the user's reference of every key the configuration file accepts.
var configurationReference = filepath.Join("..", "..", "docs", "configuration.md")

// TestConfigurationReference checks docs/configuration.md against the configuration types both
// ways: every key the file accepts has its row, and every row names a key the file accepts.
func TestConfigurationReference(t *testing.T) {
	data, err := os.ReadFile(configurationReference)
	if err != nil {
		t.Fatal(err)
	}
	documented := referenceKeys(string(data))
	accepted := configKeys(reflect.TypeOf(Config{}), "")
	if len(accepted) < 100 {
		t.Fatalf("found %d keys in Config, want the whole file's (over 100): the walk is broken", len(accepted))
	}
	for _, k := range accepted {
		if k.leaf && !documented[k.path] {
			t.Errorf("%s: accepted by the configuration file, but no row in %s", k.path, configurationReference)
		}
	}
	known := make(map[string]bool, len(accepted))
	for _, k := range accepted {
		known[k.path] = true
	}
	var unknown []string
	for path := range documented {
		if !known[path] {
			unknown = append(unknown, path)
		}
	}
	slices.Sort(unknown)
	for _, path := range unknown {
		t.Errorf("%s: has a row in %s, but the configuration file accepts no such key", path, configurationReference)
	}
}

// referenceRow is a row of the reference's tables: its first cell is one key in backquotes.
var referenceRow = regexp.MustCompile("^\\| `([^`]+)` \\|")

// mapKeyPlaceholder is how the reference writes a key the user chooses, such as a model's name
// in routing.models.<model>.policy.
var mapKeyPlaceholder = regexp.MustCompile(`<[a-z_]+>`)

// referenceKeys returns the keys of the reference's rows, with every placeholder written "<>".
func referenceKeys(markdown string) map[string]bool {
	keys := make(map[string]bool)
	for _, line := range strings.Split(markdown, "\n") {
		if m := referenceRow.FindStringSubmatch(line); m != nil {
			keys[mapKeyPlaceholder.ReplaceAllString(m[1], "<>")] = true
		}
	}
	return keys
}

// configKey is one key the configuration file accepts, by its path ("routing.workers[].url",
// "routing.models.<>.policy"). A leaf holds a value; the others hold a section of keys.
type configKey struct {
	path string
	leaf bool
}

// configKeys lists the keys of struct type t below prefix as the YAML decoder reads them: the
// yaml tag's name (the lower-cased field name without one), inline structs adding no level,
// "-" and unexported fields skipped, lists of sections as "[]" and mappings of sections as "<>".
func configKeys(t reflect.Type, prefix string) []configKey {
	var keys []configKey
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if slices.Contains(strings.Split(opts, ","), "inline") {
			keys = append(keys, configKeys(ft, prefix)...)
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		switch {
		case ft.Kind() == reflect.Struct && ft != reflect.TypeFor[time.Duration]():
			keys = append(keys, configKey{path: path})
			keys = append(keys, configKeys(ft, path)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, configKey{path: path})
			keys = append(keys, configKeys(ft.Elem(), path+"[]")...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			keys = append(keys, configKey{path: path})
			keys = append(keys, configKeys(ft.Elem(), path+".<>")...)
		default:
			keys = append(keys, configKey{path: path, leaf: true})
		}
	}
	return keys
}
