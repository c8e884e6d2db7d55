package bench

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/url"
	"strings"
	"time"
)

// Workload names accepted by Config.Workload.
const (
	WorkloadRandom       = "random"
	WorkloadSharedPrefix = "shared-prefix"
	WorkloadTrace        = "trace"
)

// Endpoint names accepted by Config.Endpoint.
const (
	EndpointChat        = "chat"
	EndpointCompletions = "completions"
)

// Config is one benchmark run. The zero value of every field but URL and Model means the default
// written beside it; Validate reports what is wrong, naming the field.
type Config struct {
	// URL is the OpenAI base URL, e.g. http://127.0.0.1:8080/v1. Required.
	URL string
	// Replicas are more base URLs of the same target (gateway replicas in front of one fleet):
	// the requests go round robin over URL and these, in arrival order, as a round-robin load
	// balancer in front of them would send them.
	Replicas []string
	// ReplicaSpread is how the requests go over URL and Replicas: "even" (the default: round
	// robin, as a round-robin load balancer sends them), "skewed" (half of them to URL, the rest
	// round robin over Replicas) or "pinned" (each tenant's to one of them: the i-th tenant of
	// the run to the i-th of URL and Replicas, modulo their number, as a balancer with client
	// affinity does).
	ReplicaSpread string
	// Model is sent as the request's model. Required.
	Model string
	// Endpoint is "chat" (POST {URL}/chat/completions, the default) or "completions"
	// (POST {URL}/completions).
	Endpoint string

	// Workload is "random" (default), "shared-prefix" or "trace".
	Workload string
	// Seed seeds every pseudo-random choice (texts, arrivals, tenants, shuffles): one seed,
	// one run.
	Seed uint64

	// Rate is the Poisson arrival rate in requests per second for tenants without their own
	// rate (default 10; +Inf sends everything at once). Ignored by the trace workload, whose
	// arrivals are the trace's timestamps.
	Rate float64
	// Duration stops new arrivals after this long (0: until the workload or Requests ends).
	Duration time.Duration
	// Requests stops after this many arrivals, drops included (0: no limit; for the
	// shared-prefix workload without a Duration, one pass over its Groups*PromptsPerGroup
	// prompts).
	Requests int
	// LocalAddr, when set, is the IP address the bench connects from (for example 127.0.0.2 on
	// loopback), so that two bench processes count as two clients for the gateway's
	// per-client connection bound.
	LocalAddr string
	// MaxInflight bounds the requests outstanding at once; an arrival that finds it full is
	// dropped and counted, never delayed (default 1024).
	MaxInflight int
	// Timeout bounds one request from send to the end of its stream (default 5m).
	Timeout time.Duration
	// Drain is how long requests still outstanding when arrivals stop may run before they are
	// canceled (default 30s).
	Drain time.Duration
	// IgnoreEOS sends vLLM's and SGLang's "ignore_eos": true so outputs run to max_tokens.
	IgnoreEOS bool

	// Tenants spread the requests; none means one anonymous tenant "default" with APIKey.
	Tenants []Tenant
	// APIKey is the bearer key of the default tenant when Tenants is empty.
	APIKey string
	// DeadlineMs is sent as X-Usher-Deadline-Ms for tenants without their own (0: not sent).
	DeadlineMs int

	// SharedPrefix shapes the shared-prefix workload.
	SharedPrefix SharedPrefixConfig
	// Random shapes the random workload.
	Random RandomConfig
	// Trace shapes the trace workload.
	Trace TraceConfig

	// Window is the width of the windows over which tokens served per tenant and Jain's fairness
	// index are computed (default 10s).
	Window time.Duration
	// Scrape lists worker base URLs whose /metrics are read before and after the run for the
	// fleet's prefix-cache hit rate (a URL ending in /metrics is used as it is).
	Scrape []string
	// Objectives are latency objectives by class name: each class that has one gets its
	// Attainment in the report.
	Objectives map[string]Objective
}

