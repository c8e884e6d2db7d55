package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
)

// WriteTable writes the report for people: a line about the run, one row per scope (overall,
// each tenant, each class), then failures, workers, fairness and scraped cache counters.
// Write errors are left to w (a tabwriter over it drops them).
func (r *Report) WriteTable(w io.Writer) {
	run := r.Run
	fmt.Fprintf(w, "usher bench: %s workload, %s %s (%s), %.1fs", run.Workload, run.URL, run.Endpoint, run.Model, r.ElapsedSeconds)
	if run.TraceFile != "" {
		fmt.Fprintf(w, ", trace %s time/%g tokens/%g", run.TraceFile, run.TimeScale, run.TokenScale)
	}
	if r.Interrupted {
		fmt.Fprint(w, ", INTERRUPTED")
	}
	fmt.Fprintln(w)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scope\tsent\tok\tfail\tdrop\treq/s\tout tok/s\tTTFT p50\tp90\tp99\tmean\tITL p50\tp99\tE2E p50\tp99\tprompt tok\tcached\thit\tdl miss\t")
	row := func(scope string, s Stats) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.2f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.1f\t%.0f\t%.0f\t%d\t%d\t%.1f%%\t%d\t\n",
			scope, s.Sent, s.OK, s.Failed, s.Dropped, s.RequestsPerSecond, s.OutputTokensPerSecond,
			s.TTFT.P50, s.TTFT.P90, s.TTFT.P99, s.TTFT.Mean, s.ITL.P50, s.ITL.P99, s.E2E.P50, s.E2E.P99,
			s.PromptTokens, s.CachedTokens, 100*s.CacheHitRate, s.DeadlineMisses)
	}
	row("overall", r.Overall)
	for _, s := range r.Tenants {
		row("tenant "+s.Name, s)
	}
	for _, s := range r.Classes {
		row("class "+s.Name, s)
	}
	tw.Flush()
	fmt.Fprintln(w, "(latencies in ms)")
	for _, s := range r.Classes {
		if a := s.Attainment; a != nil {
			fmt.Fprintf(w, "attainment class %s: %.1f%% met TTFT <= %.0f ms", s.Name, 100*a.Share, a.TTFTObjectiveMs)
			if a.TPOTObjectiveMs > 0 {
				fmt.Fprintf(w, ", TPOT <= %.0f ms", a.TPOTObjectiveMs)
			}
			fmt.Fprintf(w, " (%d of %d judged; missed TTFT %d, TPOT %d), goodput %.2f req/s\n", a.Met, a.Judged, a.TTFTMissed, a.TPOTMissed, a.GoodputPerSecond)
		}
	}

	failures := func(label string, fs []FailureCount) {
		if len(fs) == 0 {
			return
		}
		parts := make([]string, len(fs))
		for i, f := range fs {
			parts[i] = fmt.Sprintf("%d %s: %d", f.Status, f.Code, f.Count)
		}
		fmt.Fprintf(w, "failures %s: %s\n", label, strings.Join(parts, ", "))
	}
	failures("overall", r.Overall.Failures)
	if len(r.Tenants) > 1 {
		for _, s := range r.Tenants {
			failures("tenant "+s.Name, s.Failures)
		}
	}
	if r.Overall.Queue.Count > 0 {
		q := r.Overall.Queue
		fmt.Fprintf(w, "gateway queue ms: p50 %.0f p90 %.0f p99 %.0f mean %.0f\n", q.P50, q.P90, q.P99, q.Mean)
	}
	if len(r.Workers) > 0 {
		var parts []string
		for _, l := range r.Workers {
			part := fmt.Sprintf("%s %d", l.Worker, l.Requests)
			if l.PromptTokens > 0 {
				part += fmt.Sprintf(" (%.0f%% cached)", 100*l.CacheHitRate)
			}
			parts = append(parts, part)
		}
		fmt.Fprintf(w, "workers: %s; max/mean load %.2f\n", strings.Join(parts, ", "), r.WorkerLoadRatio)
	}
	if len(r.Overall.Routes) > 0 {
		fmt.Fprintf(w, "routes: %s\n", formatCounts(r.Overall.Routes))
	}
	f := r.Fairness
	weights := "tokens over shares"
	if !f.Weighted {
		weights = "equal weights"
	}
	if f.Windows == 0 {
		fmt.Fprintf(w, "fairness: Jain n/a (no window of %gs had a backlogged (%s) tenant)\n", f.WindowSeconds, f.Basis)
	} else {
		fmt.Fprintf(w, "fairness: Jain mean %.3f, min %.3f over %d backlogged (%s) windows of %gs, %s\n",
			f.JainMean, f.JainMin, f.Windows, f.Basis, f.WindowSeconds, weights)
	}
	if s := r.Scrape; s != nil {
		fmt.Fprintf(w, "fleet prefix cache: %.0f hits / %.0f queries = %.1f%%\n", s.Hits, s.Queries, 100*s.HitRate)
		for _, sw := range s.Workers {
			if sw.Error != "" {
				fmt.Fprintf(w, "  %s: %s\n", sw.URL, sw.Error)
				continue
			}
			fmt.Fprintf(w, "  %s: %.0f / %.0f = %.1f%%\n", sw.URL, sw.Hits, sw.Queries, 100*sw.HitRate)
		}
	}
}

func formatCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
