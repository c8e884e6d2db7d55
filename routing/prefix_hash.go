package routing

import (
	"context"

	"github.com/cespare/xxhash/v2"
)

func init() {
	registerPolicy("prefix_hash", func(env policyEnv) (Policy, error) {
		p := newPrefixHash(env.cfg.PrefixHash, env.rand)
		p.scope = env.scope
		return p, nil
	})
}

// PrefixHashConfig sets the prefix_hash policy: how much of the prompt is hashed, and its ring
// (a worker above the ring's load bound is saturated and the request spills to the next ones).
type PrefixHashConfig struct {
	// PrefixTokens is how many leading tokens (whitespace-separated words) of the prompt are
	// hashed: requests that share them meet on one worker. Default 256.
	PrefixTokens int `yaml:"prefix_tokens"`
	RingConfig   `yaml:",inline"`
}

func (c *PrefixHashConfig) setDefaults() {
	if c.PrefixTokens == 0 {
		c.PrefixTokens = 256
	}
	c.RingConfig.setDefaults()
}

func (c PrefixHashConfig) validate(prefix string) []error {
	errs := c.RingConfig.validate(prefix)
	if c.PrefixTokens < 1 {
		errs = append(errs, fieldError(prefix, "prefix_tokens", "must be at least 1, got %d", c.PrefixTokens))
	}
	return errs
}

// PrefixHash hashes the first PrefixTokens tokens of the prompt onto a ring with virtual nodes, so
// requests sharing a system prompt land on the worker that has it cached. When that worker is
// saturated the request spills to the next workers clockwise (route "spill"), which keeps partial
// locality: the spill of one prefix goes to the same few workers. A request without a prompt goes
// to the least loaded worker. Safe for concurrent use; a pick hashes at most the prefix and does
// a binary search.
//
// Outside the global cache scope the prefix is hashed with the request's scope (see CacheScope),
// so another tenant's copy of a prompt lands, in general, elsewhere: the scopes share no cache
// to meet on, and on an engine that keeps one cache for all (no cache salt) a guess is not sent
// to where the guessed prompt is cached.
type PrefixHash struct {
	tokens     int
	loadFactor float64
	ring       ringCache
	promptless *LeastRequest
	scope      CacheScope // Config.CacheScope; the zero value isolates tenants
}

var (
	_ Policy          = (*PrefixHash)(nil)
	_ workersObserver = (*PrefixHash)(nil)
)

func newPrefixHash(cfg PrefixHashConfig, rnd randSource) *PrefixHash {
	return &PrefixHash{tokens: cfg.PrefixTokens, loadFactor: cfg.LoadFactor, ring: ringCache{vnodes: cfg.VirtualNodes}, promptless: &LeastRequest{rand: rnd}}
}

// WorkersChanged implements workersObserver.
func (p *PrefixHash) WorkersChanged(workers []*Worker) { p.ring.WorkersChanged(workers) }

// Pick implements Policy.
func (p *PrefixHash) Pick(ctx context.Context, r choice, workers []*Worker) (*Worker, Route) {
	if r.Prompt == "" {
		return p.promptless.Pick(ctx, r, workers)
	}
	key := xxhash.Sum64String(leadingTokens(r.Prompt, p.tokens))
	if ns := p.scope.namespace(r.Request); ns != "" {
		key = kvMix(key, xxhash.Sum64String(ns))
	}
	return pickOnRing(p.ring.get(workers), r, key, p.loadFactor)
}

// leadingTokens returns the prefix of s that holds its first n whitespace-separated words.
func leadingTokens(s string, n int) string {
	inWord := false
	for i := 0; i < len(s); i++ {
		space := s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'
		switch {
		case !space && !inWord:
			inWord = true
		case space && inWord:
			inWord = false
			if n--; n == 0 {
				return s[:i]
			}
		}
	}
	return s
}
