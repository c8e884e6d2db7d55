package routing

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
)

// Defaults applied by Config.SetDefaults to zero fields.
const (
	DefaultPolicy             = "least_request"
	DefaultMaxConcurrency     = 256    // vLLM's default max_num_seqs
	DefaultMaxTokensInFlight  = 262144 // roughly the KV cache of a 7B model on one 80 GB GPU
	DefaultHealthInterval     = 5 * time.Second
	DefaultHealthTimeout      = 2 * time.Second
	DefaultHealthPath         = "/health"
	DefaultHealthyThreshold   = 2
	DefaultUnhealthyThreshold = 2
	DefaultScrapeInterval     = 2 * time.Second
	DefaultScrapeTimeout      = time.Second
	DefaultScrapePath         = "/metrics"
	DefaultDrainSync          = 2 * time.Second
	DefaultRegistrySync       = 500 * time.Millisecond
	DefaultBreakerFailures    = 5
	DefaultBreakerCooldown    = 10 * time.Second
	DefaultMaxPinsPerTenant   = 10000
)

// WorkerSpec declares one inference worker: an OpenAI-compatible server and the models it serves.
// It reads from the config file (YAML) and from the admin API (JSON) with the same field names.
type WorkerSpec struct {
	// ID names the worker in headers, metrics, pins and the admin API. Letters, digits, '.', '_'
	// and '-' only; unique in the pool.
	ID string `yaml:"id" json:"id"`
	// URL is the base URL, e.g. http://127.0.0.1:9001; requests go to URL + "/v1/...".
	URL string `yaml:"url" json:"url"`
	// Models are the model names this worker serves; at least one.
	Models []string `yaml:"models" json:"models"`
	// MaxConcurrency caps the requests usher keeps in flight on this worker; 0 takes
	// Config.MaxConcurrency.
	MaxConcurrency int `yaml:"max_concurrency" json:"max_concurrency,omitempty"`
	// MaxTokensInFlight caps the tokens (prompt + max output) of the requests in flight on this
	// worker; 0 takes Config.MaxTokensInFlight.
	MaxTokensInFlight int `yaml:"max_tokens_in_flight" json:"max_tokens_in_flight,omitempty"`
	// PriorityHandoff says the worker schedules by vLLM's `priority` request field, so the
	// gateway may pass the request's class on instead of holding it back.
	PriorityHandoff bool `yaml:"priority_handoff" json:"priority_handoff,omitempty"`
	// CacheSalt says the worker's engine partitions its prefix cache by vLLM's `cache_salt`
	// request field, so usher sends each request the salt of its cache scope (see
	// Config.CacheScope) and trusts the engine's cached_tokens as the scope's own. Default
	// (unset) true, but false for an engine that reports fixed slots (llama.cpp's server, which
	// ignores the field): vLLM >= 0.9 with its V1 engine and SGLang with cache_salt support
	// isolate by it. Set false for another engine that refuses the field (vLLM's V0 engine
	// answers 400) or ignores it (Ollama): usher then sends no salt and, since the engine's
	// cache is shared by every scope sent there, tells a client only the cached tokens its own
	// scope's prompts can have put there (see Lease.OwnCached).
	CacheSalt *bool `yaml:"cache_salt" json:"cache_salt,omitempty"`
	// Role is the stages of a disaggregated model's requests the worker serves: prefill,
	// decode or both (default, ""). A model with at least one prefill and one decode worker is
	// served disaggregated (see DisaggregationConfig); a worker of role both serves its whole
	// requests and either stage. A model without both kinds is routed as one pool, whatever the
	// roles.
	Role Role `yaml:"role" json:"role,omitempty"`
	// BootstrapPort is the port of the worker's KV bootstrap server in SGLang's flow (sglang
	// --disaggregation-bootstrap-port), which its decode workers are told to connect to on the
	// host of URL; 0 takes 8998, SGLang's default. Read only for a prefill worker of a model
	// whose protocol is sglang.
	BootstrapPort int `yaml:"bootstrap_port" json:"bootstrap_port,omitempty"`
	// EngineAccess holds the engine's credential and model aliases (api_key, api_key_env,
	// model_aliases).
	EngineAccess `yaml:",inline"`
}

