package bench

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// mooncakeBlockTokens is the number of prompt tokens each Mooncake hash id names.
const mooncakeBlockTokens = 512

// saltAzureText keeps the Azure replay's texts apart from the random workload's.
const saltAzureText = 0x617a757265747874

// Trace kinds, chosen by the file's extension.
const (
	traceMooncake = "mooncake"
	traceAzure    = "azure"
)

func traceKind(file string) string {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".jsonl":
		return traceMooncake
	case ".csv":
		return traceAzure
	}
	return ""
}

// MooncakeRow is one line of a Mooncake trace.
type MooncakeRow struct {
	// Timestamp is the arrival in milliseconds from the start of the trace.
	Timestamp int64 `json:"timestamp"`
	// InputLength and OutputLength are token counts.
	InputLength  int `json:"input_length"`
	OutputLength int `json:"output_length"`
	// HashIDs name the prompt's 512-token blocks in order; equal leading ids mean a shared
	// prefix.
	HashIDs []int64 `json:"hash_ids"`
}

// ParseMooncakeLine parses and checks one JSON line of a Mooncake trace.
func ParseMooncakeLine(line []byte) (MooncakeRow, error) {
	var r MooncakeRow
	if err := json.Unmarshal(line, &r); err != nil {
		return MooncakeRow{}, fmt.Errorf("mooncake line: %w", err)
	}
	switch {
	case r.Timestamp < 0:
		return MooncakeRow{}, fmt.Errorf("mooncake line: timestamp %d is negative", r.Timestamp)
	case r.InputLength < 1:
		return MooncakeRow{}, fmt.Errorf("mooncake line: input_length %d is not positive", r.InputLength)
	case r.OutputLength < 0:
		return MooncakeRow{}, fmt.Errorf("mooncake line: output_length %d is negative", r.OutputLength)
	case len(r.HashIDs) == 0:
		return MooncakeRow{}, errors.New("mooncake line: hash_ids is empty")
	case r.InputLength > len(r.HashIDs)*mooncakeBlockTokens:
		return MooncakeRow{}, fmt.Errorf("mooncake line: input_length %d exceeds %d blocks of %d tokens",
			r.InputLength, len(r.HashIDs), mooncakeBlockTokens)
	}
	return r, nil
}

// azureTimeLayout is the Azure trace's TIMESTAMP format, with up to 7 fractional digits.
const azureTimeLayout = "2006-01-02 15:04:05.999999999"

// AzureRow is one record of the Azure LLM inference trace.
type AzureRow struct {
	Time            time.Time
	ContextTokens   int
	GeneratedTokens int
}

// ParseAzureRecord parses one CSV record (TIMESTAMP, ContextTokens, GeneratedTokens).
func ParseAzureRecord(rec []string) (AzureRow, error) {
	if len(rec) != 3 {
		return AzureRow{}, fmt.Errorf("azure record: got %d fields, want 3", len(rec))
	}
	t, err := time.Parse(azureTimeLayout, strings.TrimSpace(rec[0]))
	if err != nil {
		return AzureRow{}, fmt.Errorf("azure record: TIMESTAMP: %w", err)
	}
	in, err := strconv.Atoi(strings.TrimSpace(rec[1]))
	if err != nil || in < 1 {
		return AzureRow{}, fmt.Errorf("azure record: ContextTokens %q is not a positive integer", rec[1])
	}
	out, err := strconv.Atoi(strings.TrimSpace(rec[2]))
	if err != nil || out < 0 {
		return AzureRow{}, fmt.Errorf("azure record: GeneratedTokens %q is not a non-negative integer", rec[2])
	}
	return AzureRow{Time: t, ContextTokens: in, GeneratedTokens: out}, nil
}

// traceRow is a row of either trace, unscaled.
type traceRow struct {
	at      time.Duration
	in, out int
	hashIDs []int64 // nil for traces without contents
}

// Trace replays the rows of a trace file in time order. Mooncake prompts are built from their
// hash ids so that shared block prefixes become shared text prefixes; Azure prompts are random
// text that shares nothing. A conversation of Mooncake (same second block) is one session.
type Trace struct {
	cfg   TraceConfig
	seed  uint64
	rows  []traceRow
	block int // words per Mooncake block after token scaling
	next  int
}

var _ Workload = (*Trace)(nil)

// traceSources says where the whole traces come from: they are not in the repository.
const traceSources = "the full traces are not in the repository: on the project's machines they sit in " +
	"../shared/traces; elsewhere download conversation_trace.jsonl from github.com/kvcache-ai/Mooncake " +
	"(FAST25-release/traces) or AzureLLMInferenceTrace_conv.csv from github.com/Azure/AzurePublicDataset (data/); " +
	"300-row excerpts are in test/bench/testdata"

