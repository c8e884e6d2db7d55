package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// bannerWriter collects the demo's banner and says when it is complete.
type bannerWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
	once sync.Once
}

func (w *bannerWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), "Ctrl-C stops everything.") {
		w.once.Do(func() { close(w.done) })
	}
	return len(p), nil
}

// TestDemoBannerBenchLine runs the last command of the demo's banner, its bench line, as a
// user pastes it (only shorter): the interactive tenant and the batch flood are both served,
// and no interactive request fails beside the flood.
func TestDemoBannerBenchLine(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	banner := &bannerWriter{done: make(chan struct{})}
	demoDone := make(chan error, 1)
	go func() {
		demoDone <- demo(ctx, "127.0.0.1:0", 3, 0, 0.05, slog.New(slog.NewTextHandler(io.Discard, nil)), banner)
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-demoDone; err != nil {
			t.Errorf("demo: %v", err)
		}
	})
	select {
	case <-banner.done:
	case err := <-demoDone:
		t.Fatalf("demo ended before its banner: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no banner within 30 s")
	}
	banner.mu.Lock()
	lines := strings.Split(strings.TrimSpace(banner.buf.String()), "\n")
	banner.mu.Unlock()
	if len(lines) < 2 || lines[len(lines)-1] != "Ctrl-C stops everything." {
		t.Fatalf("the banner ends with %q, want the bench line and then Ctrl-C", lines[len(lines)-1])
	}
	args := strings.Fields(lines[len(lines)-2])
	if len(args) < 2 || args[0] != os.Args[0] || args[1] != "bench" {
		t.Fatalf("the banner's last command is %q, want %q bench ...", lines[len(lines)-2], os.Args[0])
	}
	args = args[2:]
	if !slices.Contains(args, "--html") {
		t.Errorf("the bench line %q writes no HTML report", args)
	}
	// Shorter, and the reports in a temporary folder.
	dir := t.TempDir()
	for i := range args {
		switch args[i] {
		case "--duration":
			args[i+1] = "3s"
		case "--html":
			args[i+1] = filepath.Join(dir, "report.html")
		}
	}
	args = append(args, "--out", filepath.Join(dir, "report.json"), "--quiet")
	var stdout, stderr bytes.Buffer
	if code := benchMain(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("bench exited %d:\n%s%s", code, stdout.String(), stderr.String())
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Classes []struct {
			Name   string `json:"name"`
			OK     int    `json:"ok"`
			Failed int    `json:"failed"`
		} `json:"classes"`
	}
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	served := map[string]int{}
	for _, c := range rep.Classes {
		served[c.Name] = c.OK
		if c.Name == "interactive" && c.Failed > 0 {
			t.Errorf("interactive: %d requests failed beside the batch flood, want none", c.Failed)
		}
	}
	if served["interactive"] == 0 || served["batch"] == 0 {
		t.Errorf("served per class %v, want interactive and batch both served", served)
	}
	if _, err := os.Stat(filepath.Join(dir, "report.html")); err != nil {
		t.Errorf("the HTML report: %v", err)
	}
}

// The README's bench line is the banner's, with the keys and URL as the export lines name them.
func TestREADMEBenchLineIsTheBanners(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	const start = `bin/usher bench --url "$OPENAI_BASE_URL"`
	_, rest, ok := strings.Cut(string(readme), start)
	block, _, ok2 := strings.Cut(rest, "\n```")
	if !ok || !ok2 {
		t.Fatalf("README.md has no block starting %q", start)
	}
	got := strings.Fields(strings.NewReplacer("\\\n", " ", `"`, "").Replace(`--url "$OPENAI_BASE_URL"` + block))
	want := demoBenchArgs("$OPENAI_BASE_URL", demoKeys{Interactive: "$OPENAI_API_KEY", Batch: "$USHER_BATCH_KEY"})
	if flagPairs(got) != flagPairs(want) {
		t.Fatalf("the README's bench line has\n%s\nthe banner's has\n%s", flagPairs(got), flagPairs(want))
	}
}

// flagPairs lists "--flag value" pairs one a line, sorted, so two command lines that give the
// same flags in another order compare equal.
func flagPairs(args []string) string {
	var pairs []string
	for i := 0; i+1 < len(args); i += 2 {
		pairs = append(pairs, args[i]+" "+args[i+1])
	}
	slices.Sort(pairs)
	return strings.Join(pairs, "\n")
}
