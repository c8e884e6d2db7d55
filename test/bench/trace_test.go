package bench_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/usherllm/usher/test/bench"
)

func openTrace(t *testing.T, cfg bench.TraceConfig) *bench.Trace {
	t.Helper()
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TokenScale == 0 {
		cfg.TokenScale = 1
	}
	tr, err := bench.OpenTrace(cfg, 1)
	if err != nil {
		t.Fatalf("OpenTrace(%s): %v", cfg.File, err)
	}
	return tr
}

func drain(w bench.Workload) []bench.Item {
	var items []bench.Item
	for {
		it, ok := w.Next()
		if !ok {
			return items
		}
		items = append(items, it)
	}
}

func commonWords(a, b string) int {
	wa, wb := strings.Fields(a), strings.Fields(b)
	n := 0
	for n < len(wa) && n < len(wb) && wa[n] == wb[n] {
		n++
	}
	return n
}

func TestOpenTraceMooncake(t *testing.T) {
	tests := []struct {
		name       string
		timeScale  float64
		tokenScale float64
		limit      int
		wantAt     []time.Duration
		wantWords  []int
		wantMax    []int
	}{
		{
			name: "as recorded", timeScale: 1, tokenScale: 1,
			wantAt:    []time.Duration{0, 200 * time.Millisecond, 500 * time.Millisecond, time.Second, 3 * time.Second},
			wantWords: []int{1200, 700, 1500, 512, 2000},
			wantMax:   []int{40, 20, 30, 10, 100},
		},
		{
			name: "ten times faster, one eighth of the tokens", timeScale: 10, tokenScale: 8,
			wantAt:    []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 300 * time.Millisecond},
			wantWords: []int{150, 88, 188, 64, 250},
			wantMax:   []int{5, 3, 4, 1, 13},
		},
		{
			name: "first three rows", timeScale: 1, tokenScale: 1, limit: 3,
			wantAt:    []time.Duration{0, 200 * time.Millisecond, 500 * time.Millisecond},
			wantWords: []int{1200, 700, 1500},
			wantMax:   []int{40, 20, 30},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := openTrace(t, bench.TraceConfig{File: "testdata/mooncake.jsonl", TimeScale: tc.timeScale, TokenScale: tc.tokenScale, Limit: tc.limit})
			if !tr.Timed() {
				t.Error("Timed: got false, want true")
			}
			items := drain(tr)
			var at []time.Duration
			var wordsN, maxT []int
			for _, it := range items {
				at = append(at, it.At)
				wordsN = append(wordsN, len(strings.Fields(it.Prompt)))
				maxT = append(maxT, it.MaxTokens)
				if it.PromptWords != len(strings.Fields(it.Prompt)) {
					t.Errorf("PromptWords: got %d, want %d", it.PromptWords, len(strings.Fields(it.Prompt)))
				}
			}
			if !reflect.DeepEqual(at, tc.wantAt) {
				t.Errorf("arrivals: got %v, want %v", at, tc.wantAt)
			}
			if !reflect.DeepEqual(wordsN, tc.wantWords) {
				t.Errorf("prompt words: got %v, want %v", wordsN, tc.wantWords)
			}
			if !reflect.DeepEqual(maxT, tc.wantMax) {
				t.Errorf("max tokens: got %v, want %v", maxT, tc.wantMax)
			}
		})
	}
}

