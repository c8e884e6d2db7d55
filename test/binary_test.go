package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/test/testlog"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// usherBinary builds cmd/usher once per test run and returns its path.
func usherBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "usher-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "usher")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/usher").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestServeRefusesBadConfigWithExitCode2(t *testing.T) {
	bin := usherBinary(t)
	tests := []struct {
		name, yaml, want string
	}{
		{"syntax", "server: [", "parse:"},
		{"unknown key", "server:\n  lisen: x\n", "server.lisen: unknown key (line 2)"},
		{"bad listen", "server:\n  listen: nope\n", "server.listen"},
		{"no workers url", "routing:\n  workers:\n    - id: w1\n      url: \"ftp://x\"\n      models: [m]\n", "routing.workers[0].url"},
		{"bad key hash", "tenants:\n  - id: a\n    keys: [{name: k, sha256: xyz}]\n", "tenants[0].keys[0].sha256"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "usher.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			var stderr bytes.Buffer
			cmd := exec.Command(bin, "serve", "--config", path)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Fatalf("got %v, want exit code 2; stderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("stderr does not name %q:\n%s", tt.want, stderr.String())
			}
		})
	}
}

// demoProcess is `usher demo` running on a free port.
type demoProcess struct {
	cmd      *exec.Cmd
	baseURL  string // from the banner's export lines
	key      string
	batchKey string
	exports  string // the banner's export lines, as printed
	banner   string
}

