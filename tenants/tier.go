package tenants

import (
	"fmt"
	"strings"
	"time"
)

// Request classes, highest first. A tier names the highest class its tenants may use and the class
// a request gets when it asks for none.
const (
	ClassInteractive = "interactive"
	ClassStandard    = "standard"
	ClassBatch       = "batch"
)

var classRank = map[string]int{ClassInteractive: 3, ClassStandard: 2, ClassBatch: 1}

// Tier is an SLA tier declared in the config file. A credential may run at a lower tier than its
// tenant's (a JWT `tier` claim, a key minted at a tier) only when that tier grants nothing the
// tenant's does not (see Tier.Within); the order of the list is for display.
//
// For the rates, caps and MaxPromptTokens, 0 means unlimited. A Tier is never modified after
// Config.SetDefaults; share it by pointer.
type Tier struct {
	Name string `yaml:"name"`
	// HighestClass is the highest class the tier may use; default interactive.
	HighestClass string `yaml:"highest_class"`
	// DefaultClass is the class of a request that asks for none; default standard, or
	// HighestClass when that is lower.
	DefaultClass string `yaml:"default_class"`
	// Weight is the tier's fair-share weight between tenants of one class; default 1.
	Weight float64 `yaml:"weight"`
	// RequestsPerMinute and TokensPerMinute are per tenant; tokens count prompt and output.
	RequestsPerMinute int64 `yaml:"requests_per_minute"`
	TokensPerMinute   int64 `yaml:"tokens_per_minute"`
	// MaxConcurrent caps a tenant's requests in flight (queued or running).
	MaxConcurrent int64 `yaml:"max_concurrent"`
	// MaxQueued caps a tenant's requests waiting in the queue.
	MaxQueued int64 `yaml:"max_queued"`
	// Deadlines is the default deadline of a request per class, when it carries none.
	Deadlines ClassDeadlines `yaml:"deadlines"`
	// MaxPromptTokens refuses longer prompts.
	MaxPromptTokens int64 `yaml:"max_prompt_tokens"`
	// ExpectedOutputTokens is the output estimate of a request without max_tokens; default 256.
	ExpectedOutputTokens int64 `yaml:"expected_output_tokens"`
	// Models the tier may use: exact names, "prefix*" patterns, or "*" for all; default ["*"].
	Models []string `yaml:"models"`
	// MayTargetWorker allows the X-Usher-Target-Worker header.
	MayTargetWorker bool `yaml:"may_target_worker"`
	// Budget caps what each tenant of the tier spends per UTC day and month.
	Budget Budget `yaml:"budget"`
	// Objectives are the tier's latency promises per class; see Objective.
	Objectives ClassObjectives `yaml:"objectives"`
}

// Budget caps the tokens (prompt plus completion, as served) and requests a tenant spends per
// UTC calendar day and month; 0 means no cap. A request is refused (429 budget_exceeded) once
// the period's spending has reached a cap, until the period ends.
type Budget struct {
	TokensPerDay     int64 `yaml:"tokens_per_day"`
	TokensPerMonth   int64 `yaml:"tokens_per_month"`
	RequestsPerDay   int64 `yaml:"requests_per_day"`
	RequestsPerMonth int64 `yaml:"requests_per_month"`
	// SoftThreshold is the share of a cap whose crossing is reported once per period (a metric
	// and an audit entry), before anything is refused; default 0.8.
	SoftThreshold float64 `yaml:"soft_threshold"`
}

// ClassDeadlines holds one default deadline per class.
type ClassDeadlines struct {
	Interactive time.Duration `yaml:"interactive"` // default 30s
	Standard    time.Duration `yaml:"standard"`    // default 2m
	Batch       time.Duration `yaml:"batch"`       // default 30m
}

// maxLimit bounds the rates and caps of a tier: 2^53, the largest integer the limiter's floats
// (and Redis' Lua numbers) hold exactly.
const maxLimit = 1 << 53

// BuiltinTier is the name of the tier SetDefaults declares when the file declares none.
const BuiltinTier = "default"

func (t *Tier) setDefaults() {
	if t.HighestClass == "" {
		t.HighestClass = ClassInteractive
	}
	if t.DefaultClass == "" {
		t.DefaultClass = ClassStandard
		if classRank[t.HighestClass] != 0 && classRank[t.HighestClass] < classRank[ClassStandard] {
			t.DefaultClass = t.HighestClass
		}
	}
	if t.Weight == 0 {
		t.Weight = 1
	}
	if t.ExpectedOutputTokens == 0 {
		t.ExpectedOutputTokens = 256
	}
	if t.Deadlines.Interactive == 0 {
		t.Deadlines.Interactive = 30 * time.Second
	}
	if t.Deadlines.Standard == 0 {
		t.Deadlines.Standard = 2 * time.Minute
	}
	if t.Deadlines.Batch == 0 {
		t.Deadlines.Batch = 30 * time.Minute
	}
	if len(t.Models) == 0 {
		t.Models = []string{"*"}
	}
	if t.Budget.SoftThreshold == 0 {
		t.Budget.SoftThreshold = 0.8
	}
	t.Objectives.Interactive.setDefaults()
	t.Objectives.Standard.setDefaults()
	t.Objectives.Batch.setDefaults()
}

