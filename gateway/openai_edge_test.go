package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

// namingEngine is an OpenAI-compatible engine over real HTTP that names the model of the
// request in its answers (as vLLM and llama-server do), answers embeddings, and, with a key,
// refuses requests without it (as `--api-key` does).
type namingEngine struct {
	srv *httptest.Server
	key string

	mu    sync.Mutex // guards auth, body and paths
	auth  []string   // the Authorization header of every request, health checks included
	body  map[string]any
	paths []string
}

func newNamingEngine(t *testing.T, key string) *namingEngine {
	t.Helper()
	e := &namingEngine{key: key}
	e.srv = httptest.NewServer(e)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *namingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e.mu.Lock()
	e.auth = append(e.auth, r.Header.Get("Authorization"))
	e.mu.Unlock()
	if e.key != "" && r.Header.Get("Authorization") != "Bearer "+e.key {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"error":{"message":"invalid api key","type":"authentication_error"}}`)
		return
	}
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusOK)
		return
	}
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	e.mu.Lock()
	e.body, e.paths = body, append(e.paths, r.URL.Path)
	e.mu.Unlock()
	model, _ := json.Marshal(body["model"])
	w.Header().Set("Content-Type", "application/json")
	if r.URL.Path == "/v1/embeddings" {
		fmt.Fprintf(w, `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-0.25]}],"model":%s,"usage":{"prompt_tokens":7,"total_tokens":7}}`, model)
		return
	}
	if stream, _ := body["stream"].(bool); !stream {
		fmt.Fprintf(w, `{"id":"x","object":"chat.completion","model":%s,"service_tier":null,"choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7}}`, model)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range 2 {
		// Spaced as Python's json.dumps writes it: the alias must be found either way.
		fmt.Fprintf(w, "data: {\"id\":\"x\",\"model\": %s,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d\"}}]}\n\n", model, i)
	}
	fmt.Fprintf(w, "data: {\"id\":\"x\",\"model\":%s,\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n", model)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (e *namingEngine) lastBody() map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.body
}

func (e *namingEngine) authorizations() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.auth...)
}

func (g *testGateway) get(t *testing.T, path string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

func decodeAnswer(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	var out map[string]any
	data, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("answer %q: %v", data, err)
	}
	return out
}

// The models a caller sees are the models its tier may use: listed, and retrieved by id (slashes
// in the id sent as they are or escaped); any other model is OpenAI's 404 model_not_found.
func TestModelsFollowTheTier(t *testing.T) {
	e := newNamingEngine(t, "")
	tier := &tenants.Tier{Name: "t", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"m1", "org/*"}}
	g := startTierGateway(t, []routing.WorkerSpec{
		{ID: "w", URL: e.srv.URL, Models: []string{"m1", "m2", "org/m3"}},
	}, tier)

	status, list := g.get(t, "/v1/models")
	var ids []string
	for _, m := range list["data"].([]any) {
		ids = append(ids, m.(map[string]any)["id"].(string))
	}
	if status != http.StatusOK || fmt.Sprint(ids) != "[m1 org/m3]" {
		t.Fatalf("GET /v1/models: %d %v, want 200 [m1 org/m3]", status, ids)
	}
	for _, tc := range []struct {
		path, want string
	}{
		{"/v1/models/m1", "m1"},
		{"/v1/models/org/m3", "org/m3"},
		{"/v1/models/org%2Fm3", "org/m3"},
		{"/v1/models/m2", ""}, // served, but not for this tier
		{"/v1/models/nope", ""},
		{"/v1/models/org%2Fnope", ""},
	} {
		t.Run(tc.path, func(t *testing.T) {
			status, got := g.get(t, tc.path)
			if tc.want != "" {
				if status != http.StatusOK || got["id"] != tc.want || got["object"] != "model" {
					t.Fatalf("got %d %v, want 200 and the model %s", status, got, tc.want)
				}
				return
			}
			errObj, _ := got["error"].(map[string]any)
			if status != http.StatusNotFound || errObj["code"] != "model_not_found" || errObj["type"] != "invalid_request_error" {
				t.Fatalf("got %d %v, want 404 model_not_found in OpenAI's shape", status, got)
			}
		})
	}
}

