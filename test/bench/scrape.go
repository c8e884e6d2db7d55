package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Prefix-cache counters of vLLM's /metrics (v1 engine), with and without the _total suffix
// that some exposition paths drop.
var (
	metricHits    = []string{"vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"}
	metricQueries = []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"}
)

// ScrapeReport is the fleet's prefix-cache activity during the run, from the workers' own
// counters: hits and queries are in tokens.
type ScrapeReport struct {
	Workers []ScrapeWorker `json:"workers"`
	Hits    float64        `json:"hits"`
	Queries float64        `json:"queries"`
	// HitRate is Hits/Queries over the workers read both times; 0 when there were no queries.
	HitRate float64 `json:"hit_rate"`
}

// ScrapeWorker is one worker's counter deltas, or why they are missing.
type ScrapeWorker struct {
	URL     string  `json:"url"`
	Hits    float64 `json:"hits"`
	Queries float64 `json:"queries"`
	HitRate float64 `json:"hit_rate"`
	Error   string  `json:"error,omitempty"`
}

type scrapeSample struct {
	url           string
	hits, queries float64
	err           error
}

func metricsURL(u string) string {
	if strings.HasSuffix(u, "/metrics") {
		return u
	}
	return strings.TrimRight(u, "/") + "/metrics"
}

// scrapeAll reads every worker's counters, one after the other.
func scrapeAll(ctx context.Context, client *http.Client, urls []string) []scrapeSample {
	out := make([]scrapeSample, len(urls))
	for i, u := range urls {
		out[i] = scrapeSample{url: u}
		out[i].hits, out[i].queries, out[i].err = scrape(ctx, client, metricsURL(u))
	}
	return out
}

func scrape(ctx context.Context, client *http.Client, u string) (hits, queries float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("scrape %s: %w", u, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("scrape %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("scrape %s: status %d", u, resp.StatusCode)
	}
	return PrefixCacheCounters(resp.Body)
}

// PrefixCacheCounters reads a Prometheus text exposition and sums the prefix-cache hit and
// query counters over all their label sets.
func PrefixCacheCounters(r io.Reader) (hits, queries float64, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4<<20)
	for sc.Scan() {
		name, v, ok := ParseSample(sc.Text())
		if !ok {
			continue
		}
		switch {
		case oneOf(name, metricHits):
			hits += v
		case oneOf(name, metricQueries):
			queries += v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("read metrics: %w", err)
	}
	return hits, queries, nil
}

func oneOf(s string, set []string) bool {
	for _, x := range set {
		if s == x {
			return true
		}
	}
	return false
}

// ParseSample reads one sample line of the Prometheus text format, "name{labels} value
// [timestamp]"; false for comments, blank lines and malformed ones.
func ParseSample(line string) (name string, value float64, ok bool) {
	line = strings.TrimSpace(line)
	if line == "" || line[0] == '#' {
		return "", 0, false
	}
	rest := ""
	if i := strings.IndexAny(line, "{ \t"); i < 0 {
		return "", 0, false
	} else if line[i] == '{' {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", 0, false
		}
		name, rest = line[:i], line[j+1:]
	} else {
		name, rest = line[:i], line[i:]
	}
	fields := strings.Fields(rest)
	if name == "" || len(fields) == 0 || len(fields) > 2 {
		return "", 0, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return "", 0, false
	}
	return name, v, true
}

// scrapeDelta subtracts the samples taken before the run from those taken after.
func scrapeDelta(before, after []scrapeSample) *ScrapeReport {
	rep := &ScrapeReport{}
	for i, a := range after {
		b := before[i]
		w := ScrapeWorker{URL: a.url}
		switch {
		case b.err != nil:
			w.Error = b.err.Error()
		case a.err != nil:
			w.Error = a.err.Error()
		default:
			w.Hits, w.Queries = a.hits-b.hits, a.queries-b.queries
			w.HitRate = ratio(w.Hits, w.Queries)
			rep.Hits += w.Hits
			rep.Queries += w.Queries
		}
		rep.Workers = append(rep.Workers, w)
	}
	rep.HitRate = ratio(rep.Hits, rep.Queries)
	return rep
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
