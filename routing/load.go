package routing

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// LoadReport is what a worker last said about its own load on /metrics.
type LoadReport struct {
	Running int64   `json:"running"`  // sequences being generated
	Waiting int64   `json:"waiting"`  // requests queued inside the worker
	KVUsage float64 `json:"kv_usage"` // fraction of the KV cache in use, 0 to 1
	// KVTokens is the size of the engine's KV cache in tokens, as the engine states it (vLLM's
	// vllm:cache_config_info block_size x num_gpu_blocks, SGLang's sglang:max_total_num_tokens);
	// 0: not stated.
	KVTokens int64     `json:"kv_tokens,omitempty"`
	At       time.Time `json:"at,omitzero"` // when it was read; zero: never
}

// loadSignal holds the last LoadReport of a worker in atomics, so policies read it without a
// lock. The fields may come from two different scrapes for a moment; policies only weigh them.
type loadSignal struct {
	running  atomic.Int64
	waiting  atomic.Int64
	kvUsage  atomic.Uint64 // math.Float64bits
	kvTokens atomic.Int64
	at       atomic.Int64 // unix nanoseconds; 0: no reading yet
	// others is running + waiting minus this gateway's in-flight count at the same scrape: the
	// requests other gateway replicas (or other clients) have on the worker.
	others atomic.Int64
}

func (s *loadSignal) store(r LoadReport) {
	s.running.Store(r.Running)
	s.waiting.Store(r.Waiting)
	s.kvUsage.Store(math.Float64bits(r.KVUsage))
	s.kvTokens.Store(r.KVTokens)
	s.at.Store(r.At.UnixNano())
}

// Load is the worker's last LoadReport; At is zero while it has never answered a scrape.
func (w *Worker) Load() LoadReport {
	s := &w.load
	r := LoadReport{Running: s.running.Load(), Waiting: s.waiting.Load(), KVUsage: math.Float64frombits(s.kvUsage.Load()),
		KVTokens: s.kvTokens.Load()}
	if at := s.at.Load(); at != 0 {
		r.At = time.Unix(0, at)
	}
	return r
}

// ReportedQueue is the queue the worker reported at its last scrape, as of now: a reading older
// than maxAge counts as busy (MaxConcurrency waiting), since a worker too loaded to answer its
// scrape is likely too loaded to take work. A worker that has never answered a scrape reports 0
// and is judged by the gateway's own counts alone. Costs three atomic loads.
func (w *Worker) ReportedQueue(now time.Time, maxAge time.Duration) int64 {
	at := w.load.at.Load()
	if at == 0 {
		return 0
	}
	if now.UnixNano()-at > int64(maxAge) {
		return w.limit.Load()
	}
	return w.load.waiting.Load()
}

// OthersInFlight estimates the requests on the worker that this gateway did not send (other
// replicas' or other clients'): its reported running + waiting minus this gateway's in-flight
// count, both taken at the last scrape, never below 0. A reading older than maxAge, or none,
// gives 0: the worker is then judged by the gateway's own counts. Requests starting or ending
// around the scrape make the estimate a little off either way (one sent but not yet seen by the
// worker lowers it; one the worker still counts after the gateway released it raises it). Costs
// two atomic loads.
func (w *Worker) OthersInFlight(now time.Time, maxAge time.Duration) int64 {
	at := w.load.at.Load()
	if at == 0 || now.UnixNano()-at > int64(maxAge) {
		return 0
	}
	return w.load.others.Load()
}

// Metric names the workers' engines use for their load, by engine.
var (
	runningMetrics = map[string]bool{"vllm:num_requests_running": true, "sglang:num_running_reqs": true, "llamacpp:requests_processing": true}
	waitingMetrics = map[string]bool{"vllm:num_requests_waiting": true, "sglang:num_queue_reqs": true, "llamacpp:requests_deferred": true}
	kvUsageMetrics = map[string]bool{"vllm:kv_cache_usage_perc": true, "vllm:gpu_cache_usage_perc": true, "sglang:token_usage": true, "llamacpp:kv_cache_usage_ratio": true}
)

// Where engines state the size of their KV cache: vLLM exports its cache config as an info
// gauge whose labels carry block_size and num_gpu_blocks; SGLang a gauge of the tokens it holds.
const (
	vllmCacheConfigMetric = "vllm:cache_config_info"
	sglangKVTokensMetric  = "sglang:max_total_num_tokens"
)

// maxKVTokens caps a stated KV cache size, so absurd values cannot overflow the token budgets.
const maxKVTokens = 1 << 40

// maxReportedCount caps one series' request count, so absurd values cannot overflow the sums.
const maxReportedCount = 1 << 31

