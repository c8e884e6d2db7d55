// Package realengine runs llama.cpp's llama-server, a real inference engine, for usher's
// end-to-end tests: N processes on free loopback ports, each with its own slots, prompt cache,
// Prometheus metrics and SSE server, serving a random-weight model with the real Qwen2
// tokenizer. build.sh beside this file builds the binary and the models into a cache outside
// the repository; `make test` runs it first. A test that finds them missing fails and names the
// command; it never skips.
package realengine

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/test/testlog"
)

// Version is the node-llama-cpp release whose llama.cpp source build.sh builds; it names the
// cache directory.
const Version = "3.22.1"

// BuildCommand builds the engine and the models (about 6 minutes the first time).
const BuildCommand = "test/realengine/build.sh"

// Models build.sh writes.
const (
	Micro = "micro" // 64 wide, 2 layers: fast; the Qwen2 vocabulary dominates its cost
	Small = "small" // 512 wide, 8 layers: prefill and prompt-cache hits cost visibly different
)

// Dir is the cache directory build.sh writes: $USHER_REALENGINE_DIR, else
// ${XDG_CACHE_HOME:-$HOME/.cache}/usher/realengine-<Version>.
func Dir() (string, error) {
	if d := os.Getenv("USHER_REALENGINE_DIR"); d != "" {
		return d, nil
	}
	c, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("realengine: cache directory: %w", err)
	}
	return filepath.Join(c, "usher", "realengine-"+Version), nil
}

// Options configure each engine of a Start; zero fields take defaults.
type Options struct {
	Model   string // Micro or Small; default Micro
	ID      string // model id the engine reports and answers to (-a); default the model's name
	Slots   int    // parallel sequences (-np); default 2
	Context int    // context per slot in tokens; the engine gets Slots x Context (-c); default 4096
	Threads int    // CPU threads (-t); default 1
	APIKey  string // --api-key: requests but /health and the model list must carry it; default none
	// Args are more llama-server flags, after those above (e.g. "--cache-ram", "0": each slot
	// keeps only its last prompt).
	Args []string
}

func (o *Options) setDefaults() {
	if o.Model == "" {
		o.Model = Micro
	}
	if o.ID == "" {
		o.ID = o.Model
	}
	if o.Slots == 0 {
		o.Slots = 2
	}
	if o.Context == 0 {
		o.Context = 4096
	}
	if o.Threads == 0 {
		o.Threads = 1
	}
}

// Engine is one running llama-server. Its methods are safe for concurrent use.
type Engine struct {
	URL string // http://127.0.0.1:port
	ID  string // the model id it serves

	cmd    *exec.Cmd
	log    *tailBuffer
	exited chan struct{} // closed when the process has exited
}

// Start runs n engines with options o and waits until each answers /health. They are stopped
// when the test ends, and their logs are printed if it failed. Start fails the test, naming
// BuildCommand, when the binary or the model is missing.
func Start(t testing.TB, n int, o Options) []*Engine {
	t.Helper()
	o.setDefaults()
	dir, err := Dir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin", "llama-server")
	model := filepath.Join(dir, "models", o.Model+".gguf")
	for _, f := range []string{bin, model} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("realengine: %v; build the engine and models with %s (make test runs it first)", err, BuildCommand)
		}
	}
	engines := make([]*Engine, n)
	for i := range engines {
		engines[i] = start(t, bin, model, o, i)
	}
	return engines
}

// start runs one engine, trying a few ports: a free port found by listening can be taken by
// another process before the engine binds it.
func start(t testing.TB, bin, model string, o Options, i int) *Engine {
	t.Helper()
	name := fmt.Sprintf("llama-server-%d", i)
	var last error
	for range 3 {
		e, err := launch(bin, model, o)
		if err == nil {
			// The end of its log, handed over when the test fails (testlog), once it stopped.
			testlog.OnFailure(t, name, e.log.String)
			t.Cleanup(e.Stop)
			return e
		}
		last = err
		if e != nil {
			testlog.OnFailure(t, name+"-attempt", e.log.String)
		}
	}
	t.Fatalf("realengine: llama-server %d: %v", i, last)
	return nil
}

