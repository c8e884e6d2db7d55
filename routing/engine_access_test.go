package routing

import (
	"net/http"
	"strings"
	"testing"
)

func TestEngineAccess(t *testing.T) {
	dc := DiscoveryConfig{Name: "vllm.local", Port: 8000, Models: []string{"pub"},
		EngineAccess: EngineAccess{APIKey: "k", ModelAliases: map[string]string{"pub": "org/engine"}}}
	dc.setDefaults()
	spec := dc.spec("10.0.0.7")
	w, err := newWorker(spec, Config{MaxConcurrency: 1, MaxTokensInFlight: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := w.EngineModel("pub"); got != "org/engine" {
		t.Errorf("EngineModel(pub): got %q, want the discovered worker's alias", got)
	}
	if got := w.EngineModel("other"); got != "other" {
		t.Errorf("EngineModel(other): got %q, want it unchanged", got)
	}
	h := http.Header{"Authorization": {"Bearer client"}}
	w.Authorize(h)
	if got := h.Get("Authorization"); got != "Bearer k" {
		t.Errorf("with a key: Authorization %q", got)
	}
	spec.APIKey = ""
	keyless, _ := newWorker(spec, Config{MaxConcurrency: 1, MaxTokensInFlight: 1}, nil)
	keyless.Authorize(h)
	if _, ok := h["Authorization"]; ok {
		t.Errorf("without a key: Authorization %q, want none", h.Get("Authorization"))
	}

	bad := dc
	bad.ModelAliases = map[string]string{"nope": "x", "pub": ""}
	errs := bad.validate("routing.discovery[0]")
	var msgs []string
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	joined := strings.Join(msgs, "\n")
	for _, want := range []string{`routing.discovery[0].model_aliases["nope"]: "nope" is not one of`, `routing.discovery[0].model_aliases["pub"]: the engine's name must not be empty`} {
		if !strings.Contains(joined, want) {
			t.Errorf("errors %q lack %q", joined, want)
		}
	}
}