// ModelConfig sets the policy of one model and its parameters; zero fields take defaults. Each
// policy's parameters are documented beside the policy.
type ModelConfig struct {
	// Policy names the policy for this model; "" takes Config.Policy.
	Policy         string               `yaml:"policy"`
	ConsistentHash ConsistentHashConfig `yaml:"consistent_hash"`
	PrefixHash     PrefixHashConfig     `yaml:"prefix_hash"`
	Bucket         BucketConfig         `yaml:"bucket"`
	StickySession  StickySessionConfig  `yaml:"sticky_session"`
	Manual         ManualConfig         `yaml:"manual"`
	CacheAware     CacheAwareConfig     `yaml:"cache_aware"`
	KVAware        KVAwareConfig        `yaml:"kv_aware"`
	// Pins sets the pins of sticky_session and manual.
	Pins PinConfig `yaml:"pins"`
	// Disaggregation overrides Config.Disaggregation for this model; its zero fields take the
	// routing section's.
	Disaggregation DisaggregationConfig `yaml:"disaggregation"`
}

// SetDefaults fills the zero parameters of every policy.
func (mc *ModelConfig) SetDefaults() {
	mc.ConsistentHash.setDefaults()
	mc.PrefixHash.setDefaults()
	mc.Bucket.setDefaults()
	mc.StickySession.setDefaults()
	mc.Manual.setDefaults()
	mc.CacheAware.SetDefaults()
	mc.KVAware.SetDefaults()
	mc.Pins.setDefaults()
}

// validate reports the problems of mc, each naming its field below prefix.
func (mc ModelConfig) validate(prefix string) []error {
	var errs []error
	if mc.Policy != "" && !knownPolicy(mc.Policy) {
		errs = append(errs, fmt.Errorf("%s.policy: unknown policy %q (known: %s)", prefix, mc.Policy, policyNames()))
	}
	errs = append(errs, mc.ConsistentHash.validate(prefix+".consistent_hash")...)
	errs = append(errs, mc.PrefixHash.validate(prefix+".prefix_hash")...)
	errs = append(errs, mc.Bucket.validate(prefix+".bucket")...)
	errs = append(errs, mc.CacheAware.validate(prefix+".cache_aware")...)
	errs = append(errs, mc.KVAware.validate(prefix+".kv_aware")...)
	errs = append(errs, mc.StickySession.validate(prefix+".sticky_session")...)
	errs = append(errs, mc.Manual.validate(prefix+".manual")...)
	errs = append(errs, mc.Pins.validate(prefix+".pins")...)
	errs = append(errs, mc.Disaggregation.validate(prefix+".disaggregation")...)
	return errs
}

// fieldError names a field below prefix in a validation error.
func fieldError(prefix, field, format string, args ...any) error {
	return fmt.Errorf("%s.%s: %s", prefix, field, fmt.Sprintf(format, args...))
}

// HealthConfig sets the active health checks: GET <worker url><Path> every Interval.
//
// A worker starts in an unknown state that routes like a healthy one, so a freshly built pool
// serves at once; the first check decides its state without waiting for a threshold. After that,
// UnhealthyThreshold consecutive failed checks mark a healthy worker unhealthy and
// HealthyThreshold consecutive passed checks bring an unhealthy one back. A check passes on any
// 2xx answer within Timeout.
type HealthConfig struct {
	Interval           time.Duration `yaml:"interval"`            // default 5s
	Timeout            time.Duration `yaml:"timeout"`             // default 2s; at most Interval
	Path               string        `yaml:"path"`                // default /health
	HealthyThreshold   int           `yaml:"healthy_threshold"`   // default 2
	UnhealthyThreshold int           `yaml:"unhealthy_threshold"` // default 2
}

// ScrapeConfig sets how the pool reads each worker's own load from its Prometheus endpoint:
// GET <worker url><Path> every Interval, with the metric names of vLLM, SGLang and llama.cpp's
// server. A reading older than MaxAge counts as busy (see Worker.ReportedQueue).
type ScrapeConfig struct {
	Interval time.Duration `yaml:"interval"` // default 2s
	Timeout  time.Duration `yaml:"timeout"`  // default 1s; at most Interval
	Path     string        `yaml:"path"`     // default /metrics
	MaxAge   time.Duration `yaml:"max_age"`  // default 3 x Interval; at least Interval
}

