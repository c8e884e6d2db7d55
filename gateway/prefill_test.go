package gateway

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// pieceBody is the piece of body's prompt that ends near tokens (see pieceCutter.body).
func pieceBody(body []byte, chat bool, tokens int) ([]byte, bool) {
	pc, ok := newPieceCutter(body, chat)
	if !ok {
		return nil, false
	}
	return pc.body(tokens)
}

// words is n words of text, "w0 w1 ...".
func words(n int) string {
	ws := make([]string, n)
	for i := range ws {
		ws[i] = fmt.Sprintf("w%d", i)
	}
	return strings.Join(ws, " ")
}

// The pieces of a prompt: every one is a prefix of the prompt cut at a word boundary, in a body
// that keeps what shapes the prompt (tools, the template's options) and asks for one token, not
// streamed; a prompt that cannot be cut so gives none.
func TestPieceBody(t *testing.T) {
	long := words(400) // 1,889 bytes
	chat := func(msgs ...string) string {
		return fmt.Sprintf(`{"model":"m1","messages":[%s],"stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"tools":[{"type":"function"}],"chat_template_kwargs":{"x":1},"temperature":0.5}`, strings.Join(msgs, ","))
	}
	user := func(s string) string { return `{"role":"user","content":` + string(jsonString(s)) + `}` }
	tests := []struct {
		name   string
		chat   bool
		body   string
		tokens int
		want   string // the rendered prompt of the piece (parseMessages, or the prompt string); "" for none
	}{
		{"chat cut inside its only message", true, chat(user(long)), 100, "user " + long[:strings.LastIndexByte(long[:396], ' ')] + "\n"},
		{"chat keeps whole messages before the cut", true, chat(`{"role":"system","content":"be brief"}`, user(long)), 100,
			"system be brief\nuser " + long[:strings.LastIndexByte(long[:380], ' ')] + "\n"},
		{"chat cut between messages", true, chat(user(long[:1000]), user(long)), 252, "user " + long[:1000] + "\n"},
		{"completion string prompt", false, `{"model":"m1","prompt":` + string(jsonString(long)) + `,"max_tokens":9,"n":2,"echo":true}`, 50,
			long[:strings.LastIndexByte(long[:201], ' ')]},
		{"completion token ids", false, `{"model":"m1","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16],"max_tokens":9}`, 2, ""},
		{"content parts at the cut", true, chat(`{"role":"user","content":[{"type":"text","text":` + string(jsonString(long)) + `}]}`), 100, ""},
		{"one word longer than the piece", true, chat(user(strings.Repeat("x", 2000))), 100, ""},
		{"piece as long as the prompt", false, `{"model":"m1","prompt":"a b c"}`, 10, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, ok := pieceBody([]byte(tt.body), tt.chat, tt.tokens)
			if tt.want == "" {
				if ok {
					t.Fatalf("got a piece %s, want none", b)
				}
				return
			}
			if !ok {
				t.Fatal("got no piece")
			}
			cl := newCall(endpoint{chat: tt.chat}, time.Now())
			if err := parseBody(b, cl, defaultMaxJSONDepth); err != nil {
				t.Fatalf("the piece %s does not parse: %v", b, err)
			}
			if cl.prompt != tt.want {
				t.Errorf("piece prompt %q\nwant %q", cl.prompt, tt.want)
			}
			if cl.stream || cl.maxOutput != 1 || cl.choices != 1 {
				t.Errorf("piece stream %v, max output %d, n %d; want false, 1, 1", cl.stream, cl.maxOutput, cl.choices)
			}
			var m map[string]json.RawMessage
			_ = json.Unmarshal(b, &m)
			for _, k := range []string{"stream_options", "echo"} {
				if _, ok := m[k]; ok {
					t.Errorf("the piece carries %q", k)
				}
			}
			if tt.chat {
				for _, k := range []string{"tools", "chat_template_kwargs", "temperature"} {
					if _, ok := m[k]; !ok {
						t.Errorf("the piece lost %q", k)
					}
				}
			}
		})
	}
}

// recordingWorker answers every inference request with a short stream or answer, and records
// the bodies it was sent, in order. Its n-th answer (from 0) reports 10 n cached prompt tokens,
// as an engine whose prefix cache fills.
type recordingWorker struct {
	srv    *httptest.Server
	mu     sync.Mutex // guards bodies
	bodies []map[string]any
	// refuse, when set, is asked of every body: true answers it 400, as an engine refuses a
	// request it cannot serve.
	refuse func(body map[string]any) bool
	// uncounted: its usage reports no cached tokens (no prompt_tokens_details), as an engine
	// that does not count them.
	uncounted bool
	// clock, when set, is the gateway's, moved by each answer's time before it is sent: 5 ms
	// and 20 µs a prompt token not cached, a law a cost model learns exactly.
	clock *testClock
}