// OpenTrace reads cfg.File (at most cfg.Limit rows when set) whole. cfg.TimeScale and
// cfg.TokenScale must be set (see Config defaults).
func OpenTrace(cfg TraceConfig, seed uint64) (*Trace, error) {
	f, err := os.Open(cfg.File)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("open trace: %w (%s)", err, traceSources)
	}
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	var rows []traceRow
	switch traceKind(cfg.File) {
	case traceMooncake:
		rows, err = readMooncake(f, cfg.Limit)
	case traceAzure:
		rows, err = readAzure(f, cfg.Limit)
	default:
		err = errors.New("unknown extension, want .jsonl or .csv")
	}
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", cfg.File, err)
	}
	return newTrace(cfg, seed, rows), nil
}

func newTrace(cfg TraceConfig, seed uint64, rows []traceRow) *Trace {
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].at < rows[j].at })
	return &Trace{
		cfg:   cfg,
		seed:  seed,
		rows:  rows,
		block: max(1, int(mooncakeBlockTokens/cfg.TokenScale)),
	}
}

func readMooncake(r io.Reader, limit int) ([]traceRow, error) {
	var rows []traceRow
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 16<<20)
	for n := 1; sc.Scan() && (limit == 0 || len(rows) < limit); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		m, err := ParseMooncakeLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, traceRow{
			at:      time.Duration(m.Timestamp) * time.Millisecond,
			in:      m.InputLength,
			out:     m.OutputLength,
			hashIDs: m.HashIDs,
		})
	}
	return rows, sc.Err()
}

func readAzure(r io.Reader, limit int) ([]traceRow, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("header: %w", err)
	}
	if len(head) != 3 || !strings.EqualFold(strings.TrimSpace(strings.TrimPrefix(head[0], "\ufeff")), "TIMESTAMP") {
		return nil, fmt.Errorf("header %q: want TIMESTAMP,ContextTokens,GeneratedTokens", head)
	}
	var rows []traceRow
	var first time.Time
	for n := 2; limit == 0 || len(rows) < limit; n++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		a, err := ParseAzureRecord(rec)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(rows) == 0 || a.Time.Before(first) {
			first = a.Time
		}
		rows = append(rows, traceRow{at: time.Duration(a.Time.UnixNano()), in: a.ContextTokens, out: a.GeneratedTokens})
	}
	for i := range rows {
		rows[i].at -= time.Duration(first.UnixNano())
	}
	return rows, nil
}

// Len is the number of rows replayed.
func (w *Trace) Len() int { return len(w.rows) }

// Next builds the next row's request; false after the last row.
func (w *Trace) Next() (Item, bool) {
	if w.next >= len(w.rows) {
		return Item{}, false
	}
	i := w.next
	w.next++
	row := w.rows[i]
	in := scaleTokens(row.in, w.cfg.TokenScale)
	var b strings.Builder
	it := Item{
		MaxTokens: scaleTokens(row.out, w.cfg.TokenScale),
		At:        time.Duration(float64(row.at) / w.cfg.TimeScale),
	}
	if row.hashIDs == nil {
		words(&b, seeded(w.seed^saltAzureText, uint64(i)), in)
	} else {
		in = min(in, len(row.hashIDs)*w.block)
		MooncakePrompt(&b, row.hashIDs, w.block, in)
		if len(row.hashIDs) > 1 {
			it.Session = fmt.Sprintf("mc-%d", row.hashIDs[1])
		}
	}
	it.Prompt = b.String()
	it.PromptWords = in
	return it, true
}

// Timed is true: items carry the trace's (scaled) arrival times.
func (w *Trace) Timed() bool { return true }

// MooncakePrompt writes the prompt of a Mooncake request: block id h is blockWords words from a
// PRNG seeded with h, the blocks are concatenated in order and the text is cut to n words. Two
// calls with the same leading ids therefore write the same leading text. Cost: O(n).
func MooncakePrompt(b *strings.Builder, hashIDs []int64, blockWords, n int) {
	for _, h := range hashIDs {
		if n <= 0 {
			return
		}
		k := min(blockWords, n)
		words(b, seeded(uint64(h), saltMooncakeBlock), k)
		n -= k
	}
}

// scaleTokens divides n by scale, rounding, never below 1.
func scaleTokens(n int, scale float64) int {
	return max(1, int(math.Round(float64(n)/scale)))
}
