package tenants

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

func TestTierDefaults(t *testing.T) {
	c := Config{Tiers: []Tier{{Name: "free", HighestClass: ClassBatch}, {Name: "pro"}}}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("got %v, want a valid config", err)
	}
	free, pro := c.Tiers[0], c.Tiers[1]
	if free.DefaultClass != ClassBatch {
		t.Errorf("free default class: got %q, want batch (capped by highest_class)", free.DefaultClass)
	}
	if pro.HighestClass != ClassInteractive || pro.DefaultClass != ClassStandard || pro.Weight != 1 ||
		pro.Deadlines.Standard != 2*time.Minute || len(pro.Models) != 1 || pro.Models[0] != "*" {
		t.Errorf("pro: got %+v, want interactive/standard, weight 1, 2m standard deadline, models [*]", pro)
	}
	if c.DefaultTier != "pro" {
		t.Errorf("default tier: got %q, want the last tier, pro", c.DefaultTier)
	}
}

func TestNoTiersDeclaresBuiltin(t *testing.T) {
	var c Config
	c.SetDefaults()
	if len(c.Tiers) != 1 || c.Tiers[0].Name != BuiltinTier || c.DefaultTier != BuiltinTier {
		t.Errorf("got tiers %+v default %q, want one tier %q", c.Tiers, c.DefaultTier, BuiltinTier)
	}
}

func TestTierValidate(t *testing.T) {
	tests := []struct {
		name string
		conf Config
		want string
	}{
		{"bad highest class", Config{Tiers: []Tier{{Name: "a", HighestClass: "urgent"}}}, `tiers[0].highest_class: must be interactive, standard or batch, not "urgent"`},
		{"default above highest", Config{Tiers: []Tier{{Name: "a", HighestClass: ClassStandard, DefaultClass: ClassInteractive}}}, "tiers[0].default_class: interactive is above highest_class standard"},
		{"negative rate", Config{Tiers: []Tier{{Name: "a", RequestsPerMinute: -1}}}, "tiers[0].requests_per_minute: must not be negative"},
		{"lease ttl too short", Config{Limits: LimitsConfig{LeaseTTL: time.Millisecond}}, "limits.lease_ttl: must be at least 1s"},
		{"rate beyond exact floats", Config{Tiers: []Tier{{Name: "a", TokensPerMinute: 1<<53 + 1}}}, "tiers[0].tokens_per_minute: must be at most 2^53"},
		{"bad model pattern", Config{Tiers: []Tier{{Name: "a", Models: []string{"a*b"}}}}, "tiers[0].models[0]: must be a model name"},
		{"duplicate tier", Config{Tiers: []Tier{{Name: "a"}, {Name: "a"}}}, `tiers[1].name: duplicate of tiers[0].name "a"`},
		{"unknown tenant tier", Config{Tiers: []Tier{{Name: "a"}}, Tenants: []TenantSpec{{ID: "t", Tier: "gold"}}}, `tenants[0].tier: names no tier in tiers: "gold"`},
		{"unknown default tier", Config{Tiers: []Tier{{Name: "a"}}, DefaultTier: "b"}, `default_tier: names no tier in tiers: "b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.conf.SetDefaults()
			err := tt.conf.Validate()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestTierAllowsModel(t *testing.T) {
	tier := Tier{Models: []string{"llama-3-8b", "qwen*"}}
	tests := []struct {
		model string
		want  bool
	}{{"llama-3-8b", true}, {"llama-3-70b", false}, {"qwen2.5-7b", true}, {"", false}}
	for _, tt := range tests {
		t.Run(tt.model, func(t *testing.T) {
			if got := tier.AllowsModel(tt.model); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTierClass(t *testing.T) {
	tier := Tier{HighestClass: ClassStandard, DefaultClass: ClassBatch}
	tests := []struct{ requested, want string }{
		{"", ClassBatch}, {"bogus", ClassBatch}, {ClassInteractive, ClassStandard}, {ClassStandard, ClassStandard}, {ClassBatch, ClassBatch},
	}
	for _, tt := range tests {
		t.Run(tt.requested, func(t *testing.T) {
			if got := tier.Class(tt.requested); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestExampleTiers(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "deploy", "usher.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c Config
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("parse: %v", err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("got %v, want a valid config", err)
	}
	var names []string
	for _, tier := range c.Tiers {
		names = append(names, tier.Name)
	}
	if got := strings.Join(names, ","); got != "enterprise,pro,free,batch" {
		t.Errorf("got tiers %s, want enterprise,pro,free,batch", got)
	}
}