func newRecordingWorker(t *testing.T) *recordingWorker {
	w := &recordingWorker{}
	w.srv = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		var body map[string]any
		data, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(data, &body)
		w.mu.Lock()
		w.bodies = append(w.bodies, body)
		cached := 10 * (len(w.bodies) - 1)
		refuse := w.refuse != nil && w.refuse(body)
		w.mu.Unlock()
		if w.clock != nil {
			w.clock.advance(5*time.Millisecond + time.Duration(max(500-cached, 0))*20*time.Microsecond)
		}
		if refuse {
			http.Error(rw, `{"error":{"message":"refused","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		usage := fmt.Sprintf(`{"prompt_tokens":500,"completion_tokens":1,"total_tokens":501,"prompt_tokens_details":{"cached_tokens":%d}}`, cached)
		if w.uncounted {
			usage = `{"prompt_tokens":500,"completion_tokens":1,"total_tokens":501}`
		}
		if stream, _ := body["stream"].(bool); stream {
			rw.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":%s}\n\ndata: [DONE]\n\n", usage)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}],"usage":%s}`, usage)
	}))
	t.Cleanup(w.srv.Close)
	return w
}

func (w *recordingWorker) sent() []map[string]any {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]map[string]any(nil), w.bodies...)
}

// While interactive requests are present, a batch prompt longer than a piece reaches the worker
// as its leading pieces, each a request for one token, and then whole; its client sees one
// answer. Without interactive requests, or with pieces off, it goes whole at once.
func TestBatchPromptGoesInPiecesWhileInteractiveIsPresent(t *testing.T) {
	prompt := words(400) // about 473 estimated tokens
	for _, tt := range []struct {
		name        string
		piece       int
		interactive bool
		stream      bool
		wantPieces  int
	}{
		{"pieces while interactive is present", 100, true, false, 4},
		{"pieces of a streamed answer", 100, true, true, 4},
		{"learnt pieces: the interactive prompts are short, so 64 tokens", 0, true, false, 6},
		{"whole without interactive traffic", 100, false, false, 0},
		{"whole with pieces off", -1, true, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			w := newRecordingWorker(t)
			rcfg := routing.Config{Policy: "round_robin",
				Workers: []routing.WorkerSpec{{ID: "w", URL: w.srv.URL, Models: []string{testModel}}}}
			rcfg.Concurrency.PrefillPieceTokens = tt.piece
			g := startGatewayOn(t, rcfg, nil, func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
			if tt.interactive {
				resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
				resp.Body.Close()
			}
			body := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":` + string(jsonString(prompt)) + `}]}`
			if tt.stream {
				body = `{"stream":true,"stream_options":{"include_usage":true},` + body[1:]
			}
			resp := g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: "batch"})
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(data), `"hi"`) {
				t.Fatalf("batch answer %d %s", resp.StatusCode, data)
			}
			sent := w.sent()
			if tt.interactive {
				sent = sent[1:]
			}
			if got := len(sent) - 1; got != tt.wantPieces {
				t.Fatalf("the worker got %d pieces before the request, want %d", got, tt.wantPieces)
			}
			last := 0
			for i, b := range sent[:len(sent)-1] {
				content := b["messages"].([]any)[0].(map[string]any)["content"].(string)
				if !strings.HasPrefix(prompt, content+" ") || len(content) <= last {
					t.Errorf("piece %d is not a longer prefix of the prompt: %.40q... (%d bytes)", i, content, len(content))
				}
				last = len(content)
				if b["max_tokens"] != 1.0 || b["stream"] != false {
					t.Errorf("piece %d asks for max_tokens %v, stream %v; want 1, false", i, b["max_tokens"], b["stream"])
				}
			}
			full := sent[len(sent)-1]
			if got := full["messages"].([]any)[0].(map[string]any)["content"]; got != prompt {
				t.Errorf("the request itself lost its prompt")
			}
			if got := metricValue(t, g.reg, "usher_prefill_pieces_total"); int(got) != tt.wantPieces {
				t.Errorf("usher_prefill_pieces_total %v, want %d", got, tt.wantPieces)
			}
			// The request's cache hit is what the engine held before its first piece, not what
			// the pieces put there.
			first := len(w.sent()) - 1 - tt.wantPieces
			if got, want := tokensServed(t, g, "cached"), 10*first; int(got) != want {
				t.Errorf("cached tokens counted %v, want %d", got, want)
			}
			// And the client is told the same.
			u, ok := parseUsage(data)
			if !ok || u.cachedTokens() != 10*first {
				t.Errorf("the client's usage: %+v (found %v), want %d cached tokens", u.PromptTokensDetails, ok, 10*first)
			}
		})
	}
}