// startDemo starts `usher demo` on a free port, with flags added to its own.
func startDemo(t *testing.T, flags ...string) *demoProcess {
	t.Helper()
	bin := usherBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, append([]string{"demo", "--listen", addr, "--time-scale", "0.05", "--log-level", "warn"}, flags...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	log := &lockedBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testlog.OnFailure(t, "usher demo", log.String)
	d := &demoProcess{cmd: cmd}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan struct{})
	go func() {
		var banner, exports strings.Builder
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			banner.WriteString(line + "\n")
			if v, ok := strings.CutPrefix(line, "export "); ok {
				exports.WriteString(line + "\n")
				name, value, _ := strings.Cut(v, "=")
				switch name {
				case "OPENAI_BASE_URL":
					d.baseURL = value
				case "OPENAI_API_KEY":
					d.key = value
				case "USHER_BATCH_KEY":
					d.batchKey = value
				}
			}
			if line == "Ctrl-C stops everything." {
				d.banner, d.exports = banner.String(), exports.String()
				close(found)
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(30 * time.Second):
		t.Fatal("the demo printed no whole banner within 30s")
	}
	if d.baseURL != "http://"+addr+"/v1" {
		t.Fatalf("export OPENAI_BASE_URL: got %q, want http://%s/v1; banner:\n%s", d.baseURL, addr, d.banner)
	}
	if d.key == "" || d.batchKey == "" {
		t.Fatalf("no export line for OPENAI_API_KEY or USHER_BATCH_KEY in the banner:\n%s", d.banner)
	}
	return d
}

// chat sends a small non-streamed chat completion to the demo with the given key and headers and
// returns the response headers; it fails t unless the answer is 200.
func (d *demoProcess) chat(t *testing.T, key string, header map[string]string) http.Header {
	t.Helper()
	body := `{"model":"demo-7b","max_tokens":3,"messages":[{"role":"user","content":"Hello, usher!"}]}`
	req, _ := http.NewRequest(http.MethodPost, d.baseURL+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	return resp.Header
}

// TestDemoShowsHeadlineFeatures checks that the demo, with no flags, shows what its banner says:
// tiers with limits (x-ratelimit-* headers), an interactive and a batch key, and sessions pinned
// by sticky_session over cache_aware.
func TestDemoShowsHeadlineFeatures(t *testing.T) {
	d := startDemo(t)
	for _, want := range []string{
		"export OPENAI_API_KEY=sk-usher-demo-",
		"export USHER_BATCH_KEY=sk-usher-batch-",
		`interactive key $OPENAI_API_KEY: tenant "demo", tier "interactive", class interactive, 1200 requests/min`,
		`batch key $USHER_BATCH_KEY: tenant "demo-batch", tier "batch", class batch`,
		"x-ratelimit-limit|remaining|reset-requests|tokens",
		"sticky_session over cache_aware",
		"admin token: usher-admin-",
	} {
		if !strings.Contains(d.banner, want) {
			t.Errorf("the banner does not say %q:\n%s", want, d.banner)
		}
	}

	tests := []struct {
		name, key, wantClass, wantLimit string
	}{
		{"interactive key", d.key, "interactive", "1200"},
		{"batch key", d.batchKey, "batch", "3000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := d.chat(t, tt.key, nil)
			if got := h.Get("X-Usher-Class"); got != tt.wantClass {
				t.Errorf("X-Usher-Class: got %q, want %q", got, tt.wantClass)
			}
			if got := h.Get("X-Ratelimit-Limit-Requests"); got != tt.wantLimit {
				t.Errorf("x-ratelimit-limit-requests: got %q, want %q", got, tt.wantLimit)
			}
			if h.Get("X-Ratelimit-Remaining-Tokens") == "" {
				t.Error("no x-ratelimit-remaining-tokens header")
			}
		})
	}

	t.Run("session", func(t *testing.T) {
		session := map[string]string{"X-Session-ID": "demo-session"}
		first := d.chat(t, d.key, session)
		if got := first.Get("X-Usher-Route"); got != "assigned" {
			t.Errorf("first request of a session: X-Usher-Route %q, want assigned", got)
		}
		for range 3 {
			h := d.chat(t, d.key, session)
			if got := h.Get("X-Usher-Route"); got != "sticky" {
				t.Errorf("later request of the session: X-Usher-Route %q, want sticky", got)
			}
			if got, want := h.Get("X-Usher-Worker"), first.Get("X-Usher-Worker"); got != want {
				t.Errorf("later request of the session: worker %q, want the session's %q", got, want)
			}
		}
	})

	t.Run("no session", func(t *testing.T) {
		h := d.chat(t, d.key, nil)
		if got := h.Get("X-Usher-Route"); !strings.HasPrefix(got, "cache_") && got != "load_fallback" {
			t.Errorf("X-Usher-Route without a session: got %q, want a cache_aware route", got)
		}
	})

	// The admin plane of the real binary: its OpenAPI document without a token, and the
	// Overview's history, sampled from the start.
	t.Run("admin plane", func(t *testing.T) {
		m := regexp.MustCompile(`admin token: (usher-admin-\S+)`).FindStringSubmatch(d.banner)
		if m == nil || !strings.Contains(d.banner, "/admin/api/v1/openapi.json") {
			t.Fatalf("the banner names no admin token or OpenAPI document:\n%s", d.banner)
		}
		base := strings.TrimSuffix(d.baseURL, "/v1")
		resp, err := http.Get(base + "/admin/api/v1/openapi.json")
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			OpenAPI string         `json:"openapi"`
			Paths   map[string]any `json:"paths"`
		}
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !strings.HasPrefix(doc.OpenAPI, "3.") || doc.Paths["/overview"] == nil {
			t.Fatalf("openapi.json: got %d %v %q with %d paths", resp.StatusCode, err, doc.OpenAPI, len(doc.Paths))
		}
		req, _ := http.NewRequest("GET", base+"/admin/api/v1/overview", nil)
		req.Header.Set("Authorization", "Bearer "+m[1])
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var o struct {
			History []map[string]any `json:"history"`
		}
		err = json.NewDecoder(resp.Body).Decode(&o)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(o.History) == 0 {
			t.Errorf("overview: got %d %v with %d history samples, want at least the first", resp.StatusCode, err, len(o.History))
		}
	})
}