// Tenant is one synthetic tenant of the run.
type Tenant struct {
	// Name labels the tenant in the report. Required, unique.
	Name string `json:"name"`
	// Key is sent as "Authorization: Bearer Key"; empty sends no Authorization header.
	Key string `json:"-"`
	// Share weighs how many of the arrivals without a tenant rate go to this tenant
	// (default 1), and weighs the tenant in Jain's index.
	Share float64 `json:"share"`
	// Class, when set, is sent as X-Usher-Priority: interactive, standard or batch.
	Class string `json:"class,omitempty"`
	// Rate, when set, gives the tenant its own Poisson arrivals at this many requests per
	// second, independent of Config.Rate.
	Rate float64 `json:"rate,omitempty"`
	// DeadlineMs, when set, is sent as X-Usher-Deadline-Ms and overrides Config.DeadlineMs.
	DeadlineMs int `json:"deadline_ms,omitempty"`
	// Whole asks for whole (non-streamed) answers, as batch jobs do; their time to first
	// token is their whole latency.
	Whole bool `json:"whole,omitempty"`
}

// SharedPrefixConfig is SGLang's generated-shared-prefix dataset: Groups system prompts, each
// shared by PromptsPerGroup requests that add their own question. Lengths are in tokens, one
// token being one whitespace-separated word.
type SharedPrefixConfig struct {
	Groups          int // default 64
	PromptsPerGroup int // default 16
	SystemPromptLen int // default 2048
	QuestionLen     int // default 128
	OutputLen       int // default 256
}

// RandomConfig draws input and output lengths uniformly in [len*(1-Spread), len*(1+Spread)],
// at least 1; the texts share nothing.
type RandomConfig struct {
	InputLen  int     // default 512
	OutputLen int     // default 128
	Spread    float64 // 0 (default) gives fixed lengths; in [0, 1]
}

// TraceConfig replays a trace file: Mooncake JSON lines (.jsonl) or the Azure LLM inference CSV
// (.csv), chosen by extension.
type TraceConfig struct {
	// File is the trace path. Required by the trace workload.
	File string
	// TimeScale divides the trace's time: 10 replays ten times faster (default 1).
	TimeScale float64
	// TokenScale divides token counts, Mooncake's block size included so sharing is kept:
	// 8 sends one eighth (default 1).
	TokenScale float64
	// Limit replays only the first Limit rows (0: all).
	Limit int
}

func (c Config) withDefaults() Config {
	if c.Endpoint == "" {
		c.Endpoint = EndpointChat
	}
	if c.Workload == "" {
		c.Workload = WorkloadRandom
	}
	if c.Rate == 0 {
		c.Rate = 10
	}
	if c.MaxInflight == 0 {
		c.MaxInflight = 1024
	}
	if c.Timeout == 0 {
		c.Timeout = 5 * time.Minute
	}
	if c.Drain == 0 {
		c.Drain = 30 * time.Second
	}
	if c.Window == 0 {
		c.Window = 10 * time.Second
	}
	if len(c.Tenants) == 0 {
		c.Tenants = []Tenant{{Name: "default", Key: c.APIKey}}
	} else {
		c.Tenants = append([]Tenant(nil), c.Tenants...)
	}
	for i := range c.Tenants {
		if c.Tenants[i].Share == 0 {
			c.Tenants[i].Share = 1
		}
		if c.Tenants[i].DeadlineMs == 0 {
			c.Tenants[i].DeadlineMs = c.DeadlineMs
		}
	}
	sp := &c.SharedPrefix
	sp.Groups = orInt(sp.Groups, 64)
	sp.PromptsPerGroup = orInt(sp.PromptsPerGroup, 16)
	sp.SystemPromptLen = orInt(sp.SystemPromptLen, 2048)
	sp.QuestionLen = orInt(sp.QuestionLen, 128)
	sp.OutputLen = orInt(sp.OutputLen, 256)
	if c.Workload == WorkloadSharedPrefix && c.Requests == 0 && c.Duration == 0 {
		c.Requests = sp.Groups * sp.PromptsPerGroup
	}
	c.Random.InputLen = orInt(c.Random.InputLen, 512)
	c.Random.OutputLen = orInt(c.Random.OutputLen, 128)
	if c.Trace.TimeScale == 0 {
		c.Trace.TimeScale = 1
	}
	if c.Trace.TokenScale == 0 {
		c.Trace.TokenScale = 1
	}
	return c
}

