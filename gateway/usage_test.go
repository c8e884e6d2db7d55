package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
)

func TestCarriesOutput(t *testing.T) {
	tests := []struct {
		payload string
		want    bool
	}{
		{`{"choices":[{"delta":{"role":"assistant","content":""}}]}`, false},
		{`{"choices":[{"delta":{"role":"assistant"}}]}`, false},
		{`{"choices":[{"delta":{},"finish_reason":"stop"}]}`, false},
		{`{"choices":[{"delta":{"content":null},"finish_reason":"length"}]}`, false},
		{`{"choices":[{"delta":{"content":"Hi"}}]}`, true},
		{`{"choices":[{"delta":{"content" : "\n"}}]}`, true},
		{`{"choices":[{"text":" the","index":0}]}`, true},
		{`{"choices":[{"text":"","finish_reason":"stop"}]}`, false},
		{`{"choices":[{"delta":{"reasoning_content":"hm"}}]}`, true},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`, true},
		{`{"choices":[{"delta":{"content":""},"logprobs":{"content":[{"token":"a"}]}}]}`, false},
	}
	for _, tt := range tests {
		if got := carriesOutput([]byte(tt.payload)); got != tt.want {
			t.Errorf("carriesOutput(%s) = %v, want %v", tt.payload, got, tt.want)
		}
	}
}

// memLedger is an in-memory Ledger.
type memLedger struct {
	mu      sync.Mutex
	records []tenants.UsageRecord
}

func (l *memLedger) Record(r tenants.UsageRecord) {
	l.mu.Lock()
	l.records = append(l.records, r)
	l.mu.Unlock()
}

func (l *memLedger) all() []tenants.UsageRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]tenants.UsageRecord(nil), l.records...)
}

// An engine that never sends usage, streaming as vLLM does (a role-only chunk first, the finish
// reason alone last): the call is charged one completion token per chunk with content, and the
// ledger marks it estimated.
func TestStreamWithoutUsageIsCountedFromItsContent(t *testing.T) {
	const contentChunks = 7
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		for i := range contentChunks {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
		}
		fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(engine.Close)
	ledger := &memLedger{}
	g := startGatewayWith(t, []routing.WorkerSpec{{ID: "w", URL: engine.URL, Models: []string{testModel}}}, nil,
		func(d *Deps) { d.Ledger = ledger })
	resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"hello there"}]}`, nil)
	if _, err := io.ReadAll(resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d %v", resp.StatusCode, err)
	}
	resp.Body.Close()
	var got []tenants.UsageRecord
	eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == 1 })
	r := got[0]
	if r.CompletionTokens != contentChunks || !r.Estimated || r.PromptTokens == 0 || r.Outcome != tenants.OutcomeServed ||
		r.Tenant != "t1" || r.Key != "k" || r.Model != testModel || r.Class != "standard" {
		t.Errorf("recorded %+v, want %d estimated completion tokens, the prompt estimate, served, t1/k/m1/standard", r, contentChunks)
	}
}

// eventuallyTrue waits for cond, which settle makes true once the handler ends, after the
// client has read the whole answer.
func eventuallyTrue(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("still not true after 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOutcomeOf(t *testing.T) {
	tests := []struct {
		err  error
		want tenants.Outcome
	}{
		{nil, tenants.OutcomeServed},
		{errClientGone, tenants.OutcomeServed},
		{&tenants.LimitError{Limit: tenants.LimitTokens}, tenants.OutcomeRefusedLimit},
		{&tenants.BudgetError{Cap: "tokens_per_day"}, tenants.OutcomeRefusedBudget},
		{fmt.Errorf("x: %w", errUpstream), tenants.OutcomeWorkerError},
		{routing.ErrNoWorker, tenants.OutcomeWorkerError},
		{BadRequest("", "bad"), tenants.OutcomeOther},
	}
	for _, tt := range tests {
		if got := outcomeOf(tt.err); got != tt.want {
			t.Errorf("outcomeOf(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// BenchmarkCarriesOutput is the cost of counting one relayed stream event.
func BenchmarkCarriesOutput(b *testing.B) {
	chunk := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{"content":" word"},"logprobs":null,"finish_reason":null}]}`)
	for b.Loop() {
		if !carriesOutput(chunk) {
			b.Fatal("no output found")
		}
	}
}

// A client that leaves before anything was served is recorded, but not as served.
func TestClientGoneBeforeAnswerIsNotServed(t *testing.T) {
	w := newFakeWorker(t, func(w *fakeWorker) { w.hold = make(chan struct{}) })
	ledger := &memLedger{}
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w")}, nil, func(d *Deps) { d.Ledger = ledger })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+testKey)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventuallyTrue(t, func() bool { return w.started.Load() == 1 })
	cancel()
	<-done
	var got []tenants.UsageRecord
	eventuallyTrue(t, func() bool { got = ledger.all(); return len(got) == 1 })
	if got[0].Outcome != tenants.OutcomeOther || got[0].CompletionTokens != 0 {
		t.Errorf("recorded %+v, want OutcomeOther with no tokens", got[0])
	}
}

// Whatever a valid usage object holds, parseUsage's own pass reads it as encoding/json does, or
// leaves it to encoding/json. (It does not check the members it skips: the object comes from an
// engine, and only the counts it reads are taken.)
func FuzzScanUsageReadsAsEncodingJSON(f *testing.F) {
	for _, seed := range []string{
		`{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11,"prompt_tokens_details":{"cached_tokens":4}}`,
		`{"prompt_tokens":9,"prompt_tokens_details":null,"completion_tokens":null}`,
		`{"PROMPT_TOKENS":9,"prompt_tokens":3}`,
		`{"prompt_tokens_details":{"cached_tokens":5},"prompt_tokens_details":{}}`,
		`{"prompt_tokens":1.5}`, `{"prompt_tokens":-1}`, `{"prompt_\u0074okens":7}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, obj string) {
		fast, ok := scanUsage([]byte(obj))
		var want usage
		if !ok || json.Unmarshal([]byte(obj), &want) != nil {
			return
		}
		if !reflect.DeepEqual(fast, want) {
			t.Fatalf("%s: scanUsage read %+v %v, encoding/json %+v %v", obj, fast, fast.PromptTokensDetails, want, want.PromptTokensDetails)
		}
	})
}

