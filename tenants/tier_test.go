package tenants

import (
	"os"
	"path/filepath"
	"reflect"
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

func TestTierObjectives(t *testing.T) {
	var c Config
	if err := yaml.Unmarshal([]byte(`
tiers:
  - name: pro
    objectives:
      interactive: {ttft: 500ms, tpot: 80ms, percentile: 99.9}
      standard: {ttft: 2s}
`), &c); err != nil {
		t.Fatal(err)
	}
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("got %v, want a valid config", err)
	}
	pro := &c.Tiers[0]
	for _, tt := range []struct {
		class string
		want  Objective
	}{
		{ClassInteractive, Objective{TTFT: 500 * time.Millisecond, TPOT: 80 * time.Millisecond, Percentile: 99.9}},
		{ClassStandard, Objective{TTFT: 2 * time.Second, Percentile: DefaultPercentile}},
		{ClassBatch, Objective{Percentile: DefaultPercentile}},
		{"", Objective{TTFT: 2 * time.Second, Percentile: DefaultPercentile}}, // the default class's
	} {
		if got := pro.Objective(tt.class); got != tt.want {
			t.Errorf("objective of %q: got %+v, want %+v", tt.class, got, tt.want)
		}
	}
}

func TestVerdictOfBoth(t *testing.T) {
	for _, tt := range []struct{ ttft, tpot, want Verdict }{
		{VerdictMet, VerdictMet, VerdictMet},
		{VerdictMet, VerdictUnjudged, VerdictMet},
		{VerdictUnjudged, VerdictMet, VerdictMet},
		{VerdictMet, VerdictMissed, VerdictMissed},
		{VerdictMissed, VerdictUnjudged, VerdictMissed},
		{VerdictUnjudged, VerdictUnjudged, VerdictUnjudged},
	} {
		if got := Both(tt.ttft, tt.tpot); got != tt.want {
			t.Errorf("Both(%v, %v): got %v, want %v", tt.ttft, tt.tpot, got, tt.want)
		}
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
		{"negative ttft objective", Config{Tiers: []Tier{{Name: "a", Objectives: ClassObjectives{Interactive: Objective{TTFT: -time.Millisecond}}}}}, "tiers[0].objectives.interactive.ttft: must be positive and at most 1h0m0s"},
		{"ttft objective beyond bound", Config{Tiers: []Tier{{Name: "a", Objectives: ClassObjectives{Standard: Objective{TTFT: 2 * time.Hour}}}}}, "tiers[0].objectives.standard.ttft: must be positive and at most 1h0m0s"},
		{"tpot objective beyond bound", Config{Tiers: []Tier{{Name: "a", Objectives: ClassObjectives{Batch: Objective{TPOT: 2 * time.Minute}}}}}, "tiers[0].objectives.batch.tpot: must be positive and at most 1m0s"},
		{"percentile 100", Config{Tiers: []Tier{{Name: "a", Objectives: ClassObjectives{Interactive: Objective{Percentile: 100}}}}}, "tiers[0].objectives.interactive.percentile: must be above 0 and below 100"},
		{"negative percentile", Config{Tiers: []Tier{{Name: "a", Objectives: ClassObjectives{Interactive: Objective{Percentile: -1}}}}}, "tiers[0].objectives.interactive.percentile: must be above 0 and below 100"},
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

// exampleTiers are the tiers of deploy/usher.example.yaml, after SetDefaults.
func exampleTiers(t testing.TB) Config {
	t.Helper()
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
	return Config{Tiers: c.Tiers, DefaultTier: c.DefaultTier}
}

// TestTierWithinComparesEveryGrant is issue 26's item 2: tiers used to rank by their place in
// the list, so the example's batch tier, listed after free but allowing every model, 10x its
// requests, 8x its prompt cap and no budget, counted as "below" free. A tier is within another
// only when it grants no more of anything.
func TestTierWithinComparesEveryGrant(t *testing.T) {
	c := exampleTiers(t)
	tier := func(name string) *Tier {
		for i := range c.Tiers {
			if c.Tiers[i].Name == name {
				return &c.Tiers[i]
			}
		}
		t.Fatalf("no tier %s in the example", name)
		return nil
	}
	for _, tt := range []struct {
		lower, upper string
		want         bool
	}{
		{"pro", "enterprise", true}, {"free", "pro", true}, {"free", "enterprise", true}, {"free", "free", true},
		{"enterprise", "pro", false}, {"pro", "free", false},
		{"batch", "free", false}, {"batch", "pro", false},
	} {
		if got := tier(tt.lower).Within(tier(tt.upper)); got != tt.want {
			t.Errorf("%s within %s: got %v, want %v", tt.lower, tt.upper, got, tt.want)
		}
	}

	base := Tier{Name: "u", HighestClass: ClassStandard, RequestsPerMinute: 60, TokensPerMinute: 1000, MaxConcurrent: 4,
		MaxQueued: 8, MaxPromptTokens: 100, Models: []string{"demo-*", "big"}, Weight: 2, ExpectedOutputTokens: 256,
		Budget: Budget{TokensPerDay: 10, TokensPerMonth: 100, RequestsPerDay: 5, RequestsPerMonth: 50}}
	base.setDefaults()
	for _, tt := range []struct {
		name string
		more func(*Tier)
	}{
		{"a higher class", func(l *Tier) { l.HighestClass = ClassInteractive }},
		{"more requests", func(l *Tier) { l.RequestsPerMinute = 61 }},
		{"unlimited requests", func(l *Tier) { l.RequestsPerMinute = 0 }},
		{"more tokens", func(l *Tier) { l.TokensPerMinute = 1001 }},
		{"more concurrency", func(l *Tier) { l.MaxConcurrent = 5 }},
		{"a longer queue", func(l *Tier) { l.MaxQueued = 0 }},
		{"a longer prompt", func(l *Tier) { l.MaxPromptTokens = 101 }},
		{"no tokens per day", func(l *Tier) { l.Budget.TokensPerDay = 0 }},
		{"more tokens per month", func(l *Tier) { l.Budget.TokensPerMonth = 101 }},
		{"more requests per day", func(l *Tier) { l.Budget.RequestsPerDay = 6 }},
		{"no requests per month", func(l *Tier) { l.Budget.RequestsPerMonth = 0 }},
		{"a heavier weight", func(l *Tier) { l.Weight = 3 }},
		{"more expected output", func(l *Tier) { l.ExpectedOutputTokens = 257 }},
		{"targeting workers", func(l *Tier) { l.MayTargetWorker = true }},
		{"every model", func(l *Tier) { l.Models = []string{"*"} }},
		{"a wider pattern", func(l *Tier) { l.Models = []string{"demo*"} }},
		{"another model", func(l *Tier) { l.Models = []string{"premium"} }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := base
			l.Name = "l"
			tt.more(&l)
			if l.Within(&base) {
				t.Errorf("a tier with %s: got within, want not", tt.name)
			}
		})
	}
	less := base
	less.Name, less.HighestClass, less.DefaultClass = "l", ClassBatch, ClassBatch
	less.RequestsPerMinute, less.Budget.TokensPerDay, less.Models = 1, 1, []string{"demo-small", "demo-big*", "big"}
	less.Deadlines.Batch = 24 * time.Hour // a default deadline is no grant: the client sets its own
	if !less.Within(&base) {
		t.Errorf("a tier with less of everything: got not within, want within")
	}
}

// TestTierWithinWeighsEveryField fails when Tier gains a field Within has not been taught:
// each field is a grant Within compares, or named here as no grant.
func TestTierWithinWeighsEveryField(t *testing.T) {
	known := map[string]bool{
		"Name": true, "DefaultClass": true, "Deadlines": true, "Objectives": true, // no grants (see Within)
		"HighestClass": true, "Weight": true, "RequestsPerMinute": true, "TokensPerMinute": true,
		"MaxConcurrent": true, "MaxQueued": true, "MaxPromptTokens": true, "ExpectedOutputTokens": true,
		"Models": true, "MayTargetWorker": true, "Budget": true,
	}
	rt := reflect.TypeOf(Tier{})
	for i := range rt.NumField() {
		if !known[rt.Field(i).Name] {
			t.Errorf("Tier.%s: decide whether it is a grant, teach Within, and name it here", rt.Field(i).Name)
		}
	}
	if n := reflect.TypeOf(Budget{}).NumField(); n != 5 {
		t.Errorf("Budget has %d fields, Within compares 4 caps and skips the soft threshold", n)
	}
}
