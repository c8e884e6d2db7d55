package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"
)

// Report is what a run measured. Latencies are in milliseconds, rates per second of the run's
// elapsed time, token counts from the servers' usage (output tokens from the number of content
// chunks when a server gave no usage). It is plain data: encode it with WriteJSON, read it back
// with encoding/json.
type Report struct {
	Run RunInfo `json:"run"`
	// ElapsedSeconds runs from the start of the run to the end of its last request.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	// Interrupted is set when the caller's context ended the run early.
	Interrupted bool `json:"interrupted,omitempty"`

	Overall Stats `json:"overall"`
	// Tenants are in the order of the configuration.
	Tenants []Stats `json:"tenants"`
	// Classes are interactive, standard, batch, then others by name; the class is the one the
	// server reported (X-Usher-Class), else the one asked for, else "unspecified".
	Classes []Stats `json:"classes"`

	// Workers counts the requests each worker served (X-Usher-Worker), by name.
	Workers []WorkerLoad `json:"workers,omitempty"`
	// WorkerLoadRatio is the most requests on one worker over the mean per worker: 1 is an
	// even spread.
	WorkerLoadRatio float64 `json:"worker_load_ratio,omitempty"`

	Fairness Fairness `json:"fairness"`
	// Timeline is the run over time.
	Timeline Timeline `json:"timeline"`
	// Scrape is present when workers' metrics were scraped.
	Scrape *ScrapeReport `json:"scrape,omitempty"`
}

// RunInfo records what was run, scale factors included, so a report stands on its own.
type RunInfo struct {
	URL           string   `json:"url"`
	Replicas      []string `json:"replicas,omitempty"`
	ReplicaSpread string   `json:"replica_spread,omitempty"`
	Model         string   `json:"model"`
	Endpoint      string   `json:"endpoint"`
	Workload      string   `json:"workload"`
	Seed          uint64   `json:"seed"`
	Rate          float64  `json:"rate,omitempty"`
	Duration      float64  `json:"duration_seconds,omitempty"`
	Requests      int      `json:"requests,omitempty"`
	MaxInflight   int      `json:"max_inflight"`
	TraceFile     string   `json:"trace_file,omitempty"`
	TimeScale     float64  `json:"time_scale,omitempty"`
	TokenScale    float64  `json:"token_scale,omitempty"`
	TraceLimit    int      `json:"trace_limit,omitempty"`
	Tenants       []Tenant `json:"tenants"`
}

// Stats sums up a set of requests: all of them, one tenant's or one class's.
type Stats struct {
	Name string `json:"name"`
	// Sent requests reached the wire; Dropped ones found MaxInflight full and never did.
	Sent    int `json:"sent"`
	OK      int `json:"ok"`
	Failed  int `json:"failed"`
	Dropped int `json:"dropped"`
	// Failures counts failed requests by HTTP status and error code (status 0: no response).
	Failures []FailureCount `json:"failures,omitempty"`
	// DeadlineMisses counts OK requests that ended after the deadline they were sent with.
	DeadlineMisses int `json:"deadline_misses"`

	RequestsPerSecond     float64 `json:"requests_per_second"`
	OutputTokensPerSecond float64 `json:"output_tokens_per_second"`

	TTFT Summary `json:"ttft_ms"`
	ITL  Summary `json:"itl_ms"`
	E2E  Summary `json:"e2e_ms"`
	// Queue is the gateway's queueing time from X-Usher-Queue-Ms, when it sent one.
	Queue Summary `json:"queue_ms"`
	// TTFTQuantiles and E2EQuantiles are the 0th to 100th percentiles, one per percent (101
	// values; none without samples): the distributions' CDFs, as the HTML report plots them.
	TTFTQuantiles []float64 `json:"ttft_quantiles_ms,omitempty"`
	E2EQuantiles  []float64 `json:"e2e_quantiles_ms,omitempty"`

	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// CacheHitRate is CachedTokens/PromptTokens.
	CacheHitRate float64 `json:"cache_hit_rate"`
	// Routes counts the X-Usher-Route reasons of sent requests.
	Routes map[string]int `json:"routes,omitempty"`
	// Attainment is present for a class given an objective (Config.Objectives).
	Attainment *Attainment `json:"attainment,omitempty"`
}

// FailureCount is how many requests failed one way.
type FailureCount struct {
	Status int    `json:"status"`
	Code   string `json:"code,omitempty"`
	Count  int    `json:"count"`
}

