package adminui

import (
	"math"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// The admin API's JSON shapes for the domain types that do not carry its convention themselves:
// names in snake_case, durations as numbers of seconds named `_seconds`. The console renders the
// domain types as they are.

// pinJSON is a pin; TTLSeconds is the time left in whole seconds, rounded up (as POST /pins
// takes it).
type pinJSON struct {
	Model      string `json:"model"`
	Tenant     string `json:"tenant"`
	Key        string `json:"key"`
	Worker     string `json:"worker"`
	TTLSeconds int64  `json:"ttl_seconds"`
}

func pinsJSON(pins []routing.Pin) []pinJSON {
	out := make([]pinJSON, len(pins))
	for i, p := range pins {
		out[i] = pinJSON{Model: p.Model, Tenant: p.Tenant, Key: p.Key, Worker: p.Worker,
			TTLSeconds: int64(math.Ceil(p.TTL.Seconds()))}
	}
	return out
}

// capacityJSON is a queue.Capacity.
type capacityJSON struct {
	Requests int `json:"requests"`
	Tokens   int `json:"tokens"`
}

// queueJSON is one model's admission queue (queue.Snapshot).
type queueJSON struct {
	Model              string            `json:"model"`
	FIFO               bool              `json:"fifo"`
	Capacity           capacityJSON      `json:"capacity"`
	InFlight           capacityJSON      `json:"in_flight"`
	Reserve            capacityJSON      `json:"reserve"`
	Classes            []queueClassJSON  `json:"classes"`
	Tenants            []queueTenantJSON `json:"tenants"`
	DeadlineMisses     int64             `json:"deadline_misses"`
	ServiceTimeSeconds float64           `json:"service_time_seconds"`
}

type queueClassJSON struct {
	Class             queue.Class `json:"class"`
	Queued            int         `json:"queued"`
	QueuedTokens      int64       `json:"queued_tokens"`
	InFlight          int         `json:"in_flight"`
	InFlightTokens    int64       `json:"in_flight_tokens"`
	OldestWaitSeconds float64     `json:"oldest_wait_seconds"`
	Dispatched        int64       `json:"dispatched"`
	GuardCredit       float64     `json:"guard_credit"`
}

type queueTenantJSON struct {
	Tenant   string      `json:"tenant"`
	Class    queue.Class `json:"class"`
	Queued   int         `json:"queued"`
	InFlight int         `json:"in_flight"`
	// FairShareTokens is the tenant's fair-share counter (weighted tokens charged so far).
	FairShareTokens float64 `json:"fair_share_tokens"`
}

func toQueueJSON(v queueView) queueJSON {
	out := queueJSON{Model: v.Model, FIFO: v.FIFO, Capacity: capacityJSON(v.Capacity), InFlight: capacityJSON(v.InFlight),
		Reserve: capacityJSON(v.Reserve), Classes: make([]queueClassJSON, len(v.Classes)), Tenants: make([]queueTenantJSON, len(v.Tenants)),
		DeadlineMisses: v.DeadlineMisses, ServiceTimeSeconds: v.ServiceTime.Seconds()}
	for i, c := range v.Classes {
		out.Classes[i] = queueClassJSON{Class: c.Class, Queued: c.Queued, QueuedTokens: c.QueuedTokens, InFlight: c.InFlight,
			InFlightTokens: c.InFlightTokens, OldestWaitSeconds: c.OldestWait.Seconds(), Dispatched: c.Dispatched, GuardCredit: c.GuardCredit}
	}
	for i, t := range v.Tenants {
		out.Tenants[i] = queueTenantJSON{Tenant: t.Tenant, Class: t.Class, Queued: t.Queued, InFlight: t.InFlight, FairShareTokens: t.VirtualTokens}
	}
	return out
}

// tierJSON is a tier under the names of the configuration file.
type tierJSON struct {
	Name                 string             `json:"name"`
	HighestClass         string             `json:"highest_class"`
	DefaultClass         string             `json:"default_class"`
	Weight               float64            `json:"weight"`
	RequestsPerMinute    int64              `json:"requests_per_minute"`
	TokensPerMinute      int64              `json:"tokens_per_minute"`
	MaxConcurrent        int64              `json:"max_concurrent"`
	MaxQueued            int64              `json:"max_queued"`
	DeadlinesSeconds     map[string]float64 `json:"deadlines_seconds"` // by class
	MaxPromptTokens      int64              `json:"max_prompt_tokens"`
	ExpectedOutputTokens int64              `json:"expected_output_tokens"`
	Models               []string           `json:"models"`
	MayTargetWorker      bool               `json:"may_target_worker"`
	// Objectives are the latency objectives by class; a 0 TTFT or TPOT is the default, relative
	// to the worker's idle prediction.
	Objectives map[string]objectiveJSON `json:"objectives"`
}

type objectiveJSON struct {
	TTFTSeconds float64 `json:"ttft_seconds"`
	TPOTSeconds float64 `json:"tpot_seconds"`
	Percentile  float64 `json:"percentile"`
}

func objectiveOf(o tenants.Objective) objectiveJSON {
	return objectiveJSON{TTFTSeconds: o.TTFT.Seconds(), TPOTSeconds: o.TPOT.Seconds(), Percentile: o.Percentile}
}

func tiersJSON(tiers []tenants.Tier) []tierJSON {
	out := make([]tierJSON, len(tiers))
	for i, t := range tiers {
		out[i] = tierJSON{Name: t.Name, HighestClass: t.HighestClass, DefaultClass: t.DefaultClass, Weight: t.Weight,
			RequestsPerMinute: t.RequestsPerMinute, TokensPerMinute: t.TokensPerMinute, MaxConcurrent: t.MaxConcurrent,
			MaxQueued: t.MaxQueued, MaxPromptTokens: t.MaxPromptTokens, ExpectedOutputTokens: t.ExpectedOutputTokens,
			Models: t.Models, MayTargetWorker: t.MayTargetWorker,
			DeadlinesSeconds: map[string]float64{
				tenants.ClassInteractive: t.Deadlines.Interactive.Seconds(),
				tenants.ClassStandard:    t.Deadlines.Standard.Seconds(),
				tenants.ClassBatch:       t.Deadlines.Batch.Seconds(),
			},
			Objectives: map[string]objectiveJSON{
				tenants.ClassInteractive: objectiveOf(t.Objectives.Interactive),
				tenants.ClassStandard:    objectiveOf(t.Objectives.Standard),
				tenants.ClassBatch:       objectiveOf(t.Objectives.Batch),
			}}
	}
	return out
}
