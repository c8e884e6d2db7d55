package test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

// streamResult is how one streamed request ended, as its client saw it.
type streamResult struct {
	status int
	worker string
	done   bool // the stream ended with data: [DONE]
	err    error
}

// startStream sends a streamed chat request with client and returns once the first event
// arrived (or the request failed); the rest of the stream is read in the background.
func startStream(t *testing.T, client *http.Client, url, key string, maxTokens int) <-chan streamResult {
	t.Helper()
	out := make(chan streamResult, 1)
	first := make(chan struct{})
	go func() {
		defer close(out)
		var r streamResult
		defer func() { out <- r }()
		firstOnce := func() {
			select {
			case <-first:
			default:
				close(first)
			}
		}
		defer firstOnce()
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat("tell a long story", maxTokens, true)))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			r.err = err
			return
		}
		defer resp.Body.Close()
		r.status, r.worker = resp.StatusCode, resp.Header.Get("X-Usher-Worker")
		events := newSSEReader(resp.Body)
		last, n := "", 0
		for e, ok := events.next(); ok; e, ok = events.next() {
			if n++; n == 1 {
				firstOnce()
			}
			last = e
		}
		r.done = last == "[DONE]"
		r.err = events.sc.Err()
	}()
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("no first event within 10s")
	}
	return out
}

// post sends a non-streamed chat request with client; err is what the client saw when no
// answer came.
func post(client *http.Client, url, key string) (*http.Response, string, error) {
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat("hi", 2, false)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

// serveConfig is a minimal `usher serve` configuration: the workers at urls, one tenant with
// apiKey in the tier e2e (urls[i] is the worker sim-i; "" skips it) (interactive, so the queue's interactive reserve does not hold back
// capacity; tierFields adds to it), SQLite in dir, and the extra YAML of the caller (top-level
// sections) appended.
func serveConfig(listen, dir string, urls []string, server, tierFields, extra string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server:\n  listen: %s\n%s", listen, server)
	b.WriteString("routing:\n  health: {interval: 200ms, timeout: 100ms}\n  workers:\n")
	for i, u := range urls {
		if u == "" {
			continue
		}
		fmt.Fprintf(&b, "    - {id: sim-%d, url: %q, models: [%s], max_concurrency: 1}\n", i, u, model)
	}
	fmt.Fprintf(&b, "tiers:\n  - {name: e2e, default_class: interactive%s}\n", tierFields)
	fmt.Fprintf(&b, "tenants:\n  - id: e2e\n    tier: e2e\n    keys: [{name: k, sha256: %s}]\n", tenants.HashKey(apiKey))
	fmt.Fprintf(&b, "database: {url: %q}\nlog: {level: info}\n%s", "sqlite:"+dir+"/usher.db", extra)
	return b.String()
}

func TestSIGTERMSettlesFinishesStreamsAndExitsZero(t *testing.T) {
	var urls []string
	for range 2 {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.TimeScale = model, 1 // about 12 ms a token
		_, srv := simtest.Start(t, cfg)
		urls = append(urls, srv.URL)
	}
	dir := t.TempDir()
	// The settle time must hold the steps below (a few requests) on a busy machine too, and the
	// streams (400 tokens, about 4.8 s) must outlive it, so the queued request finds no worker.
	const settle = 3 * time.Second
	p := startServe(t, "usher", func(listen string) string {
		return serveConfig(listen, dir, urls, "  shutdown_settle: 3s\n  shutdown_grace: 20s\n", "", "")
	})
	keepAlive := &http.Client{}
	first := startStream(t, keepAlive, p.url, apiKey, 400)

	p.signal(syscall.SIGTERM)
	term := time.Now()
	eventually(t, settle, "/readyz answers 503", func() bool {
		resp, err := freshClient().Get(p.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})

	// Settle: a new connection is accepted and its request served.
	resp, body, err := post(freshClient(), p.url, apiKey)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("new request during the settle time: %v %v %s, want 200", err, resp, body)
	}
	// Both workers busy with a stream (max_concurrency 1): the next request waits in the queue,
	// and is answered 503 with Retry-After when the settle time ends.
	second := startStream(t, freshClient(), p.url, apiKey, 400)
	resp, body, err = post(freshClient(), p.url, apiKey)
	waited := time.Since(term)
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("request queued during the settle time: %v %v %s, want 503 with Retry-After", err, resp, body)
	}
	if !strings.Contains(body, "shutting_down") || waited < settle-100*time.Millisecond {
		t.Fatalf("queued request answered after %v with %s, want shutting_down after the %v settle time", waited, body, settle)
	}

	// After the settle time: no new request is served.
	if resp, _, err := post(freshClient(), p.url, apiKey); err == nil && resp.StatusCode == http.StatusOK {
		t.Fatalf("a request after the settle time was served: %d", resp.StatusCode)
	}
	for name, ch := range map[string]<-chan streamResult{"stream before SIGTERM": first, "stream during settle": second} {
		r := <-ch
		if r.err != nil || r.status != http.StatusOK || !r.done {
			t.Fatalf("%s: status %d, [DONE] %v, err %v; want it run to completion", name, r.status, r.done, r.err)
		}
	}
	if code := p.exitCode(20 * time.Second); code != 0 {
		t.Fatalf("exit code: got %d, want 0", code)
	}
	t.Logf("stopped %v after SIGTERM (settle %v)", time.Since(term).Round(time.Millisecond), settle)
}

func TestSecondSignalStopsAtOnce(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model = model
	_, srv := simtest.Start(t, cfg)
	dir := t.TempDir()
	p := startServe(t, "usher", func(listen string) string {
		return serveConfig(listen, dir, []string{srv.URL}, "  shutdown_settle: 1m\n", "", "")
	})
	p.signal(syscall.SIGTERM)
	p.waitLog("shutting down: not ready", 5*time.Second)
	p.signal(syscall.SIGINT)
	if code := p.exitCode(5 * time.Second); code == 0 {
		t.Fatalf("exit code after a second signal: got 0, want the signal's")
	}
}
