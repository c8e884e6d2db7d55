package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Objective is a latency objective the report judges one class's requests against, as usher's
// tiers state them: time to first token and time per output token after it (0: none).
type Objective struct {
	TTFT time.Duration `json:"ttft"`
	TPOT time.Duration `json:"tpot,omitempty"`
}

// Attainment is how a class's requests fared against its Objective, judged as usher judges
// them: a streamed answer's TTFT is the time to its first content chunk and its TPOT (end -
// first chunk) / (output tokens - 1), unjudged below two tokens; a whole answer's time is
// judged against TTFT + TPOT x (output tokens - 1); a request that failed with a 5xx or no
// answer is missed; a 4xx (the client's) or a request dropped at MaxInflight is not judged.
type Attainment struct {
	TTFTObjectiveMs float64 `json:"ttft_objective_ms"`
	TPOTObjectiveMs float64 `json:"tpot_objective_ms,omitempty"`
	// Judged counts the requests judged; Met those that missed neither objective, Missed the
	// others; TTFTMissed and TPOTMissed each objective's misses.
	Judged     int `json:"judged"`
	Met        int `json:"met"`
	Missed     int `json:"missed"`
	TTFTMissed int `json:"ttft_missed"`
	TPOTMissed int `json:"tpot_missed"`
	// Share is Met/Judged; GoodputPerSecond is Met per second of the run.
	Share            float64 `json:"share"`
	GoodputPerSecond float64 `json:"goodput_per_second"`
}

// attain judges results against o.
func attain(results []result, o Objective, elapsed time.Duration) *Attainment {
	a := &Attainment{TTFTObjectiveMs: ms(o.TTFT), TPOTObjectiveMs: ms(o.TPOT)}
	for i := range results {
		r := &results[i]
		if r.dropped || !r.ok && r.status >= 400 && r.status < 500 {
			continue
		}
		a.Judged++
		ttftMissed, tpotMissed := judgeResult(r, o)
		if ttftMissed {
			a.TTFTMissed++
		}
		if tpotMissed {
			a.TPOTMissed++
		}
		if ttftMissed || tpotMissed {
			a.Missed++
		} else {
			a.Met++
		}
	}
	a.Share = ratio(float64(a.Met), float64(a.Judged))
	if sec := elapsed.Seconds(); sec > 0 {
		a.GoodputPerSecond = float64(a.Met) / sec
	}
	return a
}

// judgeResult says which of o's objectives r missed.
func judgeResult(r *result, o Objective) (ttft, tpot bool) {
	if !r.ok {
		return o.TTFT > 0, o.TPOT > 0
	}
	n := r.outputTokens
	first, streamed := r.ttft()
	if !streamed || r.whole {
		whole := o.TTFT
		if o.TPOT > 0 && n > 1 {
			whole += o.TPOT * time.Duration(n-1)
		}
		late := o.TTFT > 0 && r.e2e > whole
		return late, late && o.TPOT > 0 && n > 1
	}
	ttft = o.TTFT > 0 && first > o.TTFT
	tpot = o.TPOT > 0 && n > 1 && (r.e2e-first)/time.Duration(n-1) > o.TPOT
	return ttft, tpot
}

// objectivesFlag reads --objective CLASS=TTFT[/TPOT], repeatable.
type objectivesFlag map[string]Objective

func (f *objectivesFlag) String() string {
	if f == nil {
		return ""
	}
	var parts []string
	for _, c := range slices.Sorted(func(yield func(string) bool) {
		for c := range *f {
			if !yield(c) {
				return
			}
		}
	}) {
		o := (*f)[c]
		parts = append(parts, fmt.Sprintf("%s=%s/%s", c, o.TTFT, o.TPOT))
	}
	return strings.Join(parts, ",")
}

func (f *objectivesFlag) Set(v string) error {
	class, spec, ok := strings.Cut(v, "=")
	if !ok || class == "" {
		return fmt.Errorf("want CLASS=TTFT[/TPOT], e.g. interactive=500ms/80ms")
	}
	ttftS, tpotS, _ := strings.Cut(spec, "/")
	var o Objective
	var err error
	if o.TTFT, err = time.ParseDuration(ttftS); err != nil || o.TTFT <= 0 {
		return fmt.Errorf("objective of %s: TTFT must be a positive duration, not %q", class, ttftS)
	}
	if tpotS != "" {
		if o.TPOT, err = time.ParseDuration(tpotS); err != nil || o.TPOT <= 0 {
			return fmt.Errorf("objective of %s: TPOT must be a positive duration, not %q", class, tpotS)
		}
	}
	if *f == nil {
		*f = objectivesFlag{}
	}
	(*f)[class] = o
	return nil
}