// launch starts one engine on a free port and waits until it is healthy. When it started but did
// not become healthy, the stopped Engine comes back with the error, for its log.
func launch(bin, model string, o Options) (*Engine, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	e := &Engine{URL: "http://127.0.0.1:" + strconv.Itoa(port), ID: o.ID, log: newTailBuffer(64 << 10), exited: make(chan struct{})}
	args := []string{"-m", model, "-a", o.ID, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"--metrics", "-np", strconv.Itoa(o.Slots), "-c", strconv.Itoa(o.Slots * o.Context), "-t", strconv.Itoa(o.Threads)}
	if o.APIKey != "" {
		args = append(args, "--api-key", o.APIKey)
	}
	e.cmd = exec.Command(bin, append(args, o.Args...)...)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	e.cmd.SysProcAttr = dieWithParent()
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() { _ = e.cmd.Wait(); close(e.exited) }()
	if err := e.waitHealthy(30 * time.Second); err != nil {
		e.Stop()
		return e, err // stopped, for its log
	}
	return e, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var client = &http.Client{Timeout: 5 * time.Second}

func (e *Engine) waitHealthy(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := client.Get(e.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-e.exited:
			return errors.New("llama-server exited before it was healthy")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("llama-server not healthy within %v", within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// PID is the engine's process id.
func (e *Engine) PID() int { return e.cmd.Process.Pid }

// Kill ends the engine with SIGKILL, as a crash would, and waits until it has exited: every
// connection to it is then closed or refused.
func (e *Engine) Kill() {
	_ = e.cmd.Process.Signal(syscall.SIGKILL)
	<-e.exited
}

// Stop ends the engine with SIGTERM, SIGKILL after 5 seconds, and waits until it has exited.
// Stopping an engine that has exited does nothing.
func (e *Engine) Stop() {
	select {
	case <-e.exited:
		return
	default:
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(5 * time.Second):
		e.Kill()
	}
}

// Log returns the tail of the engine's log (its stdout and stderr).
func (e *Engine) Log() string { return e.log.String() }

// Metrics is what the engine reports on /metrics that the tests read.
type Metrics struct {
	RequestsProcessing float64 // llamacpp:requests_processing: requests in a slot
	RequestsDeferred   float64 // llamacpp:requests_deferred: requests waiting in the engine's own queue
	PromptTokens       float64 // llamacpp:prompt_tokens_total: prompt tokens processed, cached ones excluded
	TokensPredicted    float64 // llamacpp:tokens_predicted_total
}

// Metrics reads the engine's Prometheus metrics.
func (e *Engine) Metrics(ctx context.Context) (Metrics, error) {
	resp, err := e.get(ctx, "/metrics")
	if err != nil {
		return Metrics{}, err
	}
	defer resp.Body.Close()
	var m Metrics
	fields := map[string]*float64{
		"llamacpp:requests_processing":    &m.RequestsProcessing,
		"llamacpp:requests_deferred":      &m.RequestsDeferred,
		"llamacpp:prompt_tokens_total":    &m.PromptTokens,
		"llamacpp:tokens_predicted_total": &m.TokensPredicted,
	}
	seen := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if p := fields[name]; ok && p != nil {
			if *p, err = strconv.ParseFloat(strings.TrimSpace(val), 64); err != nil {
				return Metrics{}, fmt.Errorf("realengine: metric %s: %w", name, err)
			}
			seen++
		}
	}
	if err := sc.Err(); err != nil {
		return Metrics{}, fmt.Errorf("realengine: read metrics: %w", err)
	}
	if seen != len(fields) {
		return Metrics{}, fmt.Errorf("realengine: /metrics has %d of the %d metrics read", seen, len(fields))
	}
	return m, nil
}

// Slot is one of the engine's parallel sequences, as /slots reports it.
type Slot struct {
	ID           int  `json:"id"`
	NCtx         int  `json:"n_ctx"`
	IsProcessing bool `json:"is_processing"`
	// Params are the sampling parameters of the slot's task; Stream says whether it was asked
	// for a stream.
	Params struct {
		Stream bool `json:"stream"`
	} `json:"params"`
}

// Slots reads the engine's slots.
func (e *Engine) Slots(ctx context.Context) ([]Slot, error) {
	resp, err := e.get(ctx, "/slots")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var s []Slot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, fmt.Errorf("realengine: decode /slots: %w", err)
	}
	return s, nil
}

func (e *Engine) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("realengine: GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("realengine: GET %s: status %d", path, resp.StatusCode)
	}
	return resp, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex // guards buf
	buf []byte
	max int
}

func newTailBuffer(max int) *tailBuffer { return &tailBuffer{max: max} }

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
