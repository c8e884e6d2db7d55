package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// lockedBuffer is a bytes.Buffer written by the gateway's handlers and read by the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// requestLines are the access log's lines so far, decoded.
func (b *lockedBuffer) requestLines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var lines []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for sc.Scan() {
		var line map[string]any
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if line["msg"] == "request" {
			lines = append(lines, line)
		}
	}
	return lines
}

// TestAccessLogSetsPredictionBesideEngineTimes: every streamed call's access line carries the
// engine's own TTFT and TPOT; the worker's cost model's predictions for them are null until it
// has learnt from enough answers (32 of each), then set.
func TestAccessLogSetsPredictionBesideEngineTimes(t *testing.T) {
	// Its tokens come a millisecond apart, so every answer has a decode time to learn TPOT from
	// (chunks read in one go would teach it nothing).
	w := newFakeWorker(t, func(w *fakeWorker) { w.chunks, w.tokenGap = 4, time.Millisecond })
	logs := &lockedBuffer{}
	g := startGatewayWith(t, []routing.WorkerSpec{w.spec("w1")}, nil, func(d *Deps) {
		d.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	})
	// A sleep of a millisecond on a busy machine may take ten: a fit whose error grows past its
	// values starts over (routing's costLost), so the calls go on until both are predicted, up to
	// a bound far above the 32 answers it needs.
	const most = 200
	body := `{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hello"}]}`
	predicted := func(line map[string]any) bool {
		_, ttft := line["ttft_pred_ms"].(float64)
		_, tpot := line["tpot_pred_ms"].(float64)
		return ttft && tpot
	}
	var lines []map[string]any
	for calls := 1; calls <= most; calls++ {
		resp := g.post(t, "/v1/chat/completions", testKey, body, nil)
		readEvents(t, resp.Body)
		eventuallyTrue(t, func() bool { lines = logs.requestLines(t); return len(lines) == calls })
		if predicted(lines[calls-1]) {
			break
		}
	}
	for i, line := range lines {
		for _, field := range []string{"engine_ttft_ms", "engine_tpot_ms"} {
			if v, ok := line[field].(float64); !ok || v <= 0 {
				t.Errorf("call %d: %s: got %v, want a time", i+1, field, line[field])
			}
		}
	}
	if first := lines[0]; first["ttft_pred_ms"] != nil || first["tpot_pred_ms"] != nil {
		t.Errorf("first call: got predictions %v and %v, want null before the model has learnt", first["ttft_pred_ms"], first["tpot_pred_ms"])
	}
	if n := len(lines); n < 32 || !predicted(lines[n-1]) {
		t.Errorf("got both predictions first on call %d (%v), want them from the 32nd call on, within %d", n, predicted(lines[n-1]), most)
	}
}