func TestMooncakePromptsSharePrefixes(t *testing.T) {
	for _, scale := range []float64{1, 8} {
		block := int(512 / scale)
		tr := openTrace(t, bench.TraceConfig{File: "testdata/mooncake.jsonl", TokenScale: scale})
		items := drain(tr)
		// In time order: [0 1 2], [0 4], [0 1 2 3], [0], [0 4 5 6].
		first, second, third, fourth, fifth := items[0], items[1], items[2], items[3], items[4]
		if !strings.HasPrefix(third.Prompt, first.Prompt) {
			t.Errorf("scale %v: a later turn ([0 1 2 3]) does not extend the earlier one ([0 1 2])", scale)
		}
		if got := commonWords(first.Prompt, second.Prompt); got < block || got > block+3 {
			t.Errorf("scale %v: [0 1 2] and [0 4] share %d words, want the %d of block 0", scale, got, block)
		}
		if !strings.HasPrefix(fifth.Prompt, second.Prompt) {
			t.Errorf("scale %v: [0 4 5 6] does not extend [0 4]", scale)
		}
		if fourth.Prompt != strings.Join(strings.Fields(first.Prompt)[:block], " ") {
			t.Errorf("scale %v: [0] alone is not block 0 of the others", scale)
		}
		if first.Session != "mc-1" || third.Session != "mc-1" || second.Session != "mc-4" || fourth.Session != "" {
			t.Errorf("scale %v: sessions got %q %q %q %q, want mc-1 mc-1 mc-4 and none",
				scale, first.Session, third.Session, second.Session, fourth.Session)
		}
	}
	again := drain(openTrace(t, bench.TraceConfig{File: "testdata/mooncake.jsonl"}))
	once := drain(openTrace(t, bench.TraceConfig{File: "testdata/mooncake.jsonl"}))
	if !reflect.DeepEqual(again, once) {
		t.Error("two replays of the same trace differ")
	}
}

func TestMooncakePromptIsDeterministicPerBlock(t *testing.T) {
	var a, b strings.Builder
	bench.MooncakePrompt(&a, []int64{7, 9}, 512, 1024)
	bench.MooncakePrompt(&b, []int64{7}, 512, 512)
	if !strings.HasPrefix(a.String(), b.String()+" ") {
		t.Error("block 7 alone is not the head of blocks 7, 9")
	}
	if n := len(strings.Fields(a.String())); n != 1024 {
		t.Errorf("words: got %d, want 1024", n)
	}
}

func TestOpenTraceAzure(t *testing.T) {
	tr := openTrace(t, bench.TraceConfig{File: "testdata/azure.csv", TimeScale: 10, TokenScale: 2})
	items := drain(tr)
	wantAt := []time.Duration{0, 50 * time.Millisecond, 400 * time.Millisecond, time.Second}
	wantWords := []int{187, 200, 40, 500}
	wantMax := []int{22, 50, 4, 8}
	for i, it := range items {
		if it.At != wantAt[i] || it.PromptWords != wantWords[i] || len(strings.Fields(it.Prompt)) != wantWords[i] || it.MaxTokens != wantMax[i] {
			t.Errorf("row %d: got at %v words %d/%d max %d, want %v %d %d", i, it.At, it.PromptWords,
				len(strings.Fields(it.Prompt)), it.MaxTokens, wantAt[i], wantWords[i], wantMax[i])
		}
		for j := 0; j < i; j++ {
			if commonWords(it.Prompt, items[j].Prompt) > 8 {
				t.Errorf("rows %d and %d share a prefix; Azure rows carry no contents to share", j, i)
			}
		}
	}
	if len(items) != 4 {
		t.Errorf("rows: got %d, want 4", len(items))
	}
}

