package routing

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// startWorker starts the background goroutines of w if Run is running. p.mu must be held. The
// goroutines belong to the pool: they stop when Run's ctx ends or when w.stop is called (on
// removal).
func (p *Pool) startWorker(w *Worker) {
	if p.runCtx == nil || p.stopped {
		return
	}
	ctx, cancel := context.WithCancel(p.runCtx)
	w.stop = cancel
	p.running.Go(func() { every(ctx, p.cfg.Health.Interval, func(ctx context.Context) { p.check(ctx, w) }) })
	p.running.Go(func() { every(ctx, p.cfg.Scrape.Interval, func(ctx context.Context) { p.scrapeOnce(ctx, w) }) })
}

// startPolicy starts the background work of pol if it has any and Run is running. p.mu must be
// held.
func (p *Pool) startPolicy(pol *policy) {
	r, ok := pol.Policy.(policyRunner)
	if !ok || p.runCtx == nil || p.stopped {
		return
	}
	p.running.Go(func() { r.Run(p.runCtx) })
}

// check sends one health probe to w and records its result. A probe cut short by ctx records
// nothing.
func (p *Pool) check(ctx context.Context, w *Worker) {
	err := p.probe(ctx, w)
	if ctx.Err() != nil {
		return
	}
	w.checkErr = err
	p.recordCheck(w, err == nil)
}

// probe sends one health check to w: nil when it answered 2xx in time, else why not.
func (p *Pool) probe(ctx context.Context, w *Worker) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Health.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.url.JoinPath(p.cfg.Health.Path).String(), nil)
	if err != nil {
		return err
	}
	w.Authorize(req.Header)
	resp, err := p.client.Do(req)
	if err != nil {
		p.logger.Debug("health check failed", "worker", w.spec.ID, "err", err)
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	_ = resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("GET %s answered %s", p.cfg.Health.Path, resp.Status)
	}
	return nil
}

// recordCheck applies one check result to w's health state with the thresholds of HealthConfig.
// Only w's health goroutine (or a test standing in for it) calls it.
func (p *Pool) recordCheck(w *Worker, pass bool) {
	result := "fail"
	if pass {
		result = "pass"
		w.checkPasses++
		w.checkFailures = 0
	} else {
		w.checkFailures++
		w.checkPasses = 0
	}
	p.metrics.checks.WithLabelValues(w.spec.ID, result).Inc()
	prev := healthState(w.health.Load())
	next := prev
	switch {
	case prev == healthUnknown && pass:
		next = healthUp
	case prev == healthUnknown:
		next = healthDown
	case prev == healthUp && w.checkFailures >= p.cfg.Health.UnhealthyThreshold:
		next = healthDown
	case prev == healthDown && w.checkPasses >= p.cfg.Health.HealthyThreshold:
		next = healthUp
	}
	if next == prev {
		return
	}
	w.health.Store(int32(next))
	p.changes.notify()
	if next == healthUp {
		p.logger.Info("worker healthy", "worker", w.spec.ID)
	} else {
		reason := "failed health checks"
		if w.checkErr != nil {
			reason = w.checkErr.Error()
		}
		p.logger.Warn("worker unhealthy", "worker", w.spec.ID, "consecutive_failures", w.checkFailures, "reason", reason)
	}
}