func TestDemoStreamsAChatCompletionAndStopsCleanly(t *testing.T) {
	d := startDemo(t)
	body := `{"model":"demo-7b","stream":true,"max_tokens":10,"messages":[{"role":"user","content":"Hello, usher!"}]}`
	req, _ := http.NewRequest(http.MethodPost, d.baseURL+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+d.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s", resp.StatusCode, data)
	}
	if n := strings.Count(string(data), `"content":`); n < 10 || !strings.HasSuffix(strings.TrimSpace(string(data)), "data: [DONE]") {
		t.Fatalf("got %d content chunks, want 10 and [DONE]:\n%s", n, data)
	}
	if err := d.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitErr := make(chan error, 1)
	go func() { waitErr <- d.cmd.Wait() }()
	select {
	case err := <-waitErr:
		if err != nil {
			t.Fatalf("the demo did not exit 0 on Ctrl-C: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the demo did not stop within 15s of Ctrl-C")
	}
}

// TestOfficialOpenAINodeClient drives the demo with the official openai npm package
// (installed in test/openai-js by `make test`): a stream, models.list and models.retrieve, and
// embeddings.create.
func TestOfficialOpenAINodeClient(t *testing.T) {
	runOpenAINodeClient(t, startDemo(t))
}

// The same against a disaggregated demo model (issue 29): a request served in two stages is
// indistinguishable to the SDK.
func TestOfficialOpenAINodeClientDisaggregated(t *testing.T) {
	d := startDemo(t, "--prefill-workers", "1")
	runOpenAINodeClient(t, d)
	if got := gatewayCounter(t, strings.TrimSuffix(d.baseURL, "/v1"), "usher_stage_requests_total", `result="ok",stage="decode"`); got == 0 {
		t.Fatal("no decode stage was served: the demo model is not disaggregated")
	}
}

// runOpenAINodeClient drives the demo d with test/openai-js/stream.mjs and checks its answers.
func runOpenAINodeClient(t *testing.T, d *demoProcess) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: run `make test-deps` (it installs Node.js and the openai package)")
	}
	if _, err := os.Stat("openai-js/node_modules/openai"); err != nil {
		t.Fatal("the openai npm package is missing: run `make test-deps` (npm ci in test/openai-js)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "stream.mjs")
	cmd.Dir = "openai-js"
	cmd.Env = append(os.Environ(), "OPENAI_BASE_URL="+d.baseURL, "OPENAI_API_KEY="+d.key, "USHER_MODEL=demo-7b")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("node stream.mjs: %v\n%s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var got struct {
		Chunks int      `json:"chunks"`
		Text   string   `json:"text"`
		Models []string `json:"models"`
		Usage  *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Retrieved       string `json:"retrieved"`
		MissingStatus   int    `json:"missingStatus"`
		Embeddings      []int  `json:"embeddings"`
		EmbeddingTokens int    `json:"embeddingTokens"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	if got.Chunks != 12 || got.Usage == nil || got.Usage.CompletionTokens != 12 {
		t.Fatalf("got %d chunks and usage %+v, want 12 and 12 completion tokens", got.Chunks, got.Usage)
	}
	if len(got.Models) != 1 || got.Models[0] != "demo-7b" {
		t.Fatalf("models: got %v, want [demo-7b]", got.Models)
	}
	if got.Retrieved != "demo-7b" || got.MissingStatus != http.StatusNotFound {
		t.Fatalf("models.retrieve: got %q and %d for an unknown model, want demo-7b and 404", got.Retrieved, got.MissingStatus)
	}
	if len(got.Embeddings) != 2 || got.Embeddings[0] == 0 || got.EmbeddingTokens == 0 {
		t.Fatalf("embeddings.create: got vectors of %v and %d tokens, want two vectors", got.Embeddings, got.EmbeddingTokens)
	}
}

// TestREADMENodeSnippet runs the README's Node.js quick start as a user would: the banner's
// export lines pasted into sh, then `node index.mjs` in a folder as `npm init -y` leaves it
// ("type": "commonjs" since npm 11), with the openai package of test/openai-js.
func TestREADMENodeSnippet(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: run `make test-deps` (it installs Node.js and the openai package)")
	}
	modules, err := filepath.Abs("openai-js/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(modules, "openai")); err != nil {
		t.Fatal("the openai npm package is missing: run `make test-deps` (npm ci in test/openai-js)")
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const open, end = "cat > index.mjs <<'EOF'\n", "\nEOF\nnode index.mjs\n"
	_, rest, ok := strings.Cut(string(readme), open)
	snippet, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		t.Fatalf("README.md has no block from %q to %q", open, end)
	}
	dir := t.TempDir()
	files := map[string]string{
		"index.mjs":    snippet + "\n",
		"package.json": `{"name": "usher", "version": "1.0.0", "main": "index.js", "license": "ISC", "type": "commonjs"}` + "\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(modules, filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}

	d := startDemo(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", d.exports+node+" index.mjs\n")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPENAI_") && !strings.HasPrefix(kv, "USHER_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the README's snippet: %v\n%s", err, stderr.String())
	}
	if len(strings.Fields(string(out))) < 2 || !strings.HasSuffix(string(out), "\n") {
		t.Fatalf("the README's snippet printed %q, want a streamed answer and a newline", out)
	}
}

// TestEveryCommandHasHelp runs each command of the real binary with -h and --help: the usage,
// naming the command, and exit code 0.
func TestEveryCommandHasHelp(t *testing.T) {
	bin := usherBinary(t)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "usage: usher <command>"},
		{[]string{"help"}, "usage: usher <command>"},
		{[]string{"serve"}, "usage: usher serve"},
		{[]string{"demo"}, "usage: usher demo"},
		{[]string{"sim"}, "usage: usher sim"},
		{[]string{"bench"}, "usage: usher bench"},
		{[]string{"migrate"}, "usage: usher migrate"},
		{[]string{"migrate", "up"}, "usage: usher migrate"},
		{[]string{"keyhash"}, "usher keyhash"},
		{[]string{"version"}, "usage: usher version"},
	}
	for _, tt := range tests {
		for _, flag := range []string{"-h", "--help"} {
			args := append(slices.Clone(tt.args), flag)
			if tt.args[0] == "-h" || tt.args[0] == "help" {
				if flag == "--help" {
					continue
				}
				args = tt.args
			}
			t.Run(strings.Join(args, " "), func(t *testing.T) {
				out, err := exec.Command(bin, args...).CombinedOutput()
				if err != nil {
					t.Fatalf("got %v, want exit code 0; output:\n%s", err, out)
				}
				if !strings.Contains(string(out), tt.want) {
					t.Fatalf("output does not contain %q:\n%s", tt.want, out)
				}
			})
		}
	}
}

func TestVersionCommand(t *testing.T) {
	out, err := exec.Command(usherBinary(t), "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if line := strings.TrimSpace(string(out)); !strings.HasPrefix(line, "usher ") || !strings.Contains(line, "go1.") || strings.Contains(line, "\n") {
		t.Fatalf("usher version: got %q, want one line: usher VERSION (..., goX.Y)", out)
	}
}

// TestServeStartupLog: `usher serve` warns, naming the fix, when no one can use the console, and
// its start-up line counts models and workers apart.
func TestServeStartupLog(t *testing.T) {
	tests := []struct {
		name, admin string
		warn        bool
	}{
		{"no admin section", "", true},
		{"a viewer token only", "admin: {viewer_token: a-viewer-token-of-24-characters}\n", true},
		{"an admin token", "admin: {token: an-admin-token-of-24-characters}\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := startServe(t, tt.name, func(listen string) string {
				return "server:\n  listen: " + listen + "\n" +
					"routing:\n  workers:\n" +
					"    - {id: w1, url: \"http://127.0.0.1:9\", models: [m]}\n" +
					"    - {id: w2, url: \"http://127.0.0.1:9\", models: [m]}\n" +
					"database:\n  url: sqlite:" + filepath.Join(dir, "usher.db") + "\n" + tt.admin
			})
			p.waitLog("usher is serving", 20*time.Second)
			log := p.log.String()
			warned := strings.Contains(log, `level=WARN msg="NO ADMIN TOKEN: no operator can sign into the console`) &&
				strings.Contains(log, "set admin.token (or USHER_ADMIN_TOKEN")
			if warned != tt.warn {
				t.Errorf("warned about the admin token: %v, want %v; log:\n%s", warned, tt.warn, log)
			}
			if !strings.Contains(log, "models=1 workers=2") {
				t.Errorf("the start-up line does not say models=1 workers=2:\n%s", log)
			}
		})
	}
}

// A client that trickles its request body is cut off at server.read_timeout instead of holding a
// connection for as long as it likes (issue 10, item 4; unauthenticated too: the body is what
// hangs).
func TestServeCutsOffSlowBodies(t *testing.T) {
	dir := t.TempDir()
	p := startServe(t, "slow bodies", func(listen string) string {
		return "server:\n  listen: " + listen + "\n  read_timeout: 1s\n" +
			"routing:\n  workers:\n    - {id: w1, url: \"http://127.0.0.1:9\", models: [m]}\n" +
			"database:\n  url: sqlite:" + filepath.Join(dir, "usher.db") + "\n"
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-nobody\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
	start := time.Now()
	closed := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		for {
			if _, err := conn.Read(buf); err != nil {
				closed <- err
				return
			}
		}
	}()
	for {
		select {
		case <-closed:
			if d := time.Since(start); d > 10*time.Second {
				t.Fatalf("the connection closed after %v, want about the 1s read timeout", d)
			}
			return
		case <-time.After(200 * time.Millisecond):
			if time.Since(start) > 15*time.Second {
				t.Fatal("a client sending one body byte every 200ms still holds its connection after 15s")
			}
			_, _ = conn.Write([]byte(" "))
		}
	}
}
