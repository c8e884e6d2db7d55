package gateway

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// decodingEngine answers interactive prompts (those that begin with "chat") with a stream whose
// first token comes 10 ms after the request and whose five tokens after it come once the test
// says (finish), 50 ms later on the gateway's clock: an engine step of 10 ms its cost model
// learns. A piece of a batch prompt (max_tokens 1) takes pieceTook on that clock; the batch
// request itself is answered at once. It records what it was sent and when interactive answers
// ended, in order.
type decodingEngine struct {
	srv       *httptest.Server
	clock     *testClock
	pieceTook time.Duration

	finish chan struct{} // ends the interactive answer in progress

	mu     sync.Mutex
	events []string
}

func newDecodingEngine(t *testing.T, clock *testClock, pieceTook time.Duration) *decodingEngine {
	e := &decodingEngine{clock: clock, pieceTook: pieceTook, finish: make(chan struct{})}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *decodingEngine) record(ev string) {
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
}

func (e *decodingEngine) recorded() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.events...)
}

func (e *decodingEngine) count(ev string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, x := range e.events {
		if x == ev {
			n++
		}
	}
	return n
}

func (e *decodingEngine) serve(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return
	}
	var body struct {
		MaxTokens *int `json:"max_tokens"`
		Messages  []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	data, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(data, &body)
	usage := `{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":0}}`
	prompt := 0
	if len(body.Messages) > 0 {
		prompt = len(strings.Fields(body.Messages[0].Content))
	}
	switch {
	case len(body.Messages) > 0 && strings.HasPrefix(body.Messages[0].Content, "chat"):
		e.record("interactive")
		e.clock.advance(10 * time.Millisecond)
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t0 \"}}]}\n\n")
		rw.(http.Flusher).Flush()
		// The test reads the first token through the gateway, moves the clock and says finish:
		// the tokens after it took that long.
		select {
		case <-e.finish:
		case <-r.Context().Done():
			return
		}
		e.record("interactive end")
		for i := 1; i < 6; i++ {
			fmt.Fprintf(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		}
		fmt.Fprintf(rw, "data: {\"choices\":[],\"usage\":"+usage+"}\n\ndata: [DONE]\n\n", prompt, 6, prompt+6)
	case body.MaxTokens != nil && *body.MaxTokens == 1:
		e.record("piece")
		e.clock.advance(e.pieceTook)
		rw.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(rw, `{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"a"}}],"usage":`+usage+`}`, prompt, 1, prompt+1)
	default:
		e.record("batch")
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(rw, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":"+usage+"}\n\ndata: [DONE]\n\n", prompt, 1, prompt+1)
	}
}

// decoding is an interactive answer through the gateway whose first token came back.
type decoding struct {
	resp *http.Response
	r    *bufio.Reader
}