// BreakerConfig sets the circuit breaker every worker has. Failures consecutive failed requests
// (Outcome.Failed) open the circuit: the worker takes no requests for Cooldown. Then one request
// goes through as a half-open probe; its success closes the circuit, its failure opens it for
// another Cooldown.
type BreakerConfig struct {
	Failures int           `yaml:"failures"` // default 5
	Cooldown time.Duration `yaml:"cooldown"` // default 10s
}

// Config is the `routing:` section of the configuration file. The zero value plus SetDefaults is a
// valid, empty pool.
type Config struct {
	// Workers are the workers known at start; more can be added at run time.
	Workers []WorkerSpec `yaml:"workers"`
	// Discovery finds more workers by DNS, re-resolved on an interval (see DiscoveryConfig).
	Discovery []DiscoveryConfig `yaml:"discovery"`
	// Policy is the policy of every model without its own; default "least_request".
	Policy string `yaml:"policy"`
	// Disaggregation sets how models served by prefill and decode workers are routed: each
	// stage's policy and the hand-off protocol (see DisaggregationConfig).
	Disaggregation DisaggregationConfig `yaml:"disaggregation"`
	// Models holds per-model policy and parameters, keyed by model name.
	Models map[string]ModelConfig `yaml:"models"`
	// Health sets the active health checks.
	Health HealthConfig `yaml:"health"`
	// Scrape sets the reading of the workers' own load signals.
	Scrape ScrapeConfig `yaml:"scrape"`
	// Breaker sets the per-worker circuit breaker.
	Breaker BreakerConfig `yaml:"breaker"`
	// DrainSync is how often a gateway with a shared DrainStore reads the drain state other
	// replicas set; default 2s.
	DrainSync time.Duration `yaml:"drain_sync"`
	// RegistrySync is how often a gateway with a shared WorkerRegistry reads the workers added,
	// changed and removed through the admin API, in case it missed an announcement; default
	// 500ms. With Redis, replicas apply such a change at once.
	RegistrySync time.Duration `yaml:"registry_sync"`
	// AllowLinkLocalWorkers lets workers added or changed through the admin API point at a
	// link-local address (169.254.0.0/16, fe80::/10) or a cloud's instance metadata service
	// (metadata.google.internal, fd00:ec2::254...). Default false: they are refused with 400,
	// since such a worker would let an admin API caller read the cloud's credentials through
	// usher. Workers of this file are not checked; a name that resolves to such an address is
	// not caught (block the metadata service at the network for that).
	AllowLinkLocalWorkers bool `yaml:"allow_link_local_workers"`
	// MaxConcurrency is the ceiling of the learned concurrency limit of workers that set no
	// max_concurrency of their own; default 256.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Concurrency sets how those workers' limits are learned from their engines.
	Concurrency ConcurrencyConfig `yaml:"concurrency"`
	// MaxTokensInFlight is the per-worker token cap of workers that set none; default 262144.
	MaxTokensInFlight int `yaml:"max_tokens_in_flight"`
	// CacheScope is whose prompts may share a prefix cache: "tenant" (default), "tier" or
	// "global". It keys cache_aware's tree (local and shared among replicas), kv_aware's use of
	// the engines' events, and the cache_salt sent to engines that take one (WorkerSpec.CacheSalt).
	//
	// A shared prefix cache is an oracle: whoever shares it can tell, from a faster answer, the
	// cached_tokens of the usage, the X-Usher-Route header or the worker chosen, whether a
	// prompt it guesses was sent before by someone else, and recover a secret in another's
	// prompt guess by guess. "tenant" shares nothing between tenants. "tier" lets the tenants of
	// one tier reuse each other's prefixes (a system prompt every tenant of the tier sends) and
	// so read each other's prompts by guessing; "global" does that across all tenants. Choose
	// them only when the tenants sharing are one trust domain.
	CacheScope CacheScope `yaml:"cache_scope"`
	// CacheSaltKey is the per-deployment secret the cache salts are derived from (HMAC-SHA256 of
	// the scope's name), the same on every replica; set it from the environment
	// (USHER_ROUTING_CACHE_SALT_KEY). Without it the salt is a fixed derivation of the scope's
	// name: still one per scope through usher, which replaces any cache_salt a client sends,
	// but computable by whoever knows a tenant's ID and reaches an engine directly.
	CacheSaltKey string `yaml:"cache_salt_key"`
	// MaxPinsPerTenant bounds the pins (sessions and routing keys of sticky_session and manual,
	// every model's together) one tenant holds in the pin store: a new pin past it removes that
	// tenant's least recently used one, so a tenant inventing session ids costs the store no
	// more than this many pins and loses only its own stickiness. Default 10,000 (a pin takes
	// about 1 KB in memory).
	MaxPinsPerTenant int `yaml:"max_pins_per_tenant"`
}

