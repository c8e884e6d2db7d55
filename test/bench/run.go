// Package bench is usher's open-loop load generator for any OpenAI-compatible endpoint.
//
// Run sends streamed chat or text completions on a schedule that never waits for responses
// (Poisson arrivals, or a trace's own timestamps), spreads them over synthetic tenants with
// their keys, priority classes, rates and deadlines, and measures each stream: time to first
// token, gaps between tokens, end-to-end latency, token usage and cached prompt tokens, and the
// headers through which usher says which worker served a request and why. The Report sums it up
// overall, per tenant and per class, with fairness over time windows, a timeline and, when
// asked, the workers' own prefix-cache counters; WriteTable, WriteJSON and WriteHTML (plots, one
// run or several side by side) present it.
//
// Workloads: "random" (independent prompts), "shared-prefix" (SGLang's generated shared prefix:
// groups of prompts sharing a system prompt) and "trace" (Mooncake or Azure production traces;
// the whole files are not in the repository, see testdata/README.md for their sources and for
// the 300-row excerpts kept there). From the command line:
//
//	usher bench --url http://127.0.0.1:8080/v1 --model m --workload trace \
//	    --trace ../shared/traces/mooncake_conversation.jsonl --time-scale 10 --token-scale 8 \
//	    --tenant chat=KEY1:1:interactive --tenant bulk=KEY2:3:batch --out report.json
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Options are the run's dependencies; the zero value uses real ones.
type Options struct {
	// Client sends the requests; nil builds one with NewClient sized for MaxInflight streams
	// and closes its idle connections at the end.
	Client *http.Client
	// Now reads the clock (nil: time.Now). Arrivals wait on real timers, so Now must move with
	// real time; it may be shifted or wrapped.
	Now func() time.Time
	// Logger receives progress and setup messages (nil: discarded).
	Logger *slog.Logger
}

// NewClient returns an http.Client whose transport keeps up to maxStreams connections per host
// alive, so that many concurrent streams do not churn connections, connecting from localIP when
// it is not empty. It has no overall timeout: each request is bounded by its context.
func NewClient(maxStreams int, localIP string) *http.Client {
	d := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if localIP != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(localIP)}
	}
	return &http.Client{Transport: &http.Transport{
		DialContext:           d.DialContext,
		MaxIdleConns:          maxStreams,
		MaxIdleConnsPerHost:   maxStreams,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
	}}
}

// Run replays cfg's workload against cfg.URL and returns the report. Arrivals stop at
// cfg.Duration, after cfg.Requests arrivals, at the end of the workload or when ctx is done;
// requests still outstanding then get cfg.Drain to finish before they are canceled (at once
// when ctx is done, and the report is marked interrupted). Every goroutine Run starts has ended
// when it returns.
//
// The error is non-nil when the configuration is invalid, the workload cannot be read (no
// report then), or when requests were sent and none succeeded (the report is returned too).
func Run(ctx context.Context, cfg Config, opts Options) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	client := opts.Client
	if client == nil {
		client = NewClient(cfg.MaxInflight, cfg.LocalAddr)
		defer client.CloseIdleConnections()
	}
	wl, err := NewWorkload(cfg)
	if err != nil {
		return nil, err
	}
	path := "/chat/completions"
	if cfg.Endpoint == EndpointCompletions {
		path = "/completions"
	}
	s := &sender{
		client:    client,
		endpoint:  strings.TrimRight(cfg.URL, "/") + path,
		chat:      cfg.Endpoint == EndpointChat,
		model:     cfg.Model,
		ignoreEOS: cfg.IgnoreEOS,
		timeout:   cfg.Timeout,
		now:       opts.Now,
	}

	var before []scrapeSample
	if len(cfg.Scrape) > 0 {
		before = scrapeAll(ctx, client, cfg.Scrape)
	}

	for _, r := range cfg.Replicas {
		s.replicas = append(s.replicas, strings.TrimRight(r, "/")+path)
	}
	s.spread = cfg.ReplicaSpread

	opts.Logger.Info("bench start", "url", s.endpoint, "replicas", len(cfg.Replicas), "workload", cfg.Workload, "tenants", len(cfg.Tenants),
		"requests", cfg.Requests, "duration", cfg.Duration)
	r := &runner{cfg: cfg, sender: s, now: opts.Now, log: opts.Logger, sched: newSchedule(cfg, wl)}
	interrupted := r.run(ctx)

	rep := buildReport(cfg, r.results, r.elapsed)
	rep.Interrupted = interrupted
	if len(cfg.Scrape) > 0 {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		rep.Scrape = scrapeDelta(before, scrapeAll(sctx, client, cfg.Scrape))
		cancel()
	}
	opts.Logger.Info("bench done", "sent", rep.Overall.Sent, "ok", rep.Overall.OK,
		"failed", rep.Overall.Failed, "dropped", rep.Overall.Dropped, "elapsed", r.elapsed)
	if rep.Overall.Sent > 0 && rep.Overall.OK == 0 {
		return rep, fmt.Errorf("all %d requests failed", rep.Overall.Sent)
	}
	return rep, nil
}

// progressEvery is how often the arrival loop logs its progress.
const progressEvery = 10 * time.Second

// runner owns the goroutines of one run: the arrival loop runs in run's caller, and one
// goroutine per request in flight, each ended by its response, its timeout or the run's
// cancellation.
type runner struct {
	cfg    Config
	sender *sender
	now    func() time.Time
	log    *slog.Logger
	sched  *schedule

	mu      sync.Mutex // guards results
	results []result

	elapsed time.Duration // set when run returns
}

func (r *runner) record(res result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

// run sends arrivals until one of the stop conditions, then drains. It reports whether ctx
// ended the run.
func (r *runner) run(ctx context.Context) (interrupted bool) {
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	slots := make(chan struct{}, r.cfg.MaxInflight)
	var wg sync.WaitGroup
	start := r.now()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var lastLog time.Duration

	for n := 0; r.cfg.Requests == 0 || n < r.cfg.Requests; n++ {
		a, ok := r.sched.next()
		if !ok || (r.cfg.Duration > 0 && a.at >= r.cfg.Duration) {
			break
		}
		if wait := a.at - r.now().Sub(start); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			break
		}
		sentAt := r.now().Sub(start)
		if sentAt-lastLog >= progressEvery {
			lastLog = sentAt
			r.log.Info("bench progress", "arrivals", n, "in_flight", len(slots), "at", sentAt.Round(time.Second))
		}
		select {
		case slots <- struct{}{}:
		default:
			r.record(result{tenant: a.tenant, dropped: true, sentAt: sentAt, class: r.cfg.Tenants[a.tenant].Class})
			continue
		}
		wg.Go(func() {
			res := r.sender.send(reqCtx, a, r.cfg.Tenants[a.tenant])
			<-slots
			res.sentAt = sentAt
			r.record(res)
		})
	}

	drained := make(chan struct{})
	go func() {
		wg.Wait()
		close(drained)
	}()
	drain := time.NewTimer(r.cfg.Drain)
	defer drain.Stop()
	select {
	case <-drained:
	case <-drain.C:
		r.log.Warn("drain time over, canceling outstanding requests", "drain", r.cfg.Drain)
		cancel()
		<-drained
	case <-ctx.Done():
		cancel()
		<-drained
	}
	r.elapsed = r.now().Sub(start)
	return ctx.Err() != nil
}