func orInt(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

// Validate reports every problem of the configuration, each error naming its field as
// bench.<field>. It checks the values after defaults are applied.
func (c Config) Validate() error {
	d := c.withDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("bench.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if u, err := url.Parse(d.URL); d.URL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("url", "must be an absolute http(s) URL, got %q", d.URL)
	}
	for i, r := range d.Replicas {
		if u, err := url.Parse(r); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(fmt.Sprintf("replicas[%d]", i), "must be an absolute http(s) URL, got %q", r)
		}
	}
	switch d.ReplicaSpread {
	case "", SpreadEven, SpreadSkewed, SpreadPinned:
	default:
		bad("replica_spread", "must be even, skewed or pinned, got %q", d.ReplicaSpread)
	}
	if d.Model == "" {
		bad("model", "required")
	}
	if d.LocalAddr != "" && net.ParseIP(d.LocalAddr) == nil {
		bad("local_addr", "not an IP address")
	}
	if d.Endpoint != EndpointChat && d.Endpoint != EndpointCompletions {
		bad("endpoint", "must be %q or %q, got %q", EndpointChat, EndpointCompletions, d.Endpoint)
	}
	switch d.Workload {
	case WorkloadRandom:
		if d.Duration == 0 && d.Requests == 0 {
			bad("duration", "the random workload needs a duration or a request count")
		}
	case WorkloadSharedPrefix:
	case WorkloadTrace:
		if d.Trace.File == "" {
			bad("trace.file", "required by the trace workload")
		} else if traceKind(d.Trace.File) == "" {
			bad("trace.file", "must end in .jsonl (Mooncake) or .csv (Azure), got %q", d.Trace.File)
		}
	default:
		bad("workload", "must be %q, %q or %q, got %q", WorkloadRandom, WorkloadSharedPrefix, WorkloadTrace, d.Workload)
	}
	if d.Rate < 0 || math.IsNaN(d.Rate) {
		bad("rate", "must be positive, got %v", d.Rate)
	}
	if d.Workload != WorkloadTrace && d.Requests == 0 && infiniteRate(d) {
		bad("requests", "an infinite rate sends everything at once and needs a request count")
	}
	if d.Duration < 0 {
		bad("duration", "must not be negative, got %v", d.Duration)
	}
	if d.Requests < 0 {
		bad("requests", "must not be negative, got %d", d.Requests)
	}
	if d.MaxInflight < 0 {
		bad("max_inflight", "must be positive, got %d", d.MaxInflight)
	}
	if d.Timeout < 0 {
		bad("timeout", "must be positive, got %v", d.Timeout)
	}
	if d.Drain < 0 {
		bad("drain", "must be positive, got %v", d.Drain)
	}
	if d.Window < 0 {
		bad("window", "must be positive, got %v", d.Window)
	}
	if d.DeadlineMs < 0 {
		bad("deadline_ms", "must not be negative, got %d", d.DeadlineMs)
	}
	names := map[string]bool{}
	for i, t := range d.Tenants {
		f := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			bad(f+".name", "required")
		} else if names[t.Name] {
			bad(f+".name", "duplicate tenant %q", t.Name)
		}
		names[t.Name] = true
		if !(t.Share > 0) || math.IsInf(t.Share, 0) {
			bad(f+".share", "must be positive and finite, got %v", t.Share)
		}
		if t.Class != "" && !validClass(t.Class) {
			bad(f+".class", "must be interactive, standard or batch, got %q", t.Class)
		}
		if t.Rate < 0 || math.IsNaN(t.Rate) {
			bad(f+".rate", "must be positive, got %v", t.Rate)
		}
		if t.Rate > 0 && d.Workload == WorkloadTrace {
			bad(f+".rate", "a tenant rate needs a synthetic workload; the trace sets the arrivals")
		}
		if t.DeadlineMs < 0 {
			bad(f+".deadline_ms", "must not be negative, got %d", t.DeadlineMs)
		}
	}
	sp := d.SharedPrefix
	for _, f := range []struct {
		name string
		v    int
	}{
		{"shared_prefix.groups", sp.Groups},
		{"shared_prefix.prompts_per_group", sp.PromptsPerGroup},
		{"shared_prefix.system_prompt_len", sp.SystemPromptLen},
		{"shared_prefix.question_len", sp.QuestionLen},
		{"shared_prefix.output_len", sp.OutputLen},
		{"random.input_len", d.Random.InputLen},
		{"random.output_len", d.Random.OutputLen},
		{"trace.limit", d.Trace.Limit + 1},
	} {
		if f.v < 1 {
			bad(f.name, "must be positive, got %d", f.v)
		}
	}
	if d.Random.Spread < 0 || d.Random.Spread > 1 || math.IsNaN(d.Random.Spread) {
		bad("random.spread", "must be in [0, 1], got %v", d.Random.Spread)
	}
	if !(d.Trace.TimeScale > 0) || math.IsInf(d.Trace.TimeScale, 0) {
		bad("trace.time_scale", "must be positive and finite, got %v", d.Trace.TimeScale)
	}
	if !(d.Trace.TokenScale >= 1) || d.Trace.TokenScale > mooncakeBlockTokens || math.IsInf(d.Trace.TokenScale, 0) {
		bad("trace.token_scale", "must be in [1, %d], got %v", mooncakeBlockTokens, d.Trace.TokenScale)
	}
	for i, s := range d.Scrape {
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad(fmt.Sprintf("scrape[%d]", i), "must be an absolute http(s) URL, got %q", s)
		}
	}
	return errors.Join(errs...)
}

