package test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/testlog"
)

// startSimProcess runs `usher sim` (the real binary) with args on a free port until /health
// answers, and returns its base URL. The process is killed when the test ends.
func startSimProcess(t *testing.T, args ...string) string {
	t.Helper()
	addr := freeAddr(t)
	cmd := exec.Command(usherBinary(t), append([]string{"sim", "--listen", addr}, args...)...)
	log := &lockedBuffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	testlog.OnFailure(t, "usher sim "+addr, log.String)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	url := "http://" + addr
	eventually(t, 20*time.Second, "usher sim answers /health", func() bool {
		select {
		case <-exited:
			t.Fatalf("usher sim on %s exited before answering /health", addr)
		default:
		}
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url
}

// An engine started with --api-key serves through usher with its key set in usher's config
// only (from the environment, by api_key_env): the client sends its own usher key, which never
// reaches the engine, and sees the public model name of model_aliases, streamed or not, while
// the engine is asked for its own name. The key never shows in usher's log.
func TestEngineWithAPIKeyServesThroughUsher(t *testing.T) {
	const engineKey = "sk-engine-only-the-config-knows-0123"
	const clientKey = "sk-client-of-usher"
	t.Setenv("USHER_TEST_ENGINE_KEY", engineKey)
	sim := startSimProcess(t, "--api-key", engineKey, "--model", "org/engine-7b", "--time-scale", "0.01")

	// The engine itself refuses a request without its key.
	resp, err := http.Post(sim+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"org/engine-7b","messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the engine without its key: got %d, want 401", resp.StatusCode)
	}

	gw := startServe(t, "usher serve", func(listen string) string {
		return fmt.Sprintf(`server: {listen: %q}
routing:
  workers:
    - id: keyed
      url: %q
      models: [public-7b]
      api_key_env: USHER_TEST_ENGINE_KEY
      model_aliases: {public-7b: org/engine-7b}
tenants:
  - id: t1
    keys: [{name: k, sha256: %s}]
log: {level: debug}
`, listen, sim, tenants.HashKey(clientKey))
	})
	post := func(body string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, gw.url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+clientKey)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	resp = post(`{"model":"public-7b","max_tokens":5,"messages":[{"role":"user","content":"hello"}]}`)
	data, _ := io.ReadAll(resp.Body)
	var answer struct {
		Model string `json:"model"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(data, &answer); err != nil || resp.StatusCode != http.StatusOK ||
		answer.Model != "public-7b" || answer.Usage.CompletionTokens != 5 {
		t.Fatalf("through usher: %d %s; want 200, model public-7b and 5 tokens", resp.StatusCode, data)
	}

	resp = post(`{"model":"public-7b","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hello"}]}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream through usher: %d", resp.StatusCode)
	}
	chunks := 0
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		payload, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || payload == "[DONE]" {
			continue
		}
		var chunk struct {
			Model string `json:"model"`
		}
		if err := json.Unmarshal([]byte(payload), &chunk); err != nil || chunk.Model != "public-7b" {
			t.Fatalf("chunk %s: want model public-7b", payload)
		}
		chunks++
	}
	if chunks != 4 {
		t.Fatalf("got %d chunks, want 4", chunks)
	}
	if strings.Contains(gw.log.String(), engineKey) {
		t.Fatalf("the engine's key shows in usher's log:\n%s", gw.log.String())
	}
}
