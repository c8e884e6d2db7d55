package gateway

import (
	"fmt"
	"net/http"
	"reflect"
	"testing"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// A model the caller's tier does not include is answered exactly as a model that does not
// exist, on every path that names a model: the same status, type, code, param and message, so
// a tenant cannot tell a hidden model from a missing one.
func TestHiddenModelIsAnsweredAsUnknown(t *testing.T) {
	e := newNamingEngine(t, "")
	tier := &tenants.Tier{Name: "t", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"m1"}}
	g := startTierGateway(t, []routing.WorkerSpec{{ID: "w", URL: e.srv.URL, Models: []string{"m1", "hidden"}}}, tier)

	answers := func(model string) map[string]any {
		out := map[string]any{}
		for _, call := range []struct{ path, body string }{
			{"/v1/chat/completions", `{"model":"` + model + `","messages":[{"role":"user","content":"x"}]}`},
			{"/v1/completions", `{"model":"` + model + `","prompt":"x"}`},
		} {
			resp := g.post(t, call.path, testKey, call.body, nil)
			out[call.path] = fmt.Sprint(resp.StatusCode, " ", decodeAnswer(t, resp))
		}
		status, got := g.get(t, "/v1/models/"+model)
		out["/v1/models/{id}"] = fmt.Sprint(status, " ", got)
		return out
	}
	hidden, unknown := answers("hidden"), answers("nope")
	if !reflect.DeepEqual(hidden, unknown) {
		t.Fatalf("a hidden model's answers differ from an unknown one's:\nhidden:  %v\nunknown: %v", hidden, unknown)
	}
	want := fmt.Sprint(http.StatusNotFound, " ", map[string]any{"error": map[string]any{
		"message": "model not found: it does not exist or you do not have access to it",
		"type":    "invalid_request_error", "param": "model", "code": "model_not_found"}})
	for path, got := range hidden {
		if path == "/v1/models/{id}" {
			continue // its own shape is checked by TestModelsFollowTheTier
		}
		if got != want {
			t.Errorf("%s: got %s, want %s", path, got, want)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.paths) != 0 {
		t.Errorf("the engine got requests %v, want none", e.paths)
	}
}

// A credential that is refused gets one plain sentence with the reason, never the sentinel's
// "unauthenticated" appended, nor the credential.
func TestRefusedCredentialMessage(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	resp := g.post(t, "/v1/chat/completions", "sk-wrong-key", chatBody, nil)
	got := decodeAnswer(t, resp)
	want := map[string]any{"error": map[string]any{"message": "authentication failed: unknown credential",
		"type": "authentication_error", "param": nil, "code": "invalid_api_key"}}
	if resp.StatusCode != http.StatusUnauthorized || !reflect.DeepEqual(got, want) {
		t.Fatalf("got %d %v, want 401 %v", resp.StatusCode, got, want)
	}
}

// The rule: a row with a message of its own shows the cause without the sentinel's text at its
// end; rows without one show the whole cause.
func TestErrorForCauseText(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("revoked api key: %w", tenants.ErrUnauthenticated), "authentication failed: revoked api key"},
		{fmt.Errorf("token lacks a required claim (exp): %w", tenants.ErrUnauthenticated),
			"authentication failed: token lacks a required claim (exp)"},
		{fmt.Errorf("model %q: %w", "m", tenants.ErrModelNotAllowed), "model not found: it does not exist or you do not have access to it"},
		{fmt.Errorf("model %q: %w", "m", routing.ErrUnknownModel), "model not found: it does not exist or you do not have access to it"},
		{fmt.Errorf("worker %q: %w", "w9", routing.ErrUnknownWorker), `worker "w9": ` + routing.ErrUnknownWorker.Error()},
	} {
		if got := ErrorFor(tc.err).Message; got != tc.want {
			t.Errorf("ErrorFor(%q).Message: got %q, want %q", tc.err, got, tc.want)
		}
	}
}
