package main

import (
	"errors"
	"fmt"

	"github.com/usherllm/usher/routing"
)

// resolveEngineKeys reads the environment variable each worker and discovery entry names in
// api_key_env into its api_key (routing.EngineAccess), so the rest of usher sees one key. Errors
// name the YAML path: both fields set, or a variable unset or empty (a worker that needs a key
// would otherwise answer every request 401). lookup is os.LookupEnv outside tests.
func resolveEngineKeys(c *routing.Config, lookup func(string) (string, bool)) error {
	var errs []error
	resolve := func(field string, a *routing.EngineAccess) {
		if a.APIKeyEnv == "" {
			return
		}
		if a.APIKey != "" {
			errs = append(errs, fmt.Errorf("%s: set api_key or api_key_env, not both", field))
			return
		}
		v, ok := lookup(a.APIKeyEnv)
		if !ok || v == "" {
			errs = append(errs, fmt.Errorf("%s.api_key_env: the environment variable %s is not set", field, a.APIKeyEnv))
			return
		}
		a.APIKey = v
	}
	for i := range c.Workers {
		resolve(fmt.Sprintf("routing.workers[%d]", i), &c.Workers[i].EngineAccess)
	}
	for i := range c.Discovery {
		resolve(fmt.Sprintf("routing.discovery[%d]", i), &c.Discovery[i].EngineAccess)
	}
	return errors.Join(errs...)
}

// literalEngineKeys names the fields where an engine key is written in the file itself, for a
// warning at start: a file is copied, committed and shown more often than an environment.
func literalEngineKeys(c routing.Config) []string {
	var out []string
	for i, w := range c.Workers {
		if w.APIKey != "" && w.APIKeyEnv == "" {
			out = append(out, fmt.Sprintf("routing.workers[%d].api_key", i))
		}
	}
	for i, d := range c.Discovery {
		if d.APIKey != "" && d.APIKeyEnv == "" {
			out = append(out, fmt.Sprintf("routing.discovery[%d].api_key", i))
		}
	}
	return out
}
