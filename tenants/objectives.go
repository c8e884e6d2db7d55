package tenants

import (
	"fmt"
	"time"
)

// Objective is a tier's latency promise for one class: the time to the first token and the time
// per output token after it that Percentile percent of the class's answered requests should
// keep. A zero TTFT or TPOT means the default objective, relative to what the serving worker's
// cost model predicts for the request on an idle worker (the gateway states those defaults);
// a zero Percentile means 99. The gateway judges every answered request against its objective
// and reports the share that met it (attainment); Percentile is the share the promise names.
type Objective struct {
	TTFT       time.Duration `yaml:"ttft"`
	TPOT       time.Duration `yaml:"tpot"`
	Percentile float64       `yaml:"percentile"`
}

// ClassObjectives holds one Objective per class.
type ClassObjectives struct {
	Interactive Objective `yaml:"interactive"`
	Standard    Objective `yaml:"standard"`
	Batch       Objective `yaml:"batch"`
}

// Bounds of an objective: beyond them a promise says nothing a client could check (the longest
// queue deadline is a day; an answer's tokens come seconds apart at worst).
const (
	MaxObjectiveTTFT = time.Hour
	MaxObjectiveTPOT = time.Minute
	// DefaultPercentile is the percentile of an objective that names none.
	DefaultPercentile = 99
)

func (o *Objective) setDefaults() {
	if o.Percentile == 0 {
		o.Percentile = DefaultPercentile
	}
}

func (o Objective) validate(field string) []error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", field, name, fmt.Sprintf(format, args...)))
	}
	if o.TTFT < 0 || o.TTFT > MaxObjectiveTTFT {
		bad("ttft", "must be positive and at most %s (0: the default, relative to the predicted time)", MaxObjectiveTTFT)
	}
	if o.TPOT < 0 || o.TPOT > MaxObjectiveTPOT {
		bad("tpot", "must be positive and at most %s (0: the default, relative to the predicted time)", MaxObjectiveTPOT)
	}
	if !(o.Percentile > 0 && o.Percentile < 100) {
		bad("percentile", "must be above 0 and below 100")
	}
	return errs
}

// Objective returns the objective of class (DefaultClass's for an unknown class).
func (t *Tier) Objective(class string) Objective {
	switch class {
	case ClassInteractive:
		return t.Objectives.Interactive
	case ClassBatch:
		return t.Objectives.Batch
	case ClassStandard:
		return t.Objectives.Standard
	default:
		return t.Objective(t.DefaultClass)
	}
}

// Verdict is how a request fared against one objective.
type Verdict uint8

const (
	// VerdictUnjudged: there was nothing to judge against (no objective could be stated: the
	// class has none, or its default is relative and the worker's cost model could not predict
	// yet) or nothing to judge (a stream the client cut before it could be measured, an answer
	// of fewer than two tokens for TPOT). Counted apart; neither met nor missed.
	VerdictUnjudged Verdict = iota
	// VerdictMet: the request kept the objective.
	VerdictMet
	// VerdictMissed: it did not, or usher or the worker failed it (a 5xx, a deadline passed).
	VerdictMissed
)

var verdictNames = [...]string{"unjudged", "met", "missed"}

func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return "unjudged"
}

// Both is the verdict on a request as a whole, from its TTFT and TPOT verdicts: missed if either
// was missed, met if neither was and one at least was met, else unjudged. Goodput counts the
// requests whose verdict is met.
func Both(ttft, tpot Verdict) Verdict {
	switch {
	case ttft == VerdictMissed || tpot == VerdictMissed:
		return VerdictMissed
	case ttft == VerdictMet || tpot == VerdictMet:
		return VerdictMet
	}
	return VerdictUnjudged
}
