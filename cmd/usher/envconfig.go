package main

import (
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// applyEnv overrides scalar fields of the config struct pointed to by v with environment
// variables named after their YAML path: USHER_ plus the yaml keys joined by "_" in upper case
// (server.listen → USHER_SERVER_LISTEN). Inline structs add no segment. Slices of strings take a
// comma-separated list; slices of structs and maps are file-only. lookup is os.LookupEnv outside
// tests. Errors name the variable and the problem, never the value (it may be a secret).
func applyEnv(v any, lookup func(string) (string, bool)) error {
	return applyEnvValue(reflect.ValueOf(v).Elem(), "USHER", lookup)
}

var durationType = reflect.TypeOf(time.Duration(0))

func applyEnvValue(v reflect.Value, prefix string, lookup func(string) (string, bool)) error {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		fv := v.Field(i)
		if strings.Contains(opts, "inline") {
			if err := applyEnvValue(fv, prefix, lookup); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		key := prefix + "_" + strings.ToUpper(name)
		if fv.Kind() == reflect.Struct && fv.Type() != durationType {
			if err := applyEnvValue(fv, key, lookup); err != nil {
				return err
			}
			continue
		}
		raw, ok := lookup(key)
		if !ok {
			continue
		}
		if err := setScalar(fv, raw); err != nil {
			return fmt.Errorf("environment %s: %w", key, err)
		}
	}
	return nil
}

func setScalar(v reflect.Value, raw string) error {
	if v.Type() == durationType {
		d, err := time.ParseDuration(raw)
		if err != nil {
			return fmt.Errorf("not a duration (e.g. 5s, 250ms)")
		}
		v.SetInt(int64(d))
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(raw)
		if err != nil {
			return fmt.Errorf("not a boolean (true or false)")
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int64, reflect.Int32:
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		v.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(raw, 64)
		if err != nil {
			return fmt.Errorf("not a number")
		}
		v.SetFloat(x)
	case reflect.Slice:
		if v.Type().Elem().Kind() != reflect.String {
			return nil
		}
		var items []string
		for _, s := range strings.Split(raw, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		v.Set(reflect.ValueOf(items))
	}
	return nil
}

// lookupEnv is the production lookup for applyEnv.
func lookupEnv(key string) (string, bool) { return os.LookupEnv(key) }