// maxMetricsBytes bounds how much of a /metrics answer is read.
const maxMetricsBytes = 4 << 20

// parseLoad reads the Prometheus text exposition format and sums the running and waiting requests
// over all series (an engine reports one per model or rank), takes the highest KV cache usage and
// the smallest KV cache size stated (the rank that fills first). Lines it does not know are
// skipped; found says whether any load metric was present.
func parseLoad(r io.Reader) (rep LoadReport, found bool, err error) {
	sc := bufio.NewScanner(io.LimitReader(r, maxMetricsBytes))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := parseSample(line)
		if !ok {
			continue
		}
		if kv := statedKVTokens(name, value, line); kv > 0 {
			if rep.KVTokens == 0 || kv < rep.KVTokens {
				rep.KVTokens = kv
			}
			continue
		}
		switch {
		case runningMetrics[name]:
			rep.Running += int64(min(value, maxReportedCount))
		case waitingMetrics[name]:
			rep.Waiting += int64(min(value, maxReportedCount))
		case kvUsageMetrics[name]:
			rep.KVUsage = max(rep.KVUsage, min(value, 1))
		default:
			continue
		}
		found = true
	}
	return rep, found, sc.Err()
}

// statedKVTokens is the KV cache size in tokens that the sample states (see LoadReport.KVTokens),
// or 0 if it states none or an unusable one.
func statedKVTokens(name string, value float64, line string) int64 {
	switch name {
	case sglangKVTokensMetric:
		return int64(min(value, maxKVTokens))
	case vllmCacheConfigMetric:
		blockSize, err1 := strconv.ParseInt(labelValue(line, "block_size"), 10, 64)
		blocks, err2 := strconv.ParseInt(labelValue(line, "num_gpu_blocks"), 10, 64)
		if err1 != nil || err2 != nil || blockSize <= 0 || blocks <= 0 || blockSize > maxKVTokens/blocks {
			return 0
		}
		return blockSize * blocks
	}
	return 0
}

// labelValue is the value of label key in one exposition line `name{k="v",...} value`, or "" if
// the line has no such label. Escaped characters in values (\", \\, \n) are skipped over, and a
// value holding any is returned as "" (no number this reads has one).
func labelValue(line, key string) string {
	i := strings.IndexByte(line, '{')
	if i < 0 {
		return ""
	}
	labels := line[i+1:]
	for {
		labels = strings.TrimLeft(labels, ", ")
		eq := strings.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return ""
		}
		name, rest := strings.TrimSpace(labels[:eq]), labels[eq+2:]
		end, escaped := 0, false
		for end < len(rest) && rest[end] != '"' {
			if rest[end] == '\\' {
				end++
				escaped = true
			}
			end++
		}
		if end >= len(rest) {
			return ""
		}
		if name == key {
			if escaped {
				return ""
			}
			return rest[:end]
		}
		labels = rest[end+1:]
	}
}

// parseSample splits one exposition line `name{labels} value [timestamp]` into its name and
// value; comments, blank lines and malformed or non-finite samples give ok false.
func parseSample(line string) (name string, value float64, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", 0, false
	}
	var rest string
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", 0, false
		}
		name, rest = line[:i], line[j+1:]
	} else {
		i := strings.IndexAny(line, " \t")
		if i < 0 {
			return "", 0, false
		}
		name, rest = line[:i], line[i:]
	}
	fields := strings.Fields(rest)
	if name == "" || len(fields) == 0 || len(fields) > 2 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return "", 0, false
	}
	return name, v, true
}

// scrapeOnce reads w's /metrics and counts a failure.
func (p *Pool) scrapeOnce(ctx context.Context, w *Worker) {
	err := p.scrape(ctx, w)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		p.metrics.scrapeErrors.WithLabelValues(w.spec.ID).Inc()
		p.logger.Debug("scrape failed", "worker", w.spec.ID, "err", err)
	}
	p.learnLimit(ctx, w, err == nil)
	p.checkObjective(w)
}

// scrape reads w's /metrics once and stores the load it reports.
func (p *Pool) scrape(ctx context.Context, w *Worker) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Scrape.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url.JoinPath(p.cfg.Scrape.Path).String(), nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	w.Authorize(req.Header)
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	rep, found, err := parseLoad(resp.Body)
	if err != nil {
		return fmt.Errorf("read metrics: %w", err)
	}
	if !found {
		return fmt.Errorf("no known load metric in %s", p.cfg.Scrape.Path)
	}
	rep.At = p.now()
	w.load.store(rep)
	if others := max(0, rep.Running+rep.Waiting-w.InFlight()); w.load.others.Swap(others) != others {
		p.changes.notify()
	}
	return nil
}
