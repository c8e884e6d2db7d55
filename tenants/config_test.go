package tenants

import (
	"strings"
	"testing"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{Tenants: []TenantSpec{{ID: "acme", Keys: []KeySpec{{SHA256: HashKey("k")}}}}}
	c.SetDefaults()
	got := c.Tenants[0]
	if got.Name != "acme" || got.Tier != BuiltinTier || got.Keys[0].Name != "key-0" {
		t.Errorf("got %+v, want name acme, tier %q, key name key-0", got, BuiltinTier)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("got %v, want a valid config", err)
	}
}

func TestConfigValidate(t *testing.T) {
	good := HashKey("good")
	tests := []struct {
		name    string
		tenants []TenantSpec
		want    string
	}{
		{"empty id", []TenantSpec{{}}, "tenants[0].id: must not be empty"},
		{"bad id", []TenantSpec{{ID: "a b"}}, "tenants[0].id: must be 1 to 64 characters"},
		{"duplicate id", []TenantSpec{{ID: "a"}, {ID: "a"}}, `tenants[1].id: duplicate of tenants[0].id "a"`},
		{"short hash", []TenantSpec{{ID: "a", Keys: []KeySpec{{SHA256: good}, {SHA256: "abc"}}}}, "tenants[0].keys[1].sha256: must be 64 hex characters"},
		{"non-hex hash", []TenantSpec{{ID: "a", Keys: []KeySpec{{SHA256: strings.Repeat("g", 64)}}}}, "tenants[0].keys[0].sha256: must be 64 hex characters"},
		{"same key twice", []TenantSpec{{ID: "a", Keys: []KeySpec{{SHA256: good}}}, {ID: "b", Keys: []KeySpec{{SHA256: strings.ToUpper(good)}}}}, "tenants[1].keys[0].sha256: same key as tenants[0].keys[0]"},
		{"duplicate key name", []TenantSpec{{ID: "a", Keys: []KeySpec{{Name: "ci", SHA256: good}, {Name: "ci", SHA256: HashKey("other")}}}}, `tenants[0].keys[1].name: duplicate of tenants[0].keys[0].name "ci"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Config{Tenants: tt.tenants}
			c.SetDefaults()
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}