// service_tier asks for a class the tier caps; the class served is echoed as OpenAI's
// service_tier, in the header always and in a whole answer's field.
func TestServiceTierIsMappedAndEchoed(t *testing.T) {
	e := newNamingEngine(t, "")
	standardTop := &tenants.Tier{Name: "std", HighestClass: tenants.ClassStandard, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"*"}}
	specs := []routing.WorkerSpec{{ID: "w", URL: e.srv.URL, Models: []string{testModel}}}
	gateways := map[string]*testGateway{"all": startTierGateway(t, specs, everyClassTier), "std": startTierGateway(t, specs, standardTop)}
	for _, tc := range []struct {
		tier, asked, class, served string
	}{
		{"all", "", "standard", "default"},
		{"all", "auto", "standard", "default"},
		{"all", "default", "standard", "default"},
		{"all", "flex", "batch", "flex"},
		{"all", "priority", "interactive", "priority"},
		{"all", "scale", "interactive", "priority"},
		{"std", "scale", "standard", "default"},
		{"std", "priority", "standard", "default"},
		{"std", "flex", "batch", "flex"},
	} {
		t.Run(tc.tier+"/"+tc.asked, func(t *testing.T) {
			body := `{"model":"m1","messages":[{"role":"user","content":"hi"}]`
			if tc.asked != "" {
				body += `,"service_tier":"` + tc.asked + `"`
			}
			resp := gateways[tc.tier].post(t, "/v1/chat/completions", testKey, body+"}", nil)
			got := decodeAnswer(t, resp)
			if resp.StatusCode != http.StatusOK || resp.Header.Get(headerClass) != tc.class ||
				resp.Header.Get(headerServiceTier) != tc.served || got["service_tier"] != tc.served {
				t.Fatalf("got %d, class %q, header %q, field %v; want 200, %s, %s", resp.StatusCode,
					resp.Header.Get(headerClass), resp.Header.Get(headerServiceTier), got["service_tier"], tc.class, tc.served)
			}
			if _, ok := e.lastBody()["service_tier"]; !ok && tc.asked != "" {
				t.Fatal("the client's service_tier did not reach the engine")
			}
		})
	}
	resp := gateways["all"].post(t, "/v1/chat/completions", testKey,
		`{"model":"m1","service_tier":"platinum","messages":[{"role":"user","content":"hi"}]}`, nil)
	if got := decodeAnswer(t, resp); resp.StatusCode != http.StatusBadRequest || got["error"].(map[string]any)["param"] != "service_tier" {
		t.Fatalf("an unknown service_tier: %d %v, want 400 naming service_tier", resp.StatusCode, got)
	}
	resp = gateways["all"].post(t, "/v1/chat/completions", testKey,
		`{"model":"m1","stream":true,"service_tier":"flex","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(headerServiceTier) != "flex" {
		t.Fatalf("a stream: %d with service tier %q, want 200 flex", resp.StatusCode, resp.Header.Get(headerServiceTier))
	}
}

// /v1/embeddings goes through tenancy, the queue and routing like the other endpoints, to the
// workers that serve the embedding model only, and is charged its input tokens only.
func TestEmbeddingsAreProxied(t *testing.T) {
	chat, embed := newNamingEngine(t, ""), newNamingEngine(t, "")
	tier := &tenants.Tier{Name: "t", HighestClass: tenants.ClassInteractive, DefaultClass: tenants.ClassStandard,
		Weight: 1, Models: []string{"m1", "embed-1"}}
	g := startTierGateway(t, []routing.WorkerSpec{
		{ID: "chat", URL: chat.srv.URL, Models: []string{"m1", "embed-2"}},
		{ID: "embed", URL: embed.srv.URL, Models: []string{"embed-1"}},
	}, tier)
	for _, input := range []string{`"hello world"`, `["a","b"]`, `[1,2,3]`, `[[1,2],[3]]`} {
		resp := g.post(t, "/v1/embeddings", testKey, `{"model":"embed-1","input":`+input+`,"encoding_format":"float"}`, nil)
		got := decodeAnswer(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "embed" || got["model"] != "embed-1" ||
			len(got["data"].([]any)) != 1 || got["service_tier"] != nil {
			t.Fatalf("input %s: %d from %q: %v", input, resp.StatusCode, resp.Header.Get(headerWorker), got)
		}
		if sent, _ := json.Marshal(embed.lastBody()["input"]); string(sent) != input {
			t.Fatalf("the engine got input %s, want %s", sent, input)
		}
	}
	// Each answer's usage is charged: 7 prompt tokens and no output, four times.
	if got := counterValue(t, g, "usher_tokens_total", map[string]string{"model": "embed-1", "kind": "prompt"}); got != 28 {
		t.Fatalf("prompt tokens charged: %v, want 28", got)
	}
	if got := counterValue(t, g, "usher_tokens_total", map[string]string{"model": "embed-1", "kind": "completion"}); got != 0 {
		t.Fatalf("completion tokens charged: %v, want 0", got)
	}
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(headerWorker) != "chat" {
		t.Fatalf("chat: %d from %q, want 200 from the chat worker", resp.StatusCode, resp.Header.Get(headerWorker))
	}
	for _, tc := range []struct {
		body   string
		status int
		param  string
	}{
		{`{"model":"embed-1","input":"x","stream":true}`, 400, "stream"},
		{`{"model":"embed-1"}`, 400, "input"},
		{`{"model":"embed-1","input":[]}`, 400, "input"},
		{`{"model":"embed-1","input":{"text":"x"}}`, 400, "input"},
		{`{"model":"embed-1","input":[1.5]}`, 400, "input"},
		{`{"model":"embed-1","input":[[1],[]]}`, 400, "input"},
		{`{"model":"embed-1","input":["a",1]}`, 400, "input"},
		{`{"model":"embed-2","input":"x"}`, 404, "model"}, // not in the tier: as unknown
		{`{"model":"embed-9","input":"x"}`, 404, "model"},
	} {
		resp := g.post(t, "/v1/embeddings", testKey, tc.body, nil)
		got := decodeAnswer(t, resp)
		errObj, _ := got["error"].(map[string]any)
		if resp.StatusCode != tc.status || errObj["param"] != tc.param {
			t.Errorf("%s: got %d %v, want %d naming %s", tc.body, resp.StatusCode, got, tc.status, tc.param)
		}
	}
}

func TestEstimateInputs(t *testing.T) {
	many := "[" + strings.Repeat(`"a",`, maxInputs) + `"a"]`
	for _, tc := range []struct {
		raw    string
		first  string
		tokens int
		ok     bool
	}{
		{`"abcdefgh"`, "abcdefgh", 3, true},
		{`["abcd","efgh"]`, "abcd", 4, true},
		{`[ 5, 6, 7 ]`, "", 3, true},
		{`[[1,2],[3,4,5]]`, "", 5, true},
		{`[]`, "", 0, false},
		{`[ ]`, "", 0, false},
		{`42`, "", 0, false},
		{`[true]`, "", 0, false},
		{`[[1],"a"]`, "", 0, false},
		{`[99999999999999999999]`, "", 0, false},
		{many, "", 0, false},
	} {
		first, tokens, _, err := estimateInputs([]byte(tc.raw), "input")
		if (err == nil) != tc.ok || tc.ok && (first != tc.first || tokens != tc.tokens) {
			t.Errorf("%.40s: got %q, %d, %v; want %q, %d, ok %v", tc.raw, first, tokens, err, tc.first, tc.tokens, tc.ok)
		}
	}
}

// A worker's key reaches its engine, the client's credential never does; a model alias gives
// the engine its own name and the client the public one, streamed or not.
func TestEngineKeyAndModelAlias(t *testing.T) {
	keyed, open := newNamingEngine(t, "engine-secret"), newNamingEngine(t, "")
	keyedSpec := routing.WorkerSpec{ID: "keyed", URL: keyed.srv.URL, Models: []string{testModel}}
	keyedSpec.APIKey = "engine-secret"
	keyedSpec.ModelAliases = map[string]string{testModel: "org/engine-m1"}
	g := startGateway(t, []routing.WorkerSpec{keyedSpec, {ID: "open", URL: open.srv.URL, Models: []string{testModel}}}, nil)

	for range 2 { // round robin: one request to each worker
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, nil)
		got := decodeAnswer(t, resp)
		if resp.StatusCode != http.StatusOK || got["model"] != testModel {
			t.Fatalf("%s answered %d with model %v, want 200 and %s", resp.Header.Get(headerWorker), resp.StatusCode, got["model"], testModel)
		}
	}
	if got := keyed.lastBody()["model"]; got != "org/engine-m1" {
		t.Fatalf("the keyed engine got model %v, want its own name", got)
	}
	if got := open.lastBody()["model"]; got != testModel {
		t.Fatalf("the other engine got model %v, want %s", got, testModel)
	}
	for _, a := range keyed.authorizations() {
		if a != "Bearer engine-secret" {
			t.Fatalf("the keyed engine saw Authorization %q (health checks included), want its key", a)
		}
	}
	for _, a := range open.authorizations() {
		if a != "" {
			t.Fatalf("the engine without a key saw Authorization %q, want none", a)
		}
	}

	for range 2 {
		resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
		events := readEvents(t, resp.Body)
		if resp.StatusCode != http.StatusOK || len(events) != 3 || events[2] != "[DONE]" {
			t.Fatalf("stream from %s: %d %v", resp.Header.Get(headerWorker), resp.StatusCode, events)
		}
		for _, ev := range events[:2] {
			var chunk map[string]any
			if err := json.Unmarshal([]byte(ev), &chunk); err != nil || chunk["model"] != testModel {
				t.Fatalf("chunk %s from %s: want model %s", ev, resp.Header.Get(headerWorker), testModel)
			}
		}
	}
}

func TestPublicEvent(t *testing.T) {
	a := newModelAlias("pub", "eng")
	for _, tc := range []struct{ in, want string }{
		{`data: {"model":"eng","x":1}`, `data: {"model":"pub","x":1}`},
		{`data: {"model" : "eng"}`, `data: {"model" : "pub"}`},
		{`data: {"content":"\"model\":\"eng\"","model":"eng"}`, `data: {"content":"\"model\":\"eng\"","model":"pub"}`},
		{`data: {"model":"engine"}`, `data: {"model":"engine"}`},
		{`data: {"x":"model"}`, `data: {"x":"model"}`},
		{`data: [DONE]`, `data: [DONE]`},
	} {
		if got := string(a.publicEvent([]byte(tc.in))); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
	amp := newModelAlias("pub", "a&b<c>")
	if got := string(amp.publicEvent([]byte(`data: {"model":"a&b<c>"}`))); got != `data: {"model":"pub"}` {
		t.Errorf("a name with &, < and >: got %s", got)
	}
	if newModelAlias("m", "m") != nil || newModelAlias("m", "") != nil {
		t.Fatal("a model named alike needs no alias")
	}
}

func TestRewriteAnswer(t *testing.T) {
	cl := newCall(chatEndpoint, time.Time{})
	cl.model, cl.class, cl.classed = "pub", queue.Batch, true
	cl.alias = newModelAlias("pub", "eng")
	for _, tc := range []struct{ in, want string }{
		{`{"id":"x","model":"eng","usage":{}}`, `{"service_tier":"flex","id":"x","model":"pub","usage":{}}`},
		{` { "model" : "eng" , "service_tier" : null, "choices":[{"model":"eng"}] } `,
			`{"service_tier":"flex","model":"pub","choices":[{"model":"eng"}]}`},
		{`{}`, `{"service_tier":"flex"}`},
		{`["eng"]`, `["eng"]`},
		{`{"model":"eng"`, `{"model":"eng"`},
	} {
		if head, body := cl.rewriteAnswer([]byte(tc.in)); string(head)+string(body) != tc.want {
			got := string(head) + string(body)
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
	}
	// Without an alias, most answers only gain the service_tier: the answer itself follows a
	// shared head, uncopied.
	plain := newCall(chatEndpoint, time.Time{})
	plain.model, plain.class, plain.classed = "pub", queue.Standard, true
	var many strings.Builder
	for i := range 20 {
		fmt.Fprintf(&many, `"k%d":%d,`, i, i)
	}
	for _, tc := range []struct {
		in, want string
		copied   bool
	}{
		{`{"id":"x","choices":[]}`, `{"service_tier":"default","id":"x","choices":[]}`, false},
		{` {"id" : "x"} `, `{"service_tier":"default","id" : "x"} `, false},
		{`{"id":"x",}`, `{"id":"x",}`, true},
		{`{"service_tier":"auto",` + many.String() + `"id":"x"}`, `{"service_tier":"default",` + many.String() + `"id":"x"}`, true},
	} {
		head, body := plain.rewriteAnswer([]byte(tc.in))
		if got := string(head) + string(body); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.in, got, tc.want)
		}
		if copied := head == nil; copied != tc.copied {
			t.Errorf("%s: answer copied or unchanged %v, want %v", tc.in, copied, tc.copied)
		}
	}
	embed := newCall(embeddingsEndpoint, time.Time{})
	embed.classed = true
	if head, got := embed.rewriteAnswer([]byte(`{"model":"e"}`)); head != nil || string(got) != `{"model":"e"}` {
		t.Errorf("an embedding without an alias: got %s, want it unchanged", got)
	}
}