// The prompt tokens an engine computed for a request's pieces are charged to its tenant even when
// the engine then refuses the request itself (before: pieces were never charged, so a tenant
// could have an engine prefill, and warm its cache with, prompts it never paid for).
func TestPiecesAreChargedWhenTheRequestIsRefused(t *testing.T) {
	w := newRecordingWorker(t)
	w.refuse = func(b map[string]any) bool { return b["max_tokens"] == 5.0 } // the request itself, not its pieces
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{{ID: "w", URL: w.srv.URL, Models: []string{testModel}}}}
	rcfg.Concurrency.PrefillPieceTokens = 100
	g := startGatewayOn(t, rcfg, nil, func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
	resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
	resp.Body.Close()
	before := tokensServed(t, g, "prompt")
	body := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":` + string(jsonString(words(400))) + `}]}`
	resp = g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: "batch"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("the refused request: %d, want the engine's 400", resp.StatusCode)
	}
	sent := w.sent()[1:]
	pieces := len(sent) - 1
	if pieces < 2 {
		t.Fatalf("%d pieces went before the request; the test proves nothing", pieces)
	}
	// The recording engine reports 500 prompt tokens for each piece, of which 10 a request
	// before were cached.
	want := 0
	for i := range pieces {
		want += 500 - 10*(i+1)
	}
	if got := tokensServed(t, g, "prompt") - before; int(got) != want {
		t.Errorf("prompt tokens charged for the refused request: %v, want the %d its %d pieces cost the engine", got, want, pieces)
	}
}

// Whatever body usher accepts, a piece of its prompt is a body usher accepts too, for one token
// and no stream, with the model of the request, and whose prompt (as usher renders it) is a
// prefix of the request's: the engine is never sent by a piece what the request did not carry.
func FuzzPieceBodyIsAPrefix(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"a b c d e f g h i j k l m n o p q r s t u v w x y z"}]}`,
		`{"model":"m","stream":true,"max_tokens":9,"tools":[{"type":"function"}],"messages":[{"role":"user","content":"one two three four five six seven eight nine ten eleven twelve"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a b c d e f g"}]},{"role":"user","content":"h i j k l m n o p"}]}`,
		`{"model":"m","prompt":"alpha beta gamma delta epsilon zeta eta theta iota kappa","echo":true,"n":3}`,
		`{"model":"m","prompt":"a\u00e9 b\u4e16 c\ud83d\ude00 d\n e\t f g h i j k l m n"}`,
		`{"model":"m","prompt":[1,2,3,4,5,6,7,8]}`,
	} {
		for _, tokens := range []int{1, 3, 8} {
			f.Add([]byte(seed), true, tokens)
			f.Add([]byte(seed), false, tokens)
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool, tokens int) {
		ep := completionEndpoint
		if chat {
			ep = chatEndpoint
		}
		cl := newCall(ep, time.Time{})
		if parseBody(body, cl, defaultMaxJSONDepth) != nil || tokens < 1 || tokens > 1<<20 {
			return
		}
		b, ok := pieceBody(cl.upstream, chat, tokens)
		if !ok {
			return
		}
		piece := newCall(ep, time.Time{})
		if err := parseBody(b, piece, defaultMaxJSONDepth); err != nil {
			t.Fatalf("the piece is refused: %v\n%s", err, b)
		}
		if piece.stream || piece.maxOutput != 1 || piece.choices != 1 || piece.model != cl.model {
			t.Fatalf("piece: stream %v, max output %d, n %d, model %q; want false, 1, 1, %q", piece.stream, piece.maxOutput, piece.choices, piece.model, cl.model)
		}
		prompt := piece.prompt
		if chat {
			prompt = strings.TrimSuffix(prompt, "\n")
		}
		if !strings.HasPrefix(cl.prompt, prompt) || len(prompt) >= len(cl.prompt) {
			t.Fatalf("the piece's prompt %q is not a shorter prefix of %q", prompt, cl.prompt)
		}
	})
}

// A batch request placed while an interactive prompt is in prefill on its worker is not sent
// until that prompt's first token is back, also when its own prompt goes whole: an engine would
// otherwise prefill both in one step, and the interactive prompt would wait for the batch one.
func TestBatchRequestYieldsToAnInteractivePrefill(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var arrived []string // the class of each request, in the order the worker got them
	worker := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return // health checks and scrapes
		}
		data, _ := io.ReadAll(r.Body)
		class := "batch"
		if strings.Contains(string(data), "interactive question") {
			class = "interactive"
		}
		mu.Lock()
		arrived = append(arrived, class)
		mu.Unlock()
		if class == "interactive" {
			<-release // its prefill goes on until the test says
		}
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(worker.Close)
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(arrived)
	}
	rcfg := routing.Config{Policy: "round_robin", Workers: []routing.WorkerSpec{{ID: "w", URL: worker.URL, Models: []string{testModel}}}}
	rcfg.Concurrency.PrefillPieceTokens = -1 // the batch prompt goes whole
	g := startGatewayOn(t, rcfg, nil, func(d *Deps) { d.Auth = tierAuth{everyClassTier} })
	t.Cleanup(func() { // before the gateway's shutdown, which waits for the held request
		select {
		case <-release:
		default:
			close(release)
		}
	})

	answered := make(chan int, 2)
	ask := func(content, class string) {
		body := `{"model":"m1","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"` + content + `"}]}`
		resp := g.post(t, "/v1/chat/completions", testKey, body, map[string]string{headerPriority: class})
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		answered <- resp.StatusCode
	}
	go ask("an interactive question", "interactive")
	waitFor(t, "the interactive request at the worker", func() bool { return len(got()) == 1 })
	go ask("a batch job", "batch")
	// The batch request is admitted and placed on w at once (nothing holds it in the queue);
	// it must not reach the worker while the interactive prompt is in prefill there.
	time.Sleep(300 * time.Millisecond)
	if a := got(); len(a) != 1 {
		t.Fatalf("the worker got %v while the interactive prompt was in prefill; want only it", a)
	}
	close(release)
	for range 2 {
		if code := <-answered; code != http.StatusOK {
			t.Errorf("answer %d, want 200", code)
		}
	}
	if a := got(); !slices.Equal(a, []string{"interactive", "batch"}) {
		t.Errorf("the worker got %v, want the interactive request, then the batch one", a)
	}
}