// startInteractive sends an interactive streamed call and reads its first token.
func (e *decodingEngine) startInteractive(t *testing.T, g *testGateway, tpotMs ...string) *decoding {
	t.Helper()
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"max_tokens":6,"messages":[{"role":"user","content":"chat about the weather"}]}`
	hdr := map[string]string{headerPriority: "interactive"}
	if len(tpotMs) > 0 {
		hdr[headerTPOTObjectiveMs] = tpotMs[0]
	}
	resp := g.post(t, "/v1/chat/completions", testKey, body, hdr)
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("interactive call: %d %s", resp.StatusCode, data)
	}
	d := &decoding{resp: resp, r: bufio.NewReader(resp.Body)}
	for {
		line, err := d.r.ReadString('\n')
		if err != nil {
			t.Fatalf("interactive call ended before its first token: %v", err)
		}
		if strings.Contains(line, `"t0 "`) {
			return d
		}
	}
}

// end moves the clock by the five tokens' 50 ms, lets the engine send them, and reads the rest.
func (e *decodingEngine) end(t *testing.T, d *decoding) {
	t.Helper()
	e.clock.advance(50 * time.Millisecond)
	e.finish <- struct{}{}
	_, _ = io.Copy(io.Discard, d.r)
	d.resp.Body.Close()
}

// While an interactive answer decodes on a worker, a batch prompt's next piece waits after a
// piece whose step took far more than the engine's step (500 ms against 10 ms), so that the
// interactive answer's steps keep within its TPOT objective; once the answer ends the pieces go
// on. The pace follows the interactive answers that decoded beside pieces: none at first (the
// pieces go back to back), and it grows as those answers miss their TPOT objective. Before,
// pieces always went back to back, one in nearly every step of the interactive answer (on
// llama-server beside a prefill-heavy flood, 17 of 324 interactive answers met their TPOT
// objective).
func TestPiecesWaitBesideAnInteractiveDecode(t *testing.T) {
	clock := &testClock{now: time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)}
	e := newDecodingEngine(t, clock, 500*time.Millisecond)
	rcfg := routing.Config{Policy: "round_robin",
		Workers: []routing.WorkerSpec{{ID: "w", URL: e.srv.URL, Models: []string{testModel}}}}
	rcfg.Concurrency.PrefillPieceTokens = 100
	g := startGatewayOn(t, rcfg, nil, func(d *Deps) { d.Auth, d.Now = tierAuth{everyClassTier}, clock.Now })
	// Forty interactive answers teach the worker's cost model its step.
	for range 40 {
		e.end(t, e.startInteractive(t, g))
	}
	batch := `{"model":"m1","max_tokens":5,"messages":[{"role":"user","content":` + string(jsonString(words(400))) + `}]}`
	post := func(resp *http.Response) {
		t.Helper()
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("batch answer %d %s", resp.StatusCode, data)
		}
	}
	// Three batch prompts, each beside an interactive answer that ends after it: their pieces
	// put 2 s on the answer's five tokens, which miss their objective, and the pace grows; but
	// not for the first, whose client tightened its own TPOT objective (a tenant asking 1 ms
	// would otherwise slow every tenant's batch).
	for round := range 3 {
		from := len(e.recorded())
		var held *decoding
		if round == 0 {
			held = e.startInteractive(t, g, "1")
		} else {
			held = e.startInteractive(t, g)
		}
		post(g.post(t, "/v1/chat/completions", testKey, batch, map[string]string{headerPriority: "batch"}))
		e.end(t, held)
		got := strings.Join(e.recorded()[from:], ", ")
		if want := "interactive, piece, piece, piece, piece, batch, interactive end"; got != want {
			t.Errorf("round %d: the engine saw %s; want %s", round, got, want)
		}
		if round <= 1 && metricValue(t, g.reg, "usher_routing_decode_paces_total") != 0 {
			t.Errorf("round %d: pieces waited before any interactive answer missed its TPOT objective beside them", round)
		}
		if share := metricValue(t, g.reg, "usher_routing_decode_pace_share"); round == 0 && share != 0 {
			t.Errorf("a client's own 1 ms TPOT objective moved the pace to %v", share)
		}
	}
	if share := metricValue(t, g.reg, "usher_routing_decode_pace_share"); !(share > 0.4) {
		t.Fatalf("usher_routing_decode_pace_share %v after two missed answers counted, want about 0.5", share)
	}

	held := e.startInteractive(t, g)
	from := len(e.recorded())
	done := g.postLater(t, "/v1/chat/completions", testKey, batch, map[string]string{headerPriority: "batch"})
	deadline := time.Now().Add(10 * time.Second)
	for e.count("piece") == 12 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if n := e.count("piece") - 12; n != 1 {
		t.Errorf("%d pieces reached the engine while the interactive answer decoded, want 1", n)
	}
	e.end(t, held)
	post(<-done)
	got := strings.Join(e.recorded()[from:], ", ")
	if want := "piece, interactive end, piece, piece, piece, batch"; got != want {
		t.Errorf("the engine saw %s; want %s", got, want)
	}
	if got := metricValue(t, g.reg, "usher_routing_decode_paces_total"); got < 1 {
		t.Errorf("usher_routing_decode_paces_total %v, want at least 1", got)
	}
}
