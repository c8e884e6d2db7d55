package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer safe for the server's and the test's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestSimBadFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantOut string
	}{
		{"unknown flag", []string{"--no-such-flag"}, "flag provided but not defined: -no-such-flag"},
		{"bad value", []string{"--max-num-seqs=many"}, "invalid value \"many\" for flag -max-num-seqs"},
		{"invalid config", []string{"--error-rate=2"}, "sim.faults.error_rate: must be in [0, 1], got 2"},
		{"bad policy", []string{"--scheduling-policy=lifo"}, "sim.scheduling_policy"},
		{"bad mode", []string{"--mode=paged"}, "sim.mode"},
		{"slots with priority", []string{"--mode=slots", "--scheduling-policy=priority"}, "sim.scheduling_policy"},
		{"stray argument", []string{"extra"}, `unexpected argument "extra"`},
		{"kv events port out of range", []string{"--kv-events-port=65535"}, "--kv-events-port must be a port in 0..65534"},
		{"kv events in slots mode", []string{"--mode=slots", "--kv-events-port=5557"}, "sim.kv_events"},
		{"bad role", []string{"--role=router"}, "sim.role"},
		{"decode role in slots mode", []string{"--mode=slots", "--role=decode"}, "sim.role"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out syncBuffer
			if got := serveSim(t.Context(), tt.args, &out, nil); got != 2 {
				t.Errorf("exit code: got %d, want 2", got)
			}
			if !strings.Contains(out.String(), tt.wantOut) {
				t.Errorf("output: got %q, want it to contain %q", out.String(), tt.wantOut)
			}
		})
	}
}

// startSim runs serveSim on a free port and returns its address and exit code channel.
func startSim(t *testing.T, ctx context.Context, args ...string) (string, <-chan int) {
	t.Helper()
	addrc := make(chan net.Addr, 1)
	code := make(chan int, 1)
	var out syncBuffer
	go func() {
		code <- serveSim(ctx, append([]string{"--listen=127.0.0.1:0"}, args...), &out, func(a net.Addr) { addrc <- a })
	}()
	select {
	case a := <-addrc:
		return "http://" + a.String(), code
	case c := <-code:
		t.Fatalf("usher sim exited with %d before serving: %s", c, out.String())
	case <-time.After(5 * time.Second):
		t.Fatal("usher sim did not start")
	}
	return "", nil
}

func simPost(url, body string) (int, error) {
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return resp.StatusCode, err
	}
	return resp.StatusCode, nil
}

func TestSimServesAndStops(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	url, code := startSim(t, ctx, "--time-scale=0.01", "--model=m1")
	if got, err := simPost(url, `{"model":"m1","prompt":"hi","max_tokens":3}`); err != nil || got != 200 {
		t.Fatalf("completion: got %d, %v, want 200", got, err)
	}
	cancel()
	select {
	case got := <-code:
		if got != 0 {
			t.Errorf("exit code after stop: got %d, want 0", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("usher sim did not stop")
	}
}

func TestSimSlotsModeServesProps(t *testing.T) {
	url, _ := startSim(t, t.Context(), "--time-scale=0.01", "--mode=slots", "--slots=3", "--kv-cache-tokens=3072")
	resp, err := http.Get(url + "/props")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var props struct {
		TotalSlots int `json:"total_slots"`
		Settings   struct {
			NCtx int `json:"n_ctx"`
		} `json:"default_generation_settings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&props); err != nil || props.TotalSlots != 3 || props.Settings.NCtx != 1024 {
		t.Errorf("/props: got %+v (%v), want total_slots 3 and n_ctx 1024", props, err)
	}
}

func TestSimExitAfter(t *testing.T) {
	url, code := startSim(t, t.Context(), "--time-scale=0.01", "--exit-after=1")
	if got, err := simPost(url, `{"prompt":"hi","max_tokens":2}`); err != nil || got != 200 {
		t.Fatalf("the one request: got %d, %v, want 200", got, err)
	}
	select {
	case got := <-code:
		if got != 1 {
			t.Errorf("exit code after --exit-after: got %d, want 1", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("usher sim did not exit after its one request")
	}
}

// Two `usher sim` processes' servers on loopback, one --role prefill and one --role decode,
// hand a prompt's KV over as vLLM's toy proxy drives them: the prefill's answer's
// kv_transfer_params, fed to the decode, get the whole answer.
func TestSimPrefillDecodeHandoff(t *testing.T) {
	prefill, _ := startSim(t, t.Context(), "--time-scale=0.01", "--role=prefill")
	decode, _ := startSim(t, t.Context(), "--time-scale=0.01", "--role=decode")
	prompt := strings.Repeat("word ", 50)
	resp, err := http.Post(prefill+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"`+prompt+`","max_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`))
	if err != nil {
		t.Fatal(err)
	}
	var pa struct {
		KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	}
	err = json.NewDecoder(resp.Body).Decode(&pa)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(pa.KVTransferParams) == 0 {
		t.Fatalf("prefill: status %d, params %s (%v)", resp.StatusCode, pa.KVTransferParams, err)
	}
	resp, err = http.Post(decode+"/v1/completions", "application/json", strings.NewReader(
		`{"prompt":"`+prompt+`","max_tokens":5,"kv_transfer_params":`+string(pa.KVTransferParams)+`}`))
	if err != nil {
		t.Fatal(err)
	}
	var da struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
			Details          struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	err = json.NewDecoder(resp.Body).Decode(&da)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || da.Usage.CompletionTokens != 5 || da.Usage.Details.CachedTokens != 49 {
		t.Fatalf("decode: status %d, usage %+v (%v); want 200, 5 tokens, 49 cached (pulled)", resp.StatusCode, da.Usage, err)
	}
}