// The pieces of lower-class prompts teach their worker's cost model, each a request of its own
// to the engine: beside a flood sent in pieces, the model learns to predict, and so to state
// and judge interactive objectives, from the pieces' answers too, not from the few interactive
// answers alone (before, the first interactive calls after a gateway started went unjudged for
// as long as it took 32 of them to be answered).
func TestPiecesTeachTheCostModel(t *testing.T) {
	t.Run("cached tokens reported", func(t *testing.T) { piecesTeach(t, false) })
	// A piece's prompt is mostly the pieces before it: without the engine's count of what it had
	// cached, its time would teach a prompt's worth of prefill at a piece's cost.
	t.Run("cached tokens not reported", func(t *testing.T) { piecesTeach(t, true) })
}

// piecesTeach sends three batch calls in pieces beside interactive traffic and checks whether
// the next interactive call is judged: it is when the pieces taught the worker's model, which
// they do only when the engine reports its cached tokens (uncounted: it does not).
func piecesTeach(t *testing.T, uncounted bool) {
	w := newRecordingWorker(t)
	// The answers' times on the gateway's clock, so that what the model learns does not hang on
	// the machine's load.
	w.uncounted, w.clock = uncounted, &testClock{now: time.Date(2026, 12, 6, 3, 0, 0, 0, time.UTC)}
	rcfg := routing.Config{Policy: "round_robin",
		Workers: []routing.WorkerSpec{{ID: "w", URL: w.srv.URL, Models: []string{testModel}}}}
	rcfg.Concurrency.PrefillPieceTokens = 64
	g := startGatewayOn(t, rcfg, nil, func(d *Deps) { d.Auth, d.Now = tierAuth{everyClassTier}, w.clock.Now })
	interactive := func() {
		resp := g.post(t, "/v1/chat/completions", testKey, chatBody, map[string]string{headerPriority: "interactive"})
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	judged := func() float64 {
		return metricValue(t, g.reg, "usher_objective_ttft_total") - metricLabelValue(t, g.reg, "usher_objective_ttft_total", "verdict", "unjudged")
	}
	interactive()
	batch := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":` + string(jsonString(words(1000))) + `}]}`
	for range 3 {
		resp := g.post(t, "/v1/chat/completions", testKey, batch, map[string]string{headerPriority: "batch"})
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("batch answer %d", resp.StatusCode)
		}
	}
	if pieces := metricValue(t, g.reg, "usher_prefill_pieces_total"); pieces < 32 {
		t.Fatalf("%v pieces sent; the test wants the 32 answers a cost model needs", pieces)
	}
	if got := judged(); got != 0 {
		t.Fatalf("%v calls judged before the model had learnt", got)
	}
	interactive()
	want := 1.0
	if uncounted {
		want = 0
	}
	if got := judged(); got != want {
		t.Fatalf("the interactive call after the pieces: %v judged, want %v", got, want)
	}
}
