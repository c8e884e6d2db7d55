package routing

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DefaultDiscoveryInterval is how often a discovered name is resolved again when its config
// sets no interval.
const DefaultDiscoveryInterval = 10 * time.Second

// DiscoveryConfig finds workers by DNS: every address the name resolves to is one worker at
// Scheme://address:Port serving Models. Meant for a Kubernetes headless Service, whose name
// resolves to the addresses of its ready pods. One entry of `routing.discovery`. A discovered
// worker removed through the admin API stays out until its address vanishes from the name and
// comes back; to take one out of rotation for a while, drain it.
type DiscoveryConfig struct {
	// Name is the DNS name to resolve, e.g. vllm.inference.svc.cluster.local.
	Name string `yaml:"name"`
	// Port is the workers' port.
	Port int `yaml:"port"`
	// Scheme is http or https; default http.
	Scheme string `yaml:"scheme"`
	// Models are the models every worker of the name serves; at least one.
	Models []string `yaml:"models"`
	// Interval is how often the name is resolved again; default 10s. A worker that appears
	// takes requests at the next resolution; one that vanishes is drained at the next and
	// removed once its requests in flight end.
	Interval time.Duration `yaml:"interval"`
	// MaxConcurrency, MaxTokensInFlight, PriorityHandoff and CacheSalt apply to every worker
	// of the name, as in WorkerSpec.
	MaxConcurrency    int   `yaml:"max_concurrency"`
	MaxTokensInFlight int   `yaml:"max_tokens_in_flight"`
	PriorityHandoff   bool  `yaml:"priority_handoff"`
	CacheSalt         *bool `yaml:"cache_salt"`
	// Role and BootstrapPort are every worker's of the name, as in WorkerSpec.
	Role          Role `yaml:"role"`
	BootstrapPort int  `yaml:"bootstrap_port"`
	// EngineAccess (api_key, api_key_env, model_aliases) applies to every worker of the name.
	EngineAccess `yaml:",inline"`
}

func (dc *DiscoveryConfig) setDefaults() {
	if dc.Scheme == "" {
		dc.Scheme = "http"
	}
	if dc.Interval == 0 {
		dc.Interval = DefaultDiscoveryInterval
	}
}

// validate reports the problems of dc, each naming its field below prefix.
func (dc DiscoveryConfig) validate(prefix string) []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fieldError(prefix, field, format, args...))
	}
	if dc.Name == "" || strings.ContainsAny(dc.Name, "/: ") {
		bad("name", "must be a DNS name, got %q", dc.Name)
	}
	if dc.Port < 1 || dc.Port > 65535 {
		bad("port", "must be 1 to 65535, got %d", dc.Port)
	}
	if dc.Scheme != "http" && dc.Scheme != "https" {
		bad("scheme", "must be http or https, got %q", dc.Scheme)
	}
	if dc.Interval <= 0 {
		bad("interval", "must be positive, got %s", dc.Interval)
	}
	if !workerIDPattern.MatchString(dc.idPrefix() + "0") {
		bad("name", "its first label must be letters, digits, '-' or '_' to name workers, got %q", dc.Name)
	}
	// Models and caps as every worker found will have them, under a name and URL known good.
	spec := dc.spec("192.0.2.1")
	spec.ID, spec.URL = "x", "http://192.0.2.1"
	errs = append(errs, validateWorker(prefix, spec)...)
	return errs
}

// idPrefix is the start of the IDs of the workers of dc: the first label of the name and the
// port, so that entries of the same Service on other ports stay apart.
func (dc DiscoveryConfig) idPrefix() string {
	label, _, _ := strings.Cut(dc.Name, ".")
	return label + "-" + strconv.Itoa(dc.Port) + "-"
}

// spec is the worker at addr: ID "<first label>-<port>-<address>" (an IPv6 address with '_'
// for ':'), e.g. vllm-8000-10.0.3.7.
func (dc DiscoveryConfig) spec(addr string) WorkerSpec {
	return WorkerSpec{
		ID:                dc.idPrefix() + strings.ReplaceAll(addr, ":", "_"),
		URL:               dc.Scheme + "://" + net.JoinHostPort(addr, strconv.Itoa(dc.Port)),
		Models:            dc.Models,
		MaxConcurrency:    dc.MaxConcurrency,
		MaxTokensInFlight: dc.MaxTokensInFlight,
		PriorityHandoff:   dc.PriorityHandoff,
		CacheSalt:         dc.CacheSalt,
		Role:              dc.Role,
		BootstrapPort:     dc.BootstrapPort,
		EngineAccess:      dc.EngineAccess,
	}
}

