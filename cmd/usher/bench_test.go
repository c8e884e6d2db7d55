package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/usherllm/usher/test/bench"
)

func benchEngine(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Usher-Worker", "w1")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":1}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func benchClosedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/v1"
}

func TestBenchMain(t *testing.T) {
	url := benchEngine(t)
	out := filepath.Join(t.TempDir(), "report.json")
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"unknown flag", []string{"--bogus"}, 2, "", "flag provided but not defined: -bogus"},
		{"bad tenant", []string{"--tenant", "nokey"}, 2, "", "want name=KEY"},
		{"invalid config", []string{"--model", "m", "--requests", "1"}, 2, "", "bench.url: must be an absolute http(s) URL"},
		{"stray argument", []string{"--url", url, "--model", "m", "--requests", "1", "extra"}, 2, "", "unexpected arguments"},
		{"run", []string{"--url", url, "--model", "m", "--requests", "5", "--rate", "inf", "--out", out,
			"--tenant", "a=k1:1:interactive", "--tenant", "b=k2:1:batch", "--quiet"}, 0, "tenant a", ""},
		{"all failed", []string{"--url", benchClosedPort(t), "--model", "m", "--requests", "2", "--quiet"}, 1, "overall", "all 2 requests failed"},
		{"help", []string{"-h"}, 0, "", "usage: usher bench"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := benchMain(context.Background(), tc.args, &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("exit code: got %d, want %d (stderr: %s)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout: got %q, want it to contain %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr: got %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}

	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	if rep.Overall.OK != 5 || len(rep.Tenants) != 2 || rep.Workers[0].Worker != "w1" {
		t.Errorf("JSON report: got ok %d, %d tenants, workers %+v; want 5, 2, w1", rep.Overall.OK, len(rep.Tenants), rep.Workers)
	}
}