// WorkerLoad is the number of requests one worker served, and the prompt tokens of the ones
// that succeeded with how many of them its prefix cache held.
type WorkerLoad struct {
	Worker       string  `json:"worker"`
	Requests     int     `json:"requests"`
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	CacheHitRate float64 `json:"cache_hit_rate"`
}

// Timeline is the run in steps of StepSeconds from its start: a tenth of the run up to a
// second, and more when the run is longer than timelineSteps seconds.
type Timeline struct {
	StepSeconds float64 `json:"step_seconds"`
	// Completed counts the requests that ended OK in each step.
	Completed []int `json:"completed"`
	// OutputTokens counts the output tokens received in each step (a request's spread over its
	// content chunks).
	OutputTokens []float64 `json:"output_tokens"`
	// Outstanding counts the requests sent and not yet ended at some time in each step.
	Outstanding []int `json:"outstanding"`
	// Queued counts the requests waiting in the gateway's queue (X-Usher-Queue-Ms) at some time
	// in each step; absent when the gateway sent no queueing times.
	Queued []int `json:"queued,omitempty"`
}

// timelineSteps bounds the steps of a Timeline.
const timelineSteps = 120

// Fairness is the tokens each tenant was served per window and Jain's index over them. A
// request's prompt tokens count when its first token arrives, its output tokens spread over
// its content chunks. In each window the index is taken over the tenants that were backlogged
// then: fairness only means something between tenants that all wanted more than they got. Each
// tenant's tokens are divided by its share, except in a trace workload, where the share only
// sets the mix of the trace's arrivals and every tenant weighs the same (Weighted false).
type Fairness struct {
	WindowSeconds float64 `json:"window_seconds"`
	// Basis says how backlogged is told: "queued" when the gateway reported queueing times
	// (X-Usher-Queue-Ms), a tenant being backlogged while one of its requests waited in the
	// queue or when one was refused (429 or dropped at MaxInflight); else "outstanding", while
	// one of its requests was outstanding or when one was dropped.
	Basis string `json:"basis"`
	// Tokens maps a tenant's name to its tokens served per window.
	Tokens map[string][]float64 `json:"tokens"`
	// Jain is the index per window; 0 where no tenant was backlogged.
	Jain []float64 `json:"jain"`
	// Weighted says whether tenants' tokens were divided by their shares.
	Weighted bool `json:"weighted"`
	// Windows counts the windows where some tenant was backlogged; JainMean and JainMin are
	// over those (0 when there are none).
	Windows  int     `json:"windows"`
	JainMean float64 `json:"jain_mean"`
	JainMin  float64 `json:"jain_min"`
}

// Bases of Fairness.
const (
	basisQueued      = "queued"
	basisOutstanding = "outstanding"
)

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

const classUnspecified = "unspecified"

// buildReport sums up the results of a run. cfg has its defaults applied.
func buildReport(cfg Config, results []result, elapsed time.Duration) *Report {
	rep := &Report{
		Run: RunInfo{
			URL: cfg.URL, Replicas: cfg.Replicas, ReplicaSpread: cfg.ReplicaSpread, Model: cfg.Model, Endpoint: cfg.Endpoint, Workload: cfg.Workload,
			Seed: cfg.Seed, Duration: cfg.Duration.Seconds(), Requests: cfg.Requests,
			MaxInflight: cfg.MaxInflight, Tenants: cfg.Tenants,
		},
		ElapsedSeconds: elapsed.Seconds(),
	}
	if cfg.Workload == WorkloadTrace {
		rep.Run.TraceFile = cfg.Trace.File
		rep.Run.TimeScale = cfg.Trace.TimeScale
		rep.Run.TokenScale = cfg.Trace.TokenScale
		rep.Run.TraceLimit = cfg.Trace.Limit
	} else if !math.IsInf(cfg.Rate, 0) {
		rep.Run.Rate = cfg.Rate
	}

	rep.Overall = stats("overall", results, elapsed)
	for i, t := range cfg.Tenants {
		rep.Tenants = append(rep.Tenants, stats(t.Name, filter(results, func(r *result) bool { return r.tenant == i }), elapsed))
	}
	classes := map[string]bool{}
	for i := range results {
		classes[classOf(&results[i])] = true
	}
	for _, c := range sortedClasses(classes) {
		of := filter(results, func(r *result) bool { return classOf(r) == c })
		s := stats(c, of, elapsed)
		if o, ok := cfg.Objectives[c]; ok {
			s.Attainment = attain(of, o, elapsed)
		}
		rep.Classes = append(rep.Classes, s)
	}
	rep.Workers, rep.WorkerLoadRatio = workerLoads(results, len(cfg.Scrape))
	rep.Fairness = fairness(cfg, results, elapsed)
	rep.Timeline = timeline(results, elapsed)
	return rep
}

