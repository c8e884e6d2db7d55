package gateway

import (
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// epoch is the clock reading the gap tests count their hearings from.
var epoch = time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)

// An attempt's longest gap (routing.Outcome.LongestGap, what the cost model takes for an engine
// step) is the longest time between two hearings of the worker after its first event: the wait
// for the first event is the prompt's own time to first token, not a step, and is not counted.
func TestAttemptLongestGapCountsOnlyAfterTheFirstEvent(t *testing.T) {
	var g streamGaps
	g.heard(epoch.Add(0))
	g.heard(epoch.Add(time.Second)) // its first event, after the prompt's prefill
	g.decoding = true               // as attempt.firstToken sets it
	g.heard(epoch.Add(time.Second))
	g.heard(epoch.Add(time.Second + 20*time.Millisecond)) // a step
	g.heard(epoch.Add(time.Second + 20*time.Millisecond))
	if g.longest < 20*time.Millisecond || g.longest >= time.Second {
		t.Errorf("longest gap %v: want the 20 ms pause after the first event, not the 1 s before it", g.longest)
	}
}

// A stream's median gap (routing.Outcome.MedianGap, what the cost model takes for a decode step)
// is that of its decode steps: the few long steps that prefilled other prompts beside it, and
// the split reads of one step's bytes, do not move it.
func TestStreamMedianGapIsTheDecodeStep(t *testing.T) {
	var g streamGaps
	g.decoding = true
	at := time.Second
	g.heard(epoch.Add(at))
	hear := func(gaps ...time.Duration) {
		for _, d := range gaps {
			at += d
			g.heard(epoch.Add(at))
		}
	}
	for range 4 {
		hear(12*time.Millisecond, 12*time.Millisecond, 13*time.Millisecond, 20*time.Microsecond, 400*time.Millisecond)
	}
	if got := g.median(); got < 11*time.Millisecond || got > 14*time.Millisecond {
		t.Errorf("median gap: got %v, want the 12-13 ms decode step", got)
	}
	if g.longest < 400*time.Millisecond {
		t.Errorf("longest gap: got %v, want the 400 ms prefill step", g.longest)
	}

	var short streamGaps
	short.decoding = true
	short.heard(epoch.Add(0))
	short.heard(epoch.Add(10 * time.Millisecond))
	short.heard(epoch.Add(20 * time.Millisecond))
	if got := short.median(); got != 0 {
		t.Errorf("two gaps: got median %v, want 0 (too few to tell)", got)
	}
}

// A hostile or endless stream cannot overflow the histogram or move a median it does not make:
// 100,000 gaps of 15 ms beside gaps of an hour and of nothing.
func TestStreamMedianGapBounded(t *testing.T) {
	var g streamGaps
	g.decoding = true
	var at time.Duration
	for i := range 100_000 {
		d := 15 * time.Millisecond
		switch i % 1000 {
		case 1:
			d = time.Hour
		case 2:
			d = 0
		}
		at += d
		g.heard(epoch.Add(at))
	}
	if got := g.median(); got < 13*time.Millisecond || got > 17*time.Millisecond {
		t.Errorf("median gap: got %v, want 15 ms within an eighth", got)
	}
}

// gapHistogram's quantile is within an eighth of the duration it counted, from a fraction of a
// millisecond to seconds.
func TestGapHistogramResolution(t *testing.T) {
	for d := 100 * time.Microsecond; d < 8*time.Second; d = d * 21 / 20 {
		var h gapHistogram
		h.add(d)
		if got := h.quantile(0.5); float64(got) < 0.87*float64(d) || float64(got) > 1.13*float64(d) {
			t.Errorf("%v: got %v, want within an eighth", d, got)
		}
	}
	var none gapHistogram
	if got := none.quantile(0.5); got != 0 {
		t.Errorf("empty: got %v, want 0", got)
	}
}

// steppingEngine streams eight tokens a step apart, every fourth after a step ten times as long
// (a prefill of another prompt beside the stream, as a loaded engine runs it): a TPOT of 64 ms
// over the answer, of steps of 10 ms.
type steppingEngine struct{ step time.Duration }

func (e steppingEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		return
	}
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "text/event-stream")
	flusher := w.(http.Flusher)
	for i := range 8 {
		switch {
		case i == 0:
		case i%4 == 0:
			time.Sleep(20 * e.step)
		default:
			time.Sleep(e.step)
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
		flusher.Flush()
	}
	fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":8,\"total_tokens\":13}}\n\ndata: [DONE]\n\n")
}

// The default TPOT objective is relative to the worker's step as its streams show it, end to end:
// an engine whose answers each wait through two long steps (a TPOT of 64 ms over steps of 10 ms)
// gets an interactive TPOT objective of about three steps, not three of its TPOTs (what the
// TPOT law alone learnt: 112 ms in a run).
func TestDefaultTPOTObjectiveIsThreeSteps(t *testing.T) {
	srv := httptest.NewServer(steppingEngine{step: 10 * time.Millisecond})
	t.Cleanup(srv.Close)
	logs := &syncBuffer{}
	g := startGatewayWith(t, []routing.WorkerSpec{{ID: "w0", URL: srv.URL, Models: []string{testModel}}}, nil, func(d *Deps) {
		d.Auth = tierAuth{opsTier}
		d.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	const warm, parallel = 48, 4
	var wg sync.WaitGroup
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range warm / parallel {
				resp := g.post(t, "/v1/chat/completions", testKey, streamBody, nil)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	resp := g.post(t, "/v1/chat/completions", testKey, streamBody, map[string]string{headerPriority: "interactive"})
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	eventuallyTrue(t, func() bool { return strings.Count(logs.String(), "msg=request") == warm+1 })
	ms := lastLogInt(t, logs.String(), "tpot_objective_ms")
	// Three steps of at least 10 ms each, read within an eighth; at most 1.5 of the answers' own
	// TPOT.
	if ms < 26 || ms > 96 {
		t.Errorf("interactive TPOT objective: got %d ms, want about three 10 ms steps (26-96)", ms)
	}
}