func (t *Tier) validate(f string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", f, field, fmt.Sprintf(format, args...)))
	}
	if !idPattern.MatchString(t.Name) {
		bad("name", "must be 1 to 64 characters of A-Z a-z 0-9 . _ -")
	}
	if classRank[t.HighestClass] == 0 {
		bad("highest_class", "must be interactive, standard or batch, not %q", t.HighestClass)
	}
	if classRank[t.DefaultClass] == 0 {
		bad("default_class", "must be interactive, standard or batch, not %q", t.DefaultClass)
	} else if classRank[t.HighestClass] != 0 && classRank[t.DefaultClass] > classRank[t.HighestClass] {
		bad("default_class", "%s is above highest_class %s", t.DefaultClass, t.HighestClass)
	}
	if t.Weight < 0 {
		bad("weight", "must be positive")
	}
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"requests_per_minute", t.RequestsPerMinute}, {"tokens_per_minute", t.TokensPerMinute},
		{"max_concurrent", t.MaxConcurrent}, {"max_queued", t.MaxQueued},
		{"max_prompt_tokens", t.MaxPromptTokens}, {"expected_output_tokens", t.ExpectedOutputTokens},
		{"budget.tokens_per_day", t.Budget.TokensPerDay}, {"budget.tokens_per_month", t.Budget.TokensPerMonth},
		{"budget.requests_per_day", t.Budget.RequestsPerDay}, {"budget.requests_per_month", t.Budget.RequestsPerMonth},
	} {
		if f.v < 0 {
			bad(f.name, "must not be negative (0 means unlimited)")
		}
		if f.v > maxLimit {
			bad(f.name, "must be at most 2^53 (0 means unlimited)")
		}
	}
	if !(t.Budget.SoftThreshold > 0 && t.Budget.SoftThreshold <= 1) {
		bad("budget.soft_threshold", "must be above 0 and at most 1")
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"interactive", t.Deadlines.Interactive}, {"standard", t.Deadlines.Standard}, {"batch", t.Deadlines.Batch}} {
		if f.d < 0 {
			bad("deadlines."+f.name, "must be positive")
		}
	}
	errs = append(errs, t.Objectives.Interactive.validate(f+".objectives.interactive")...)
	errs = append(errs, t.Objectives.Standard.validate(f+".objectives.standard")...)
	errs = append(errs, t.Objectives.Batch.validate(f+".objectives.batch")...)
	for i, m := range t.Models {
		if m == "" || strings.Contains(strings.TrimSuffix(m, "*"), "*") {
			bad(fmt.Sprintf("models[%d]", i), `must be a model name, "prefix*" or "*"`)
		}
	}
	return errs
}

// Within reports whether t grants nothing u does not, so that a credential of a tenant of tier u
// may run at t: every model t allows u allows, its highest class is not above u's, and each of
// its rates, caps and budgets is u's or lower (0, unlimited, is within only 0), its weight and
// expected output no larger, and it targets workers only if u does. Deadlines are not grants
// (a client sets any deadline up to a day with X-Usher-Deadline-Ms), nor are objectives (what
// attainment is judged against, not a service granted), nor is the default class
// (never above the highest) or the soft threshold (a report, not an allowance).
// Cost: one pass over both model lists per model of t.
func (t *Tier) Within(u *Tier) bool {
	capWithin := func(tv, uv int64) bool { return uv == 0 || tv != 0 && tv <= uv }
	return classRank[t.HighestClass] <= classRank[u.HighestClass] &&
		capWithin(t.RequestsPerMinute, u.RequestsPerMinute) &&
		capWithin(t.TokensPerMinute, u.TokensPerMinute) &&
		capWithin(t.MaxConcurrent, u.MaxConcurrent) &&
		capWithin(t.MaxQueued, u.MaxQueued) &&
		capWithin(t.MaxPromptTokens, u.MaxPromptTokens) &&
		capWithin(t.Budget.TokensPerDay, u.Budget.TokensPerDay) &&
		capWithin(t.Budget.TokensPerMonth, u.Budget.TokensPerMonth) &&
		capWithin(t.Budget.RequestsPerDay, u.Budget.RequestsPerDay) &&
		capWithin(t.Budget.RequestsPerMonth, u.Budget.RequestsPerMonth) &&
		t.Weight <= u.Weight &&
		t.ExpectedOutputTokens <= u.ExpectedOutputTokens &&
		(!t.MayTargetWorker || u.MayTargetWorker) &&
		u.allowsModels(t.Models)
}

// allowsModels reports whether every model the patterns of models match, t allows.
func (t *Tier) allowsModels(models []string) bool {
	for _, m := range models {
		prefix, pattern := strings.CutSuffix(m, "*")
		if !pattern {
			if !t.AllowsModel(m) {
				return false
			}
			continue
		}
		covered := false
		for _, um := range t.Models {
			if up, ok := strings.CutSuffix(um, "*"); ok && strings.HasPrefix(prefix, up) {
				covered = true
				break
			}
		}
		if !covered {
			return false
		}
	}
	return true
}

// AllowsModel reports whether the tier may use model. Cost: one pass over Models.
func (t *Tier) AllowsModel(model string) bool {
	for _, m := range t.Models {
		if m == model || m == "*" || strings.HasSuffix(m, "*") && strings.HasPrefix(model, m[:len(m)-1]) {
			return true
		}
	}
	return false
}

// Class returns the class a request asking for requested runs in: DefaultClass when requested is
// empty or unknown, requested when the tier allows it, HighestClass when requested is higher.
func (t *Tier) Class(requested string) string {
	r := classRank[requested]
	switch {
	case r == 0:
		return t.DefaultClass
	case r > classRank[t.HighestClass]:
		return t.HighestClass
	default:
		return requested
	}
}

// Deadline returns the default deadline of class (DefaultClass's for an unknown class).
func (t *Tier) Deadline(class string) time.Duration {
	switch class {
	case ClassInteractive:
		return t.Deadlines.Interactive
	case ClassBatch:
		return t.Deadlines.Batch
	case ClassStandard:
		return t.Deadlines.Standard
	default:
		return t.Deadline(t.DefaultClass)
	}
}
