package test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"
)

func TestSIGHUPReloadsTiersAndWorkersWithoutDroppingRequests(t *testing.T) {
	var urls []string
	for range 2 {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.TimeScale = model, 1
		_, srv := simtest.Start(t, cfg)
		urls = append(urls, srv.URL)
	}
	dir := t.TempDir()
	admin := "admin: {token: " + e2eAdminToken + "}\n"
	server := "  shutdown_settle: 100ms\n"
	var listen string
	p := startServe(t, "usher", func(l string) string {
		listen = l
		return serveConfig(l, dir, []string{urls[0], ""}, server, ", requests_per_minute: 100", admin)
	})
	check := func(step, wantWorker, wantLimit string) {
		t.Helper()
		resp, body, err := post(freshClient(), p.url, apiKey)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %v %v %s, want 200", step, err, resp, body)
		}
		if w, l := resp.Header.Get("X-Usher-Worker"), resp.Header.Get("x-ratelimit-limit-requests"); w != wantWorker || l != wantLimit {
			t.Fatalf("%s: served by %q with a limit of %q requests, want %q and %q", step, w, l, wantWorker, wantLimit)
		}
	}
	check("before the reload", "sim-0", "100")
	stream := startStream(t, &http.Client{}, p.url, apiKey, 150)

	// sim-0 leaves the file, sim-1 joins, the tier's rate goes up.
	p.writeConfig(serveConfig(listen, dir, []string{"", urls[1]}, server, ", requests_per_minute: 1000", admin))
	p.signal(syscall.SIGHUP)
	p.waitLog("config reloaded", 5*time.Second)
	check("after the reload", "sim-1", "1000")
	if r := <-stream; r.err != nil || r.status != http.StatusOK || !r.done || r.worker != "sim-0" {
		t.Fatalf("stream on the removed worker: %+v, want it run to completion on sim-0", r)
	}
	eventually(t, 2*time.Second, "sim-0 removed once its stream ended", func() bool {
		req, _ := http.NewRequest(http.MethodGet, p.url+"/admin/api/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var list struct{ Workers []workerStatus }
		if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
			return false
		}
		return len(list.Workers) == 1 && list.Workers[0].ID == "sim-1"
	})

	// A file that does not validate is refused; the running configuration stays.
	p.writeConfig(serveConfig(listen, dir, []string{urls[0], ""}, server, ", requests_per_minute: -5", admin))
	p.signal(syscall.SIGHUP)
	p.waitLog("config reload refused", 5*time.Second)
	p.waitLog("requests_per_minute", time.Second)
	check("after a refused reload", "sim-1", "1000")

	p.signal(syscall.SIGTERM)
	if code := p.exitCode(10 * time.Second); code != 0 {
		t.Fatalf("exit code: got %d, want 0", code)
	}
}

func TestWorkersFoundByDNS(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 0.1
	_, srv := simtest.Start(t, cfg)
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(srv.URL, "http://"))
	dir := t.TempDir()
	p := startServe(t, "usher", func(listen string) string {
		// No static worker: localhost resolves to the simulated worker's loopback address
		// (and to ::1 on some machines, where nothing listens: that worker fails its health
		// checks and takes no requests).
		discovery := fmt.Sprintf("routing:\n  discovery:\n    - {name: localhost, port: %s, models: [%s], interval: 200ms}\n", port, model)
		return strings.Replace(serveConfig(listen, dir, nil, "  shutdown_settle: 100ms\n", "", ""), "routing:\n", discovery, 1)
	})
	want := "localhost-" + port + "-127.0.0.1"
	eventually(t, 5*time.Second, "a request served by the worker found by DNS", func() bool {
		resp, _, err := post(freshClient(), p.url, apiKey)
		return err == nil && resp.StatusCode == http.StatusOK && resp.Header.Get("X-Usher-Worker") == want
	})
}
