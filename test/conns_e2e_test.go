package test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A flood of slowloris and slow-body connections from one address, more than the gateway has
// file descriptors for, does not keep another client out (issue 10, item 4: ~20,000 connections
// trickling their bodies hit the fd limit, `accept4: too many open files`, and real requests timed
// out). usher runs with 300 descriptors and timeouts far longer than the test, so only the
// connection bounds protect: before them, the flood took every descriptor and the other client's
// request waited in the accept queue until its timeout.
func TestServeKeepsServingBesideASlowClientFlood(t *testing.T) {
	for _, tt := range []struct {
		name      string
		perClient string // server.max_connections_per_client; "" the default
		held      int    // the flood's connections the gateway keeps
	}{
		{"the global bound, from the fd limit", "", 75},
		{"the per-client bound", "50", 50},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			p := startServeCommand(t, "slow flood", func(listen string) string {
				cfg := "server:\n  listen: " + listen + "\n  read_header_timeout: 10m\n  read_timeout: 10m\n"
				if tt.perClient != "" {
					cfg += "  max_connections_per_client: " + tt.perClient + "\n"
				}
				return cfg + "routing:\n  workers:\n    - {id: w1, url: \"http://127.0.0.1:9\", models: [m]}\n" +
					"database:\n  url: sqlite:" + filepath.Join(dir, "usher.db") + "\n"
			}, func(bin, configPath string) *exec.Cmd {
				return exec.Command("sh", "-c", `ulimit -n 300 && exec "$0" serve --config "$1"`, bin, configPath)
			})
			p.waitLog("max_connections=75", 20*time.Second)

			const flood = 400 // half slowloris, half slow bodies, all from 127.0.0.2
			addr := strings.TrimPrefix(p.url, "http://")
			dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
			closed := make(chan string, flood) // what each ended connection read
			for i := range flood {
				c, err := dialer.Dial("tcp", addr)
				if err != nil {
					t.Fatalf("flood connection %d: %v", i, err)
				}
				t.Cleanup(func() { c.Close() })
				if i%2 == 0 {
					fmt.Fprint(c, "GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
				} else {
					fmt.Fprint(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{")
				}
				go func() {
					read, _ := io.ReadAll(c) // to the gateway's close
					closed <- string(read)
				}()
			}
			for i := range flood - tt.held {
				select {
				case read := <-closed:
					// Refused: answered (429 per client, 503 at the global bound) or, past the
					// refusals being answered at once, closed unanswered.
					if read != "" && !strings.HasPrefix(read, "HTTP/1.1 429 ") && !strings.HasPrefix(read, "HTTP/1.1 503 ") {
						t.Errorf("a refused connection read %q", read)
					}
				case <-time.After(60 * time.Second):
					t.Fatalf("60s on, %d of the flood's %d connections beyond the bounds were closed", i, flood-tt.held)
				}
			}

			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
			for i := range 5 { // a fresh connection each, as new clients come
				resp, err := client.Get(p.url + "/v1/models")
				if err != nil {
					t.Fatalf("another client's request %d beside the flood: %v", i, err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("another client's request %d: got %d, want 401 (it reached the gateway)", i, resp.StatusCode)
				}
			}
			if strings.Contains(p.log.String(), "too many open files") {
				t.Errorf("the gateway ran out of file descriptors:\n%s", p.log.String())
			}
		})
	}
}