// SetDefaults fills the zero fields of c with the package defaults. Worker caps left at 0 stay 0
// here and take the Config caps when the pool is built.
func (c *Config) SetDefaults() {
	if c.Policy == "" {
		c.Policy = DefaultPolicy
	}
	c.Disaggregation.setDefaults()
	c.Discovery = slices.Clone(c.Discovery)
	for i := range c.Discovery {
		c.Discovery[i].setDefaults()
	}
	// A clone, so the caller's map is never written.
	c.Models = maps.Clone(c.Models)
	for name, mc := range c.Models {
		mc.SetDefaults()
		c.Models[name] = mc
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultMaxConcurrency
	}
	if c.MaxTokensInFlight == 0 {
		c.MaxTokensInFlight = DefaultMaxTokensInFlight
	}
	if c.CacheScope == "" {
		c.CacheScope = CacheScopeTenant
	}
	if c.MaxPinsPerTenant == 0 {
		c.MaxPinsPerTenant = DefaultMaxPinsPerTenant
	}
	c.Concurrency.setDefaults()
	sc := &c.Scrape
	setPollDefaults(&sc.Interval, &sc.Timeout, &sc.Path, DefaultScrapeInterval, DefaultScrapeTimeout, DefaultScrapePath)
	if sc.MaxAge == 0 {
		sc.MaxAge = 3 * sc.Interval
	}
	if c.DrainSync == 0 {
		c.DrainSync = DefaultDrainSync
	}
	if c.RegistrySync == 0 {
		c.RegistrySync = DefaultRegistrySync
	}
	if c.Breaker.Failures == 0 {
		c.Breaker.Failures = DefaultBreakerFailures
	}
	if c.Breaker.Cooldown == 0 {
		c.Breaker.Cooldown = DefaultBreakerCooldown
	}
	h := &c.Health
	setPollDefaults(&h.Interval, &h.Timeout, &h.Path, DefaultHealthInterval, DefaultHealthTimeout, DefaultHealthPath)
	if h.HealthyThreshold == 0 {
		h.HealthyThreshold = DefaultHealthyThreshold
	}
	if h.UnhealthyThreshold == 0 {
		h.UnhealthyThreshold = DefaultUnhealthyThreshold
	}
}

// Validate reports every problem of c, each naming its field ("routing.workers[1].url: ...").
// Call it after SetDefaults.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("routing.%s: %s", field, fmt.Sprintf(format, args...)))
	}
	if !knownPolicy(c.Policy) {
		bad("policy", "unknown policy %q (known: %s)", c.Policy, policyNames())
	}
	if c.MaxConcurrency < 1 {
		bad("max_concurrency", "must be at least 1, got %d", c.MaxConcurrency)
	}
	if c.MaxPinsPerTenant < 1 {
		bad("max_pins_per_tenant", "must be at least 1, got %d", c.MaxPinsPerTenant)
	}
	if c.MaxTokensInFlight < 1 {
		bad("max_tokens_in_flight", "must be at least 1, got %d", c.MaxTokensInFlight)
	}
	if !c.CacheScope.valid() {
		bad("cache_scope", "must be one of tenant, tier, global, got %q", c.CacheScope)
	}
	errs = append(errs, c.Concurrency.validate()...)
	errs = append(errs, c.Disaggregation.validate("routing.disaggregation")...)
	seen := make(map[string]int, len(c.Workers))
	for i, w := range c.Workers {
		field := fmt.Sprintf("workers[%d]", i)
		errs = append(errs, validateWorker("routing."+field, w)...)
		if j, dup := seen[w.ID]; dup && w.ID != "" {
			bad(field+".id", "duplicate id %q (also workers[%d])", w.ID, j)
		}
		seen[w.ID] = i
	}
	errs = append(errs, validateDiscovery(c.Discovery)...)
	names := make([]string, 0, len(c.Models))
	for name := range c.Models {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "" {
			bad("models", "model name must not be empty")
		}
		errs = append(errs, c.Models[name].validate(fmt.Sprintf("routing.models[%q]", name))...)
	}
	h := c.Health
	errs = append(errs, validatePoll("routing.health", h.Interval, h.Timeout, h.Path)...)
	if h.HealthyThreshold < 1 {
		bad("health.healthy_threshold", "must be at least 1, got %d", h.HealthyThreshold)
	}
	if h.UnhealthyThreshold < 1 {
		bad("health.unhealthy_threshold", "must be at least 1, got %d", h.UnhealthyThreshold)
	}
	sc := c.Scrape
	errs = append(errs, validatePoll("routing.scrape", sc.Interval, sc.Timeout, sc.Path)...)
	if sc.MaxAge < sc.Interval {
		bad("scrape.max_age", "must be at least scrape.interval (%s), got %s", sc.Interval, sc.MaxAge)
	}
	if c.DrainSync <= 0 {
		bad("drain_sync", "must be positive, got %s", c.DrainSync)
	}
	if c.RegistrySync <= 0 {
		bad("registry_sync", "must be positive, got %s", c.RegistrySync)
	}
	if c.Breaker.Failures < 1 {
		bad("breaker.failures", "must be at least 1, got %d", c.Breaker.Failures)
	}
	if c.Breaker.Cooldown <= 0 {
		bad("breaker.cooldown", "must be positive, got %s", c.Breaker.Cooldown)
	}
	return errors.Join(errs...)
}

