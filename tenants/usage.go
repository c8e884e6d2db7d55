package tenants

import (
	"errors"
	"time"
)

// UsageConfig configures the usage ledger (`usage:` in the file).
type UsageConfig struct {
	// FlushInterval is how often a replica writes the usage it holds in memory to the store, and
	// (with Redis) how often the usage counted in Redis is folded into the store. Without Redis
	// it is also what a replica killed outright can lose. Default 1s.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// HourlyRetention is how long usage is kept per hour; older hours are rolled up into days.
	// Default 720h (30 days).
	HourlyRetention time.Duration `yaml:"hourly_retention"`
	// Retention is how long usage is kept at all (per day); older days are deleted. Default
	// 9600h (400 days). At least HourlyRetention.
	Retention time.Duration `yaml:"retention"`
	// RedisPrefix prefixes the ledger's Redis keys; default "usher:usage:".
	RedisPrefix string `yaml:"redis_prefix"`
	// RedisTimeout bounds one move of recorded usage to Redis; past it the usage is written to
	// the store by this replica. Default 1s.
	RedisTimeout time.Duration `yaml:"redis_timeout"`
}

func (c *UsageConfig) setDefaults() {
	if c.FlushInterval == 0 {
		c.FlushInterval = time.Second
	}
	if c.HourlyRetention == 0 {
		c.HourlyRetention = 30 * 24 * time.Hour
	}
	if c.Retention == 0 {
		c.Retention = 400 * 24 * time.Hour
	}
	if c.RedisPrefix == "" {
		c.RedisPrefix = "usher:usage:"
	}
	if c.RedisTimeout == 0 {
		c.RedisTimeout = time.Second
	}
}

func (c UsageConfig) validate() []error {
	var errs []error
	if c.FlushInterval < 10*time.Millisecond {
		errs = append(errs, errors.New("usage.flush_interval: must be at least 10ms"))
	}
	if c.HourlyRetention < time.Hour {
		errs = append(errs, errors.New("usage.hourly_retention: must be at least 1h"))
	}
	if c.Retention < c.HourlyRetention {
		errs = append(errs, errors.New("usage.retention: must be at least usage.hourly_retention"))
	}
	if c.RedisTimeout <= 0 {
		errs = append(errs, errors.New("usage.redis_timeout: must be positive"))
	}
	return errs
}

// Outcome is how a call ended, as the ledger counts it.
type Outcome uint8

// The outcomes. Every call that reached a queue counts as one request; the refusals and errors
// are also counted by kind.
const (
	// OutcomeServed: the call was answered (or its stream was cut), its tokens counted.
	OutcomeServed Outcome = iota
	// OutcomeRefusedLimit: a rate, token or concurrency limit of the tier refused it (429).
	OutcomeRefusedLimit
	// OutcomeRefusedBudget: the tenant's or key's budget for the day or month was spent (429).
	OutcomeRefusedBudget
	// OutcomeQueueFull: the tenant's or class's queue was full (429).
	OutcomeQueueFull
	// OutcomeDeadline: its deadline passed in the queue or could not be met (504, 429).
	OutcomeDeadline
	// OutcomeWorkerError: no worker could answer it (502, 503).
	OutcomeWorkerError
	// OutcomeOther: any other end without an answer (a bad header, shutdown, a client that left
	// before anything was served).
	OutcomeOther
)

// UsageRecord is one call as the ledger records it.
type UsageRecord struct {
	Tenant, Key, Model, Class string
	At                        time.Time
	PromptTokens              int64
	CachedTokens              int64
	CompletionTokens          int64
	// Estimated says the tokens were counted from the stream relayed, not reported by the
	// engine (the client left, the engine cut the stream or never sends usage).
	Estimated bool
	Outcome   Outcome
	// TTFT and TPOT are the call's verdicts against its objectives (see Verdict); a call not
	// judged (refused, or no objective applied) leaves them unjudged.
	TTFT, TPOT Verdict
}

