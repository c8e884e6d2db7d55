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
	t.Setenv("OPENAI_BASE_URL", "")
	t.Setenv("OPENAI_API_KEY", "")
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

// TestBenchTakesOpenAIEnvironment: without --url and --api-key, the bench targets
// $OPENAI_BASE_URL with $OPENAI_API_KEY, as OpenAI's clients do; -h never shows the key.
func TestBenchTakesOpenAIEnvironment(t *testing.T) {
	auth := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth <- r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	t.Setenv("OPENAI_BASE_URL", srv.URL+"/v1")
	t.Setenv("OPENAI_API_KEY", "sk-from-the-environment")
	var stdout, stderr bytes.Buffer
	if code := benchMain(context.Background(), []string{"--model", "m", "--requests", "2", "--rate", "inf", "--quiet"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	for range 2 {
		if got := <-auth; got != "Bearer sk-from-the-environment" {
			t.Errorf("Authorization: got %q, want the key of OPENAI_API_KEY", got)
		}
	}
	stderr.Reset()
	benchMain(context.Background(), []string{"-h"}, &stdout, &stderr)
	if strings.Contains(stderr.String(), "sk-from-the-environment") {
		t.Errorf("-h shows the key of the environment:\n%s", stderr.String())
	}
}

// TestBenchHTMLReports: --html writes the page of a run, and `usher bench report` the page of
// several JSON reports side by side (the page itself is checked in a browser in test/bench).
func TestBenchHTMLReports(t *testing.T) {
	t.Setenv("OPENAI_BASE_URL", "")
	dir := t.TempDir()
	js, page, both := filepath.Join(dir, "a.json"), filepath.Join(dir, "a.html"), filepath.Join(dir, "both.html")
	var stdout, stderr bytes.Buffer
	args := []string{"--url", benchEngine(t), "--model", "m", "--requests", "4", "--rate", "inf", "--quiet", "--out", js, "--html", page, "--name", "first"}
	if code := benchMain(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("run: exit code %d: %s", code, stderr.String())
	}
	if code := benchMain(context.Background(), []string{"report", "--html", both, "least_request=" + js, js}, &stdout, &stderr); code != 0 {
		t.Fatalf("report: exit code %d: %s", code, stderr.String())
	}
	for path, names := range map[string][]string{page: {"first"}, both: {"least_request", ">a<"}} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range append(names, "<svg", "usher bench report") {
			if !strings.Contains(string(data), want) {
				t.Errorf("%s lacks %q", filepath.Base(path), want)
			}
		}
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"report", js}, 2, "need --html FILE"},
		{[]string{"report", "--html", both}, 2, "need --html FILE"},
		{[]string{"report", "--html", both, filepath.Join(dir, "missing.json")}, 1, "missing.json"},
		{[]string{"report", "--html", both, page}, 1, "is not a JSON report"},
		{[]string{"report", "-h"}, 0, "usage: usher bench report"},
	} {
		stderr.Reset()
		if code := benchMain(context.Background(), tc.args, &stdout, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: got %d %q, want %d and %q", tc.args, code, stderr.String(), tc.code, tc.want)
		}
	}
}