func TestOpenTraceErrors(t *testing.T) {
	tests := []struct {
		file, want string
	}{
		{"testdata/missing.jsonl", "no such file or directory (the full traces are not in the repository"},
		{"testdata/mooncake_too_long.jsonl", "line 2: mooncake line: input_length 600 exceeds 1 blocks"},
		{"testdata/azure_bad_tokens.csv", `line 3: azure record: ContextTokens "x"`},
		{"testdata/azure_bad_header.csv", "want TIMESTAMP,ContextTokens,GeneratedTokens"},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			_, err := bench.OpenTrace(bench.TraceConfig{File: tc.file, TimeScale: 1, TokenScale: 1}, 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParseMooncakeLine(t *testing.T) {
	tests := []struct {
		name, line, wantErr string
		want                bench.MooncakeRow
	}{
		{name: "ok", line: `{"timestamp": 27, "input_length": 513, "output_length": 5, "hash_ids": [0, 9]}`,
			want: bench.MooncakeRow{Timestamp: 27, InputLength: 513, OutputLength: 5, HashIDs: []int64{0, 9}}},
		{name: "not json", line: `{"timestamp": `, wantErr: "mooncake line"},
		{name: "negative time", line: `{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}`, wantErr: "timestamp -1"},
		{name: "no input", line: `{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}`, wantErr: "input_length 0"},
		{name: "no blocks", line: `{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": []}`, wantErr: "hash_ids is empty"},
		{name: "negative output", line: `{"timestamp": 0, "input_length": 3, "output_length": -2, "hash_ids": [1]}`, wantErr: "output_length -2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bench.ParseMooncakeLine([]byte(tc.line))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func FuzzParseMooncakeLine(f *testing.F) {
	data, err := os.ReadFile("testdata/mooncake.jsonl")
	if err != nil {
		f.Fatal(err)
	}
	for _, line := range bytes.Split(data, []byte("\n")) {
		f.Add(line)
	}
	f.Add([]byte(`{"timestamp": 1e3, "input_length": 1, "output_length": 0, "hash_ids": [-1]}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		row, err := bench.ParseMooncakeLine(line)
		if err != nil {
			return
		}
		if row.Timestamp < 0 || row.InputLength < 1 || row.OutputLength < 0 || len(row.HashIDs) == 0 ||
			row.InputLength > 512*len(row.HashIDs) {
			t.Fatalf("accepted an invalid row %+v from %q", row, line)
		}
		again, err := json.Marshal(row)
		if err != nil {
			t.Fatal(err)
		}
		back, err := bench.ParseMooncakeLine(again)
		if err != nil || !reflect.DeepEqual(back, row) {
			t.Fatalf("re-encoded row %s parsed as %+v, %v; want %+v", again, back, err, row)
		}
	})
}

func FuzzParseAzureRecord(f *testing.F) {
	f.Add("2023-11-16 18:15:46.6805900,374,44")
	f.Add("2023-11-16 18:15:46,1,0")
	f.Fuzz(func(t *testing.T, line string) {
		row, err := bench.ParseAzureRecord(strings.Split(line, ","))
		if err != nil {
			return
		}
		if row.ContextTokens < 1 || row.GeneratedTokens < 0 || row.Time.IsZero() {
			t.Fatalf("accepted an invalid record %+v from %q", row, line)
		}
	})
}

// Excerpts of the real traces kept in testdata (source and licence in testdata/README.md).
const (
	mooncakeExcerpt = "testdata/mooncake_conversation_300.jsonl"
	azureExcerpt    = "testdata/azure_conv_2023_300.csv"
)

func TestReplayRealTraces(t *testing.T) {
	tests := []struct {
		file     string
		wantRows int
	}{
		{mooncakeExcerpt, 300},
		{azureExcerpt, 300},
	}
	for _, tc := range tests {
		t.Run(filepath.Base(tc.file), func(t *testing.T) {
			tr := openTrace(t, bench.TraceConfig{File: tc.file, TimeScale: 10, TokenScale: 8})
			if tr.Len() != tc.wantRows {
				t.Errorf("rows: got %d, want %d", tr.Len(), tc.wantRows)
			}
			a, _ := tr.Next()
			b, _ := tr.Next()
			if a.At != 0 || b.At < a.At {
				t.Errorf("arrivals: got %v then %v, want 0 then later", a.At, b.At)
			}
		})
	}
	// Every Mooncake request starts with block 0: the first two share at least its 64 words
	// at token scale 8.
	tr := openTrace(t, bench.TraceConfig{File: mooncakeExcerpt, TokenScale: 8, Limit: 2})
	items := drain(tr)
	if got := commonWords(items[0].Prompt, items[1].Prompt); got < 64 {
		t.Errorf("first two Mooncake requests share %d words, want at least 64", got)
	}
}

func TestRunReplaysMooncakeTrace(t *testing.T) {
	e := &fakeEngine{tokens: 2}
	srv := e.start(t)
	cfg := smallRandom(srv.URL, 0)
	cfg.Workload = bench.WorkloadTrace
	cfg.Trace = bench.TraceConfig{File: mooncakeExcerpt, TimeScale: 200, TokenScale: 8, Limit: 150}
	rep := run(t, cfg)
	if rep.Overall.Sent != 150 || rep.Overall.OK != 150 {
		t.Fatalf("got sent %d ok %d, want 150 and 150", rep.Overall.Sent, rep.Overall.OK)
	}
	// Every request starts with block 0, so every prompt begins with the same 64 words.
	reqs := e.requests()
	head := strings.Join(strings.Fields(reqs[0].promptText())[:64], " ")
	sessions := map[string]int{}
	for _, r := range reqs {
		if !strings.HasPrefix(r.promptText(), head) {
			t.Fatal("a request does not start with block 0")
		}
		sessions[r.header.Get("X-Session-ID")]++
	}
	repeated := 0
	for _, n := range sessions {
		if n > 1 {
			repeated++
		}
	}
	if repeated == 0 {
		t.Error("no conversation has two turns in the first 150 requests")
	}
}

// BenchmarkOpenRealTraces loads the whole Mooncake and Azure traces and builds every prompt, at
// token scale 8. The files are not in the repository: it reads them from $USHER_TRACES_DIR, or
// else from ../shared/traces beside the project's main checkout, and skips, saying where it
// looked on stderr, when they are absent (in a user's clone).
func BenchmarkOpenRealTraces(b *testing.B) {
	dir := fullTraces(b)
	tests := []struct {
		file     string
		wantRows int
	}{
		{"mooncake_conversation.jsonl", 12031},
		{"azure_conv_2023.csv", 19366},
	}
	for _, tc := range tests {
		b.Run(tc.file, func(b *testing.B) {
			cfg := bench.TraceConfig{File: filepath.Join(dir, tc.file), TimeScale: 1, TokenScale: 8}
			for b.Loop() {
				tr, err := bench.OpenTrace(cfg, 1)
				if err != nil {
					b.Fatal(err)
				}
				if n := len(drain(tr)); n != tc.wantRows {
					b.Fatalf("rows: got %d, want %d", n, tc.wantRows)
				}
			}
			b.ReportMetric(float64(tc.wantRows), "rows/op")
		})
	}
}

// fullTraces is the folder of the whole trace files: $USHER_TRACES_DIR, or else ../shared/traces
// beside the repository's main checkout (in a git worktree the main checkout is the parent of
// the common .git directory). It skips b when the folder is absent.
func fullTraces(b *testing.B) string {
	b.Helper()
	dir := os.Getenv("USHER_TRACES_DIR")
	if dir == "" {
		out, err := exec.Command("git", "rev-parse", "--path-format=absolute", "--git-common-dir").Output()
		if err != nil {
			b.Skipf("full traces: USHER_TRACES_DIR is unset and git cannot find the repository: %v", err)
		}
		dir = filepath.Join(filepath.Dir(filepath.Dir(strings.TrimSpace(string(out)))), "shared", "traces")
	}
	if _, err := os.Stat(dir); err != nil {
		// On stderr too: go test shows a skipped benchmark's log only with -v.
		msg := fmt.Sprintf("%s skipped: full traces absent (%v): they are not in the repository; set USHER_TRACES_DIR "+
			"to a folder holding mooncake_conversation.jsonl and azure_conv_2023.csv (sources in testdata/README.md)", b.Name(), err)
		fmt.Fprintln(os.Stderr, msg)
		b.Skip(msg)
	}
	return dir
}