// UsageKey names one row of the ledger: a tenant's key on a model and class, in one period
// (Start is its first instant, UTC).
type UsageKey struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	Model  string `json:"model"`
	Class  string `json:"class"`
	// Start is the period's first instant; the period is an hour or a day.
	Start time.Time `json:"start"`
}

// UsageCounts are the counters of one ledger row.
type UsageCounts struct {
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CachedTokens     int64 `json:"cached_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	// Estimated counts the requests whose tokens were counted from the stream (UsageRecord).
	Estimated     int64 `json:"estimated"`
	RefusedLimit  int64 `json:"refused_limit"`
	RefusedBudget int64 `json:"refused_budget"`
	QueueFull     int64 `json:"queue_full"`
	Deadline      int64 `json:"deadline"`
	WorkerErrors  int64 `json:"worker_errors"`
	// The verdicts against the latency objectives: TTFT's, TPOT's, and the request's as a whole
	// (Both: met counts the requests that missed neither, goodput). Requests neither met nor
	// missed were unjudged or not judged (refusals).
	TTFTMet          int64 `json:"ttft_met"`
	TTFTMissed       int64 `json:"ttft_missed"`
	TPOTMet          int64 `json:"tpot_met"`
	TPOTMissed       int64 `json:"tpot_missed"`
	ObjectivesMet    int64 `json:"objectives_met"`
	ObjectivesMissed int64 `json:"objectives_missed"`
}

// usageColumns are the ledger's counter columns in the order of UsageCounts.fields.
var usageColumns = [...]string{"requests", "prompt_tokens", "cached_tokens", "completion_tokens", "estimated",
	"refused_limit", "refused_budget", "queue_full", "deadline", "worker_errors",
	"ttft_met", "ttft_missed", "tpot_met", "tpot_missed", "objectives_met", "objectives_missed"}

// fields points at the counters in the order of usageColumns.
func (c *UsageCounts) fields() [len(usageColumns)]*int64 {
	return [...]*int64{&c.Requests, &c.PromptTokens, &c.CachedTokens, &c.CompletionTokens, &c.Estimated,
		&c.RefusedLimit, &c.RefusedBudget, &c.QueueFull, &c.Deadline, &c.WorkerErrors,
		&c.TTFTMet, &c.TTFTMissed, &c.TPOTMet, &c.TPOTMissed, &c.ObjectivesMet, &c.ObjectivesMissed}
}

// Add adds o to c, saturating.
func (c *UsageCounts) Add(o UsageCounts) {
	dst, src := c.fields(), o.fields()
	for i := range dst {
		*dst[i] = addSat(*dst[i], *src[i])
	}
}

// countsOf is what one record adds to its row.
func countsOf(r UsageRecord) UsageCounts {
	c := UsageCounts{Requests: 1, PromptTokens: max(r.PromptTokens, 0), CachedTokens: max(r.CachedTokens, 0),
		CompletionTokens: max(r.CompletionTokens, 0)}
	if r.Estimated {
		c.Estimated = 1
	}
	switch r.Outcome {
	case OutcomeRefusedLimit:
		c.RefusedLimit = 1
	case OutcomeRefusedBudget:
		c.RefusedBudget = 1
	case OutcomeQueueFull:
		c.QueueFull = 1
	case OutcomeDeadline:
		c.Deadline = 1
	case OutcomeWorkerError:
		c.WorkerErrors = 1
	}
	for _, v := range []struct {
		verdict     Verdict
		met, missed *int64
	}{{r.TTFT, &c.TTFTMet, &c.TTFTMissed}, {r.TPOT, &c.TPOTMet, &c.TPOTMissed}, {Both(r.TTFT, r.TPOT), &c.ObjectivesMet, &c.ObjectivesMissed}} {
		switch v.verdict {
		case VerdictMet:
			*v.met = 1
		case VerdictMissed:
			*v.missed = 1
		}
	}
	return c
}

// hourOf is the first instant of t's hour, UTC.
func hourOf(t time.Time) time.Time { return t.UTC().Truncate(time.Hour) }

// dayOf is the first instant of t's day, UTC.
func dayOf(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
}
