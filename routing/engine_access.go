package routing

import (
	"fmt"
	"net/http"
	"slices"
)

// EngineAccess is how the gateway speaks to an engine beyond its URL: the credential the engine
// wants (vLLM's or llama-server's --api-key, a hosted OpenAI-compatible endpoint) and the names
// it gives the models usher serves. It is part of WorkerSpec and of DiscoveryConfig (every
// worker of the name shares it).
//
// The key is the config file's only: it never reads from or shows in the admin API (JSON), so a
// worker added at run time has none, and the admin API cannot make the gateway send a secret of
// its environment to a URL of the caller's choice. The client's own Authorization header never
// reaches an engine: the gateway sends this key, or no Authorization at all.
type EngineAccess struct {
	// APIKey is sent to the engine as `Authorization: Bearer <key>` on every request, health
	// check and metrics scrape. Prefer APIKeyEnv: a key written in the file is logged as a
	// warning at start (the key itself never is).
	APIKey string `yaml:"api_key" json:"-"`
	// APIKeyEnv names the environment variable holding APIKey; the configuration loader reads
	// it into APIKey (an unset or empty variable is a config error).
	APIKeyEnv string `yaml:"api_key_env" json:"-"`
	// ModelAliases maps a model name clients use (one of the worker's models) to the name the
	// engine knows it by, e.g. {"llama-3-8b": "meta-llama/Meta-Llama-3-8B-Instruct"}: the
	// engine gets its own name in the request, and the client sees its name in the answer's
	// `model`, streamed or not.
	ModelAliases map[string]string `yaml:"model_aliases" json:"model_aliases,omitempty"`
}

// validate reports the problems of a, each naming its field below prefix; models are the
// models of the worker (or of every worker of a discovered name).
func (a EngineAccess) validate(prefix string, models []string) []error {
	var errs []error
	for _, public := range sortedKeys(a.ModelAliases) {
		field := fmt.Sprintf("model_aliases[%q]", public)
		if !slices.Contains(models, public) {
			errs = append(errs, fieldError(prefix, field, "%q is not one of the worker's models %v", public, models))
		}
		if a.ModelAliases[public] == "" {
			errs = append(errs, fieldError(prefix, field, "the engine's name must not be empty"))
		}
	}
	return errs
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// EngineModel is the name the worker's engine knows model by: its alias, or model itself.
func (w *Worker) EngineModel(model string) string {
	if name, ok := w.spec.ModelAliases[model]; ok {
		return name
	}
	return model
}

// Authorize sets the request's Authorization to the worker's key, or removes it when the worker
// has none, so that no other credential can reach the engine. The value set is shared by every
// request to the worker: h's values must be read, never written into (as net/http does).
func (w *Worker) Authorize(h http.Header) {
	if w.authorization == nil {
		delete(h, "Authorization")
		return
	}
	h["Authorization"] = w.authorization
}