func classOf(r *result) string {
	if r.class == "" {
		return classUnspecified
	}
	return r.class
}

func sortedClasses(set map[string]bool) []string {
	rank := map[string]int{"interactive": 0, "standard": 1, "batch": 2}
	out := make([]string, 0, len(set))
	for c := range set {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b string) int {
		ra, oka := rank[a]
		rb, okb := rank[b]
		switch {
		case oka && okb:
			return ra - rb
		case oka:
			return -1
		case okb:
			return 1
		}
		return cmp.Compare(a, b)
	})
	return out
}

func filter(results []result, keep func(*result) bool) []result {
	var out []result
	for i := range results {
		if keep(&results[i]) {
			out = append(out, results[i])
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func stats(name string, results []result, elapsed time.Duration) Stats {
	s := Stats{Name: name}
	var ttft, itl, e2e, queue []float64
	failures := map[FailureCount]int{}
	for i := range results {
		r := &results[i]
		if r.dropped {
			s.Dropped++
			continue
		}
		s.Sent++
		if r.route != "" {
			if s.Routes == nil {
				s.Routes = map[string]int{}
			}
			s.Routes[r.route]++
		}
		if r.hasQueueMs {
			queue = append(queue, r.queueMs)
		}
		if !r.ok {
			s.Failed++
			failures[FailureCount{Status: r.status, Code: r.code}]++
			continue
		}
		s.OK++
		if r.deadline > 0 && r.e2e > r.deadline {
			s.DeadlineMisses++
		}
		if t, ok := r.ttft(); ok {
			ttft = append(ttft, ms(t))
		}
		for j := 1; j < len(r.chunks); j++ {
			itl = append(itl, ms(r.chunks[j]-r.chunks[j-1]))
		}
		e2e = append(e2e, ms(r.e2e))
		s.PromptTokens += int64(r.promptTokens)
		s.CachedTokens += int64(r.cachedTokens)
		s.OutputTokens += int64(r.outputTokens)
	}
	for f, n := range failures {
		f.Count = n
		s.Failures = append(s.Failures, f)
	}
	slices.SortFunc(s.Failures, func(a, b FailureCount) int {
		return cmp.Or(cmp.Compare(a.Status, b.Status), cmp.Compare(a.Code, b.Code))
	})
	if sec := elapsed.Seconds(); sec > 0 {
		s.RequestsPerSecond = float64(s.OK) / sec
		s.OutputTokensPerSecond = float64(s.OutputTokens) / sec
	}
	s.CacheHitRate = ratio(float64(s.CachedTokens), float64(s.PromptTokens))
	s.TTFT, s.ITL, s.E2E, s.Queue = summarize(ttft), summarize(itl), summarize(e2e), summarize(queue)
	s.TTFTQuantiles, s.E2EQuantiles = quantiles(ttft), quantiles(e2e)
	return s
}

// quantiles returns the 0th to 100th percentiles of sorted, one per percent; nil for none.
func quantiles(sorted []float64) []float64 {
	if len(sorted) == 0 {
		return nil
	}
	out := make([]float64, 101)
	for p := range out {
		out[p] = Percentile(sorted, float64(p))
	}
	return out
}

// timeline sums results up per step of the run.
func timeline(results []result, elapsed time.Duration) Timeline {
	// Steps of a second or more once the run is 10 s long, so rates are not mostly noise.
	step := max(time.Millisecond, (elapsed+timelineSteps-1)/timelineSteps, min(time.Second, elapsed/10))
	n := max(1, int((elapsed+step-1)/step))
	tl := Timeline{StepSeconds: step.Seconds(), Completed: make([]int, n), OutputTokens: make([]float64, n), Outstanding: make([]int, n)}
	slot := func(d time.Duration) int { return min(n-1, max(0, int(d/step))) }
	for i := range results {
		r := &results[i]
		if r.dropped {
			continue
		}
		for w := slot(r.sentAt); w <= slot(r.sentAt+r.e2e); w++ {
			tl.Outstanding[w]++
		}
		if r.hasQueueMs && r.queueMs > 0 {
			if tl.Queued == nil {
				tl.Queued = make([]int, n)
			}
			end := r.sentAt + time.Duration(r.queueMs*float64(time.Millisecond))
			for w := slot(r.sentAt); w <= slot(end); w++ {
				tl.Queued[w]++
			}
		}
		if !r.ok {
			continue
		}
		tl.Completed[slot(r.sentAt+r.e2e)]++
		if len(r.chunks) == 0 {
			tl.OutputTokens[slot(r.sentAt+r.e2e)] += float64(r.outputTokens)
			continue
		}
		per := float64(r.outputTokens) / float64(len(r.chunks))
		for _, c := range r.chunks {
			tl.OutputTokens[slot(r.sentAt+c)] += per
		}
	}
	if tl.Queued == nil && slices.ContainsFunc(results, func(r result) bool { return r.hasQueueMs }) {
		tl.Queued = make([]int, n)
	}
	return tl
}

// workerLoads counts requests per worker (X-Usher-Worker) and the max/mean ratio over the
// fleet: the workers seen, or fleet (the scraped workers) when more, so a worker that got
// nothing counts as a load of 0 rather than being left out of the mean.
func workerLoads(results []result, fleet int) ([]WorkerLoad, float64) {
	counts := map[string]*WorkerLoad{}
	for i := range results {
		r := &results[i]
		if r.worker == "" {
			continue
		}
		l := counts[r.worker]
		if l == nil {
			l = &WorkerLoad{Worker: r.worker}
			counts[r.worker] = l
		}
		l.Requests++
		if r.ok {
			l.PromptTokens += int64(r.promptTokens)
			l.CachedTokens += int64(r.cachedTokens)
		}
	}
	if len(counts) == 0 {
		return nil, 0
	}
	loads := make([]WorkerLoad, 0, len(counts))
	total, most := 0, 0
	for _, l := range counts {
		l.CacheHitRate = ratio(float64(l.CachedTokens), float64(l.PromptTokens))
		loads = append(loads, *l)
		total += l.Requests
		most = max(most, l.Requests)
	}
	slices.SortFunc(loads, func(a, b WorkerLoad) int { return cmp.Compare(a.Worker, b.Worker) })
	return loads, float64(most) / (float64(total) / float64(max(len(counts), fleet)))
}

func fairness(cfg Config, results []result, elapsed time.Duration) Fairness {
	win := cfg.Window
	n := max(1, int((elapsed+win-1)/win))
	f := Fairness{WindowSeconds: win.Seconds(), Tokens: map[string][]float64{}, Jain: make([]float64, n), Weighted: cfg.Workload != WorkloadTrace}
	tokens := make([][]float64, len(cfg.Tenants))
	demand := make([][]bool, len(cfg.Tenants))
	for i := range tokens {
		tokens[i] = make([]float64, n)
		demand[i] = make([]bool, n)
	}
	slot := func(d time.Duration) int { return min(n-1, max(0, int(d/win))) }
	f.Basis = basisOutstanding
	for i := range results {
		if results[i].hasQueueMs {
			f.Basis = basisQueued
			break
		}
	}
	for i := range results {
		r := &results[i]
		switch {
		case f.Basis == basisOutstanding:
			for w := slot(r.sentAt); w <= slot(r.sentAt+r.e2e); w++ {
				demand[r.tenant][w] = true
			}
		case r.dropped || r.status == http.StatusTooManyRequests:
			demand[r.tenant][slot(r.sentAt)] = true
		case r.queueMs > 0:
			end := r.sentAt + time.Duration(r.queueMs*float64(time.Millisecond))
			for w := slot(r.sentAt); w <= slot(end); w++ {
				demand[r.tenant][w] = true
			}
		}
		if !r.ok {
			continue
		}
		if t, ok := r.ttft(); ok {
			tokens[r.tenant][slot(r.sentAt+t)] += float64(r.promptTokens)
			per := float64(r.outputTokens) / float64(len(r.chunks))
			for _, c := range r.chunks {
				tokens[r.tenant][slot(r.sentAt+c)] += per
			}
		} else {
			tokens[r.tenant][slot(r.sentAt+r.e2e)] += float64(r.promptTokens + r.outputTokens)
		}
	}
	for i, t := range cfg.Tenants {
		f.Tokens[t.Name] = tokens[i]
	}
	var sum float64
	for w := 0; w < n; w++ {
		var xs []float64
		for i, t := range cfg.Tenants {
			if !demand[i][w] {
				continue
			}
			if f.Weighted {
				xs = append(xs, tokens[i][w]/t.Share)
			} else {
				xs = append(xs, tokens[i][w])
			}
		}
		if len(xs) == 0 {
			continue
		}
		f.Jain[w] = JainIndex(xs)
		sum += f.Jain[w]
		if f.Windows == 0 || f.Jain[w] < f.JainMin {
			f.JainMin = f.Jain[w]
		}
		f.Windows++
	}
	if f.Windows > 0 {
		f.JainMean = sum / float64(f.Windows)
	}
	return f
}
