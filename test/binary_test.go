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
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
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
		{"unknown key", "server:\n  lisen: x\n", "field lisen not found"},
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
	cmd     *exec.Cmd
	baseURL string
	key     string
}

func startDemo(t *testing.T) *demoProcess {
	t.Helper()
	bin := usherBinary(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command(bin, "demo", "--listen", addr, "--time-scale", "0.05", "--log-level", "warn")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &demoProcess{cmd: cmd}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			if v, ok := strings.CutPrefix(line, "OPENAI_BASE_URL="); ok {
				d.baseURL = v
			}
			if v, ok := strings.CutPrefix(line, "OPENAI_API_KEY="); ok {
				d.key = v
				close(found)
			}
		}
	}()
	select {
	case <-found:
	case <-time.After(30 * time.Second):
		t.Fatal("the demo printed no OPENAI_API_KEY line within 30s")
	}
	if d.baseURL != "http://"+addr+"/v1" {
		t.Fatalf("OPENAI_BASE_URL: got %q, want http://%s/v1", d.baseURL, addr)
	}
	return d
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
// (installed in test/openai-js by `make test`).
func TestOfficialOpenAINodeClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found: run `make test-deps` (it installs Node.js and the openai package)")
	}
	if _, err := os.Stat("openai-js/node_modules/openai"); err != nil {
		t.Fatal("the openai npm package is missing: run `make test-deps` (npm ci in test/openai-js)")
	}
	d := startDemo(t)
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
}