// Resolver looks up the addresses of a DNS name. *net.Resolver is one; tests use their own.
// Implementations are safe for concurrent use. A name with no address fails with a
// *net.DNSError whose IsNotFound is true.
type Resolver interface {
	LookupHost(ctx context.Context, host string) ([]string, error)
}

var _ Resolver = (*net.Resolver)(nil)

// discovery keeps the workers of one DiscoveryConfig in the pool. Only its own goroutine (run
// by Pool.Run) uses it.
type discovery struct {
	cfg DiscoveryConfig
	// found are the IDs of the workers this discovery added and has not retired.
	found map[string]bool
}

// discover resolves d's name once and brings the pool in line with the answer: workers of new
// addresses are added (or kept, when they were retiring), workers of vanished addresses
// retired. When the lookup fails for any reason but "no such name", the pool stays as it is:
// a DNS outage does not empty the pool.
func (p *Pool) discover(ctx context.Context, d *discovery) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Interval)
	defer cancel()
	addrs, err := p.resolver.LookupHost(ctx, d.cfg.Name)
	var dnsErr *net.DNSError
	switch {
	case err != nil && errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		addrs = nil
	case err != nil:
		if !errors.Is(ctx.Err(), context.Canceled) {
			p.metrics.discoveryErrors.WithLabelValues(d.cfg.Name).Inc()
			p.logger.Warn("worker discovery failed, the workers found before stay", "name", d.cfg.Name, "err", err)
		}
		return
	}
	seen := make(map[string]bool, len(addrs))
	for _, addr := range addrs {
		spec := d.cfg.spec(addr)
		seen[spec.ID] = true
		if d.found[spec.ID] {
			continue
		}
		if err := p.add(spec, SourceDiscovery); err != nil {
			if !errors.Is(err, ErrWorkerExists) {
				p.logger.Error("discovered worker not added", "name", d.cfg.Name, "worker", spec.ID, "err", err)
				continue
			}
			p.keep(spec.ID)
		}
		d.found[spec.ID] = true
	}
	for id := range d.found {
		if seen[id] {
			continue
		}
		if err := p.Retire(id); err != nil && !errors.Is(err, ErrUnknownWorker) {
			p.logger.Error("vanished worker not retired", "name", d.cfg.Name, "worker", id, "err", err)
			continue
		}
		delete(d.found, id)
	}
}

// keep stops the retirement of worker id, if it is retiring: it takes requests again.
func (p *Pool) keep(id string) {
	if w, err := p.find(id); err == nil && w.retiring.Swap(false) {
		p.changes.notify()
		p.logger.Info("worker kept: it is back", "worker", id)
	}
}

// startDiscovery starts one goroutine per discovery entry. p.mu must be held, Run running.
func (p *Pool) startDiscovery(ctx context.Context) {
	for _, dc := range p.cfg.Discovery {
		d := &discovery{cfg: dc, found: map[string]bool{}}
		p.running.Go(func() { every(ctx, dc.Interval, func(ctx context.Context) { p.discover(ctx, d) }) })
	}
}

// validateDiscovery checks the discovery entries below "routing.discovery".
func validateDiscovery(entries []DiscoveryConfig) []error {
	var errs []error
	for i, dc := range entries {
		prefix := fmt.Sprintf("routing.discovery[%d]", i)
		errs = append(errs, dc.validate(prefix)...)
		if j := slices.IndexFunc(entries[:i], func(o DiscoveryConfig) bool { return o.idPrefix() == dc.idPrefix() }); j >= 0 {
			errs = append(errs, fmt.Errorf("%s.name: the first label and port (%s) are those of discovery[%d]; worker IDs would clash", prefix, strings.TrimSuffix(dc.idPrefix(), "-"), j))
		}
	}
	return errs
}
