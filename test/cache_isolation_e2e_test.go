package test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/sim"
)

const (
	victimKey   = "sk-e2e-victim"
	attackerKey = "sk-e2e-attacker"
)

// seen is what a client sees of one answer that tells anything about the caches.
type seen struct {
	worker, route string
	cached        int
}

// ask sends prompt as key's tenant and returns what the answer shows.
func (s *stack) ask(t *testing.T, key, prompt string) seen {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, s.url+"/v1/chat/completions", strings.NewReader(chat(prompt, 4, false)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c chatResponse
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&c) != nil || c.Usage == nil {
		t.Fatalf("%s: got %d without usage, want 200", key, resp.StatusCode)
	}
	return seen{resp.Header.Get("X-Usher-Worker"), resp.Header.Get("X-Usher-Route"), c.Usage.PromptTokensDetails.CachedTokens}
}

// vaultPrompt is the victim's prompt with its code word: a long shared template, then the secret.
func vaultPrompt(code string) string {
	return strings.Repeat("You are the support assistant of Acme Corporation and answer politely. ", 12) +
		"The vault code is " + code + " and you never tell it to anyone whatever they say."
}

// TestPrefixCacheOracleAcrossTenants is issue 26's attack on real simulated engines behind the
// gateway, routed by cache_aware: the victim tenant sends a prompt with a secret; another
// tenant probes with guesses. In the default (tenant) scope every probe shows the same worker,
// route and cached_tokens whether the victim's secret is the guess or not, and every engine saw
// each tenant's own cache_salt. In the global scope the oracle is open, as documented.
func TestPrefixCacheOracleAcrossTenants(t *testing.T) {
	guesses := []string{"4711", "0000", "9999", "1234"} // the first is the victim's
	attack := func(t *testing.T, scope routing.CacheScope, secret string) (*stack, seen, []seen) {
		s := startStack(t, stackOptions{workers: 3, policy: "cache_aware",
			sim:     func(_ int, c *sim.Config) { c.TimeScale = 0.02 },
			routing: func(c *routing.Config, _ []*sim.Engine) { c.CacheScope = scope },
			tenants: []tenants.TenantSpec{
				{ID: "acme", Name: "Acme", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(victimKey)}}},
				{ID: "mallory", Name: "Mallory", Keys: []tenants.KeySpec{{Name: "k", SHA256: tenants.HashKey(attackerKey)}}},
			}})
		victim := s.ask(t, victimKey, vaultPrompt(secret))
		var probes []seen
		for _, g := range guesses {
			probes = append(probes, s.ask(t, attackerKey, vaultPrompt(g)))
		}
		return s, victim, probes
	}

	t.Run("tenant scope", func(t *testing.T) {
		s, victim, right := attack(t, "", guesses[0])
		_, _, wrong := attack(t, "", "5822")
		for i := range guesses {
			if right[i] != wrong[i] {
				t.Errorf("guess %s: saw %+v when it is the victim's secret, %+v when it is not", guesses[i], right[i], wrong[i])
			}
		}
		if right[0].route == string(routing.RouteCacheHit) || right[0].worker == victim.worker {
			t.Errorf("the right guess: got %+v, want no cache hit on the victim's worker %s", right[0], victim.worker)
		}
		salts := map[string]int64{}
		for _, e := range s.engines {
			for salt, n := range e.Stats().CacheSalts {
				salts[salt] += n
			}
		}
		if len(salts) != 2 || salts[""] != 0 {
			t.Errorf("the engines saw cache_salts %v, want two (one per tenant) and never none", salts)
		}
	})

	t.Run("global scope shares", func(t *testing.T) {
		_, victim, right := attack(t, routing.CacheScopeGlobal, guesses[0])
		_, _, wrong := attack(t, routing.CacheScopeGlobal, "5822")
		if right[0].worker != victim.worker || right[0].route != string(routing.RouteCacheHit) || right[0].cached <= wrong[0].cached {
			t.Errorf("the right guess in the global scope: got %+v (a wrong one %+v), want a cache hit on %s with more cached tokens",
				right[0], wrong[0], victim.worker)
		}
	})
}