// setPollDefaults fills the zero interval, timeout and path of a periodic HTTP probe (health
// check, scrape); the timeout never exceeds the interval.
func setPollDefaults(interval, timeout *time.Duration, path *string, defInterval, defTimeout time.Duration, defPath string) {
	if *interval == 0 {
		*interval = defInterval
	}
	if *timeout == 0 {
		*timeout = min(defTimeout, *interval)
	}
	if *path == "" {
		*path = defPath
	}
}

// validatePoll checks the interval, timeout and path of a periodic HTTP probe below prefix.
func validatePoll(prefix string, interval, timeout time.Duration, path string) []error {
	var errs []error
	if interval <= 0 {
		errs = append(errs, fieldError(prefix, "interval", "must be positive, got %s", interval))
	}
	if timeout <= 0 || timeout > interval {
		errs = append(errs, fieldError(prefix, "timeout", "must be positive and at most %s.interval (%s), got %s", strings.TrimPrefix(prefix, "routing."), interval, timeout))
	}
	if len(path) == 0 || path[0] != '/' {
		errs = append(errs, fieldError(prefix, "path", "must start with '/', got %q", path))
	}
	return errs
}

var workerIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// validateWorker checks one worker spec; each error names its field below prefix.
func validateWorker(prefix string, w WorkerSpec) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", prefix, field, fmt.Sprintf(format, args...)))
	}
	if !workerIDPattern.MatchString(w.ID) {
		bad("id", "must be 1 to 128 letters, digits, '.', '_' or '-', got %q", w.ID)
	}
	if _, err := parseWorkerURL(w.URL); err != nil {
		bad("url", "%v", err)
	}
	if len(w.Models) == 0 {
		bad("models", "a worker must serve at least one model")
	}
	for i, m := range w.Models {
		if m == "" {
			bad(fmt.Sprintf("models[%d]", i), "must not be empty")
		}
		if slices.Index(w.Models, m) != i {
			bad(fmt.Sprintf("models[%d]", i), "duplicate model %q", m)
		}
	}
	if w.MaxConcurrency < 0 {
		bad("max_concurrency", "must not be negative, got %d", w.MaxConcurrency)
	}
	if w.MaxTokensInFlight < 0 {
		bad("max_tokens_in_flight", "must not be negative, got %d", w.MaxTokensInFlight)
	}
	if !w.Role.valid() {
		bad("role", "must be prefill, decode or both, got %q", w.Role)
	}
	if w.BootstrapPort < 0 || w.BootstrapPort > 65535 {
		bad("bootstrap_port", "must be 1 to 65535 (0: 8998), got %d", w.BootstrapPort)
	}
	return append(errs, w.EngineAccess.validate(prefix, w.Models)...)
}

func parseWorkerURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("must be an absolute http(s) URL, got %q", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("must not carry a query or fragment, got %q", raw)
	}
	return u, nil
}