// indexKey finds what bytes.Index finds, on chunks built to hold near misses: the key without
// its quote, quotes doubled, the key at either end, cut off.
func TestIndexKeyIsBytesIndex(t *testing.T) {
	keys := [][]byte{usageKey, toolCallsKey, []byte(`"text"`), []byte(`"content"`)}
	for _, tc := range []string{"", `"`, `usage"`, `"usage"`, `x"usage"`, `""usage"`, `usage""usage"`, `"usag"`,
		`{"a":"usage"}`, `{"usage"`, `"usage`, `{"tool_calls":[]}`, `"text""text"`, `reasoning_content":"x"`} {
		for _, key := range keys {
			if got, want := indexKey([]byte(tc), key), bytes.Index([]byte(tc), key); got != want {
				t.Errorf("indexKey(%q, %q) = %d, want %d", tc, key, got, want)
			}
		}
	}
	// Random strings of up to 9 bytes over the letters of the keys, a quote and a stranger.
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte(`"usagetx`)
	for range 200000 {
		b := make([]byte, r.IntN(10))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		for _, key := range keys[:3] {
			if got, want := indexKey(b, key), bytes.Index(b, key); got != want {
				t.Fatalf("indexKey(%q, %q) = %d, want %d", b, key, got, want)
			}
		}
	}
}

// A client that names a new model in every request creates no series: the request metrics label
// a model no worker serves as "unserved" (a hostile client otherwise grows /metrics, and the
// gateway's memory, without bound).
func TestUnservedModelsShareOneSeries(t *testing.T) {
	w := newFakeWorker(t, nil)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, nil)
	for i := range 20 {
		resp := g.post(t, "/v1/chat/completions", testKey, fmt.Sprintf(`{"model":"nope-%d","messages":[{"role":"user","content":"x"}]}`, i), nil)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("unknown model: got %d, want 404", resp.StatusCode)
		}
	}
	m := g.srv.metrics
	if got := testutil.ToFloat64(m.requests.WithLabelValues(unservedModel, "404")); got != 20 {
		t.Errorf("requests{model=%q,status=404}: got %v, want 20", unservedModel, got)
	}
	if n := testutil.CollectAndCount(m.requests); n != 1 {
		t.Errorf("request series after 20 unknown models: got %d, want 1", n)
	}
	if n := testutil.CollectAndCount(m.duration); n > 1 {
		t.Errorf("duration series after 20 unknown models: got %d, want at most 1", n)
	}
}

// A stream's usage is in the ledger before the client holds its [DONE], with the engine's usage
// or without it (then estimated): a replica killed between the two would otherwise have served
// an answer it never counted. The engine here keeps its connection open after [DONE], so the
// handler cannot have ended when the client reads it.
func TestStreamIsCountedBeforeItsDone(t *testing.T) {
	for _, tt := range []struct {
		name  string
		usage string // the engine's usage chunk, if any
	}{
		{"engine usage", "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n"},
		{"no usage", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hold := make(chan struct{})
			engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					return
				}
				w.Header().Set("Content-Type", "text/event-stream")
				for i := range 3 {
					fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w%d \"}}]}\n\n", i)
				}
				fmt.Fprint(w, tt.usage+"data: [DONE]\n\n")
				w.(http.Flusher).Flush()
				select {
				case <-hold:
				case <-r.Context().Done():
				}
			}))
			t.Cleanup(engine.Close)
			t.Cleanup(func() { close(hold) })
			ledger := &memLedger{}
			g := startGatewayWith(t, []routing.WorkerSpec{{ID: "w", URL: engine.URL, Models: []string{testModel}}}, nil,
				func(d *Deps) { d.Ledger = ledger })
			resp := g.post(t, "/v1/chat/completions", testKey, `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello there"}]}`, nil)
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			lines := bufio.NewScanner(resp.Body)
			for lines.Scan() && lines.Text() != "data: [DONE]" {
			}
			if lines.Err() != nil {
				t.Fatalf("reading the stream: %v", lines.Err())
			}
			if got := ledger.all(); len(got) != 1 || got[0].CompletionTokens != 3 {
				t.Fatalf("the client holds [DONE] and the ledger has %+v, want one record of 3 completion tokens", got)
			}
		})
	}
}
