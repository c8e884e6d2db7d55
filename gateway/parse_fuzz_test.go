package gateway

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// FuzzUpstreamBodyIsWhatUsherRead holds the parse stage to its promise for any body it accepts
// (issue 10, item 1): an engine that reads JSON case-sensitively and keeps the last duplicate
// (Python's json.loads, like vLLM and SGLang), or one that folds case, reads from the body usher
// sends exactly what usher enforced (model, stream, output limits, choices, priority, no engine
// controls), and the
// body usher sends parses back to the same call. A body without an output limit reaches the
// engine with the one usher reserved (issue 26, item 8).
func FuzzUpstreamBodyIsWhatUsherRead(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false,"x":1},"priority":-5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","max_tokens":10,"max_completion_tokens":3,"n_predict":7,"n":2,"messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"premium-13b","Model":"demo-7b","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","\u006dax_tokens":1,"max_tokens":100000,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m","prompt":["a","b"],"stream":true}`,
		`{"model":"m","prompt":[[1,2,3],[4]],"max_tokens":null}`,
		`{"model":"m","kv_transfer_params":{"remote_host":"h"},"bootstrap_room":1,"rid":"r","messages":[{"role":"user","content":"x"}]}`,
	} {
		f.Add([]byte(seed), true, false)
		f.Add([]byte(seed), false, true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat, handoff bool) {
		ep := completionEndpoint
		if chat {
			ep = chatEndpoint
		}
		cl := newCall(ep, time.Time{})
		if parseBody(body, cl, defaultMaxJSONDepth) != nil {
			return // refusals are FuzzParseInferenceRequest's
		}
		cl.class = queue.Batch
		cl.boundOutput(77)
		out := cl.upstreamBody(handoff, "")

		var engine map[string]json.RawMessage // exact keys, the last duplicate wins
		if err := json.Unmarshal(out, &engine); err != nil {
			t.Fatalf("upstream body is not a JSON object: %v\n%s", err, out)
		}
		for key := range engine {
			for _, read := range readKeys {
				if key != read && strings.EqualFold(key, read) {
					t.Fatalf("upstream key %q folds to %q, which usher reads: a case-folding engine reads another value\n%s", key, read, out)
				}
			}
		}
		var model string
		if err := json.Unmarshal(engine["model"], &model); err != nil || model != cl.model {
			t.Fatalf("engine reads model %q, usher enforced %q\n%s", model, cl.model, out)
		}
		bounded := false
		for _, key := range outputLimitKeys {
			if v, ok := engine[key]; ok && !isNull(v) {
				n, err := strconv.ParseInt(string(v), 10, 64)
				if err != nil || n < 0 || int(n) > cl.maxOutput {
					t.Fatalf("engine reads %s = %s, usher reserved %d output tokens\n%s", key, v, cl.maxOutput, out)
				}
				bounded = true
			}
		}
		if !bounded && !cl.ep.embed {
			t.Fatalf("the engine reads no output limit and takes its own default; usher reserved %d\n%s", cl.maxOutput, out)
		}
		for _, key := range []string{"n", "best_of"} {
			if v, ok := engine[key]; ok && !isNull(v) {
				if n, err := strconv.ParseInt(string(v), 10, 64); err != nil || int(n) > cl.choices {
					t.Fatalf("engine reads %s = %s, usher counted %d choices\n%s", key, v, cl.choices, out)
				}
			}
		}
		stream := false
		if v, ok := engine["stream"]; ok && !isNull(v) {
			_ = json.Unmarshal(v, &stream)
		}
		if stream != cl.stream {
			t.Fatalf("engine reads stream %v, usher %v\n%s", stream, cl.stream, out)
		}
		priority, hasPriority := engine["priority"]
		switch {
		case handoff && (!hasPriority || string(priority) != strconv.Itoa(int(queue.Batch))):
			t.Fatalf("a hand-down worker reads priority %s, want the class usher assigned (%d)\n%s", priority, queue.Batch, out)
		case !handoff && hasPriority:
			t.Fatalf("the client's priority reaches a worker not flagged for hand-down\n%s", out)
		}
		for _, key := range engineControlKeys {
			if _, ok := engine[key]; ok {
				t.Fatalf("the client's %s reaches a worker\n%s", key, out)
			}
		}

		again := newCall(ep, time.Time{})
		if err := parseBody(cl.upstream, again, defaultMaxJSONDepth); err != nil {
			t.Fatalf("the upstream body does not parse again: %v\n%s", err, cl.upstream)
		}
		if again.model != cl.model || again.stream != cl.stream || again.maxOutput != cl.maxOutput ||
			again.choices != cl.choices || again.promptTokens != cl.promptTokens || again.prompt != cl.prompt {
			t.Fatalf("the upstream body reads as another call: model %q/%q stream %v/%v output %d/%d choices %d/%d prompt tokens %d/%d\n%s",
				again.model, cl.model, again.stream, cl.stream, again.maxOutput, cl.maxOutput,
				again.choices, cl.choices, again.promptTokens, cl.promptTokens, cl.upstream)
		}
	})
}

// The attacks of issue 10's item 1 through the whole gateway, with a stand-in worker that reads
// JSON as vLLM does (exact keys, the last duplicate wins): each is refused before any byte
// reaches the worker, and a body usher accepts reaches it reading as usher read it.
func TestParserDifferentialNeverReachesACaseSensitiveWorker(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	for _, attack := range []string{
		`{"model":"m1","Model":"premium-13b","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"premium-13b","model":"m1","messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m1","max_tokens":100000,"MAX_TOKENS":1,"messages":[{"role":"user","content":"x"}]}`,
		`{"model":"m1","messages":[{"role":"user","content":"` + strings.Repeat("long ", 1000) + `"}],"Messages":[{"role":"user","content":"x"}]}`,
	} {
		resp := g.post(t, "/v1/chat/completions", testKey, attack, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("attack %.60s...: got %d, want 400", attack, resp.StatusCode)
		}
	}
	if n := w.requests.Load(); n != 0 {
		t.Fatalf("the worker got %d of the attacks", n)
	}
	resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","max_tokens":5,"Modelx":"premium-13b","messages":[{"role":"user","content":"x"}]}`, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("a body with an unrelated key: got %d, want 200", resp.StatusCode)
	}
	if got := w.body(); got["model"] != "m1" || got["max_tokens"] != float64(5) {
		t.Fatalf("the worker read model %v, max_tokens %v; usher read m1 and 5", got["model"], got["max_tokens"])
	}
}

// Through the whole gateway, input an engine must reject never reaches the worker (issue 26,
// item 1), so no engine's failure on it counts against the worker's breaker.
func TestInputAnEngineMustRejectNeverReachesTheWorker(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	for _, body := range []string{
		`{"model":"m1","messages":[{"role":"user","content":"caf` + "\xe9" + `"}]}`,
		`{"model":"m1","messages":[{"role":"user","content":"\ud800"}]}`,
		`{"model":"m1","messages":[{"role":"user","content":"x"}],"tools":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`,
	} {
		resp := g.post(t, "/v1/chat/completions", testKey, body, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("body %.50q...: got %d, want 400", body, resp.StatusCode)
		}
	}
	if n := w.requests.Load(); n != 0 {
		t.Fatalf("the worker got %d of the bodies", n)
	}
}