// infiniteRate reports whether some tenant's arrivals come at an infinite rate.
func infiniteRate(c Config) bool {
	for _, t := range c.Tenants {
		if math.IsInf(t.Rate, 1) || (t.Rate == 0 && math.IsInf(c.Rate, 1)) {
			return true
		}
	}
	return false
}

// The spreads of requests over replicas (Config.ReplicaSpread).
const (
	SpreadEven   = "even"
	SpreadSkewed = "skewed"
	SpreadPinned = "pinned"
)

func validClass(c string) bool {
	return c == "interactive" || c == "standard" || c == "batch"
}

// RegisterFlags binds the configuration to fs. Flags left unset keep c's current values.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.URL, "url", c.URL, "OpenAI base URL of the target, e.g. http://127.0.0.1:8080/v1 (required)")
	fs.Var((*stringsFlag)(&c.Replicas), "replica-url", "base URL of another replica of the target, repeatable: requests go round robin over --url and these")
	fs.StringVar(&c.ReplicaSpread, "replica-spread", c.ReplicaSpread, "how requests go over --url and the --replica-url: even (round robin, default), skewed (half to --url) or pinned (each tenant to one)")
	fs.StringVar(&c.Model, "model", c.Model, "model name sent with every request (required)")
	fs.StringVar(&c.LocalAddr, "local-addr", c.LocalAddr, "IP address to connect from (e.g. 127.0.0.2), so two bench processes are two clients")
	fs.StringVar(&c.Endpoint, "endpoint", c.Endpoint, "chat (/chat/completions, default) or completions (/completions)")
	fs.StringVar(&c.Workload, "workload", c.Workload, "random (default), shared-prefix or trace")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of every pseudo-random choice")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "Poisson arrival rate in req/s for tenants without their own rate (default 10; inf: all at once)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "stop arrivals after this long (0: workload end)")
	fs.IntVar(&c.Requests, "requests", c.Requests, "stop after this many arrivals (0: no limit)")
	fs.IntVar(&c.MaxInflight, "max-inflight", c.MaxInflight, "most requests outstanding; arrivals beyond it are dropped and counted (default 1024)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "bound on one request (default 5m)")
	fs.DurationVar(&c.Drain, "drain", c.Drain, "how long outstanding requests may finish after arrivals stop (default 30s)")
	fs.BoolVar(&c.IgnoreEOS, "ignore-eos", c.IgnoreEOS, `send "ignore_eos": true (vLLM, SGLang) so outputs reach max_tokens`)
	fs.Var((*tenantFlag)(&c.Tenants), "tenant", "tenant as name=KEY[:share[:class[:rate[:deadline_ms]]]], repeatable")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "bearer key when no --tenant is given")
	fs.IntVar(&c.DeadlineMs, "deadline-ms", c.DeadlineMs, "X-Usher-Deadline-Ms for tenants without their own (0: not sent)")
	fs.IntVar(&c.SharedPrefix.Groups, "gsp-groups", c.SharedPrefix.Groups, "shared-prefix: system prompts (default 64)")
	fs.IntVar(&c.SharedPrefix.PromptsPerGroup, "gsp-prompts-per-group", c.SharedPrefix.PromptsPerGroup, "shared-prefix: questions per system prompt (default 16)")
	fs.IntVar(&c.SharedPrefix.SystemPromptLen, "gsp-system-prompt-len", c.SharedPrefix.SystemPromptLen, "shared-prefix: system prompt tokens (default 2048)")
	fs.IntVar(&c.SharedPrefix.QuestionLen, "gsp-question-len", c.SharedPrefix.QuestionLen, "shared-prefix: question tokens (default 128)")
	fs.IntVar(&c.SharedPrefix.OutputLen, "gsp-output-len", c.SharedPrefix.OutputLen, "shared-prefix: max_tokens (default 256)")
	fs.IntVar(&c.Random.InputLen, "random-input-len", c.Random.InputLen, "random: mean prompt tokens (default 512)")
	fs.IntVar(&c.Random.OutputLen, "random-output-len", c.Random.OutputLen, "random: mean max_tokens (default 128)")
	fs.Float64Var(&c.Random.Spread, "random-spread", c.Random.Spread, "random: lengths uniform in len*(1±spread) (default 0: fixed)")
	fs.StringVar(&c.Trace.File, "trace", c.Trace.File, "trace: Mooncake .jsonl or Azure .csv file")
	fs.Float64Var(&c.Trace.TimeScale, "time-scale", c.Trace.TimeScale, "trace: replay this many times faster (default 1)")
	fs.Float64Var(&c.Trace.TokenScale, "token-scale", c.Trace.TokenScale, "trace: divide token counts by this (default 1)")
	fs.IntVar(&c.Trace.Limit, "trace-limit", c.Trace.Limit, "trace: replay only the first N rows (0: all)")
	fs.DurationVar(&c.Window, "window", c.Window, "window of the per-tenant token series and Jain's index (default 10s)")
	fs.Var((*objectivesFlag)(&c.Objectives), "objective", "latency objective of a class as CLASS=TTFT[/TPOT] (e.g. interactive=500ms/80ms), repeatable: the report gives the class's attainment")
	fs.Var((*stringsFlag)(&c.Scrape), "scrape", "worker base URL whose /metrics give prefix-cache hits, repeatable")
}

type stringsFlag []string

func (s *stringsFlag) String() string { return strings.Join(*s, ",") }

func (s *stringsFlag) Set(v string) error {
	*s = append(*s, v)
	return nil
}
