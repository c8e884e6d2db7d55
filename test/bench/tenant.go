package bench

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseTenant reads the flag form name=KEY[:share[:class[:rate[:deadline_ms[:answer]]]]], for
// example "acme=sk-1:3:interactive" or "bulk=sk-2:1:batch:50". Empty fields keep their defaults:
// "bulk=sk-2::batch". answer is "stream" (the default) or "whole" (non-streamed answers, as
// batch jobs ask). The key cannot hold a colon.
func ParseTenant(s string) (Tenant, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return Tenant{}, fmt.Errorf("tenant %q: want name=KEY[:share[:class[:rate[:deadline_ms[:answer]]]]]", s)
	}
	parts := strings.Split(rest, ":")
	if len(parts) > 6 {
		return Tenant{}, fmt.Errorf("tenant %q: too many fields", s)
	}
	t := Tenant{Name: name, Key: parts[0]}
	field := func(i int) string {
		if i < len(parts) {
			return parts[i]
		}
		return ""
	}
	var err error
	if v := field(1); v != "" {
		if t.Share, err = strconv.ParseFloat(v, 64); err != nil {
			return Tenant{}, fmt.Errorf("tenant %q: share: %w", s, err)
		}
	}
	t.Class = field(2)
	if v := field(3); v != "" {
		if t.Rate, err = strconv.ParseFloat(v, 64); err != nil {
			return Tenant{}, fmt.Errorf("tenant %q: rate: %w", s, err)
		}
	}
	if v := field(4); v != "" {
		if t.DeadlineMs, err = strconv.Atoi(v); err != nil {
			return Tenant{}, fmt.Errorf("tenant %q: deadline_ms: %w", s, err)
		}
	}
	switch field(5) {
	case "", "stream":
	case "whole":
		t.Whole = true
	default:
		return Tenant{}, fmt.Errorf("tenant %q: answer: want stream or whole, got %q", s, field(5))
	}
	return t, nil
}

// tenantFlag appends one tenant per --tenant flag.
type tenantFlag []Tenant

func (f *tenantFlag) String() string {
	names := make([]string, len(*f))
	for i, t := range *f {
		names[i] = t.Name
	}
	return strings.Join(names, ",")
}

func (f *tenantFlag) Set(v string) error {
	t, err := ParseTenant(v)
	if err != nil {
		return err
	}
	*f = append(*f, t)
	return nil
}
