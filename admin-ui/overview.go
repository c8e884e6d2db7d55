package adminui

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/usherllm/usher/queue"
	"github.com/usherllm/usher/routing"
)

// Overview is the fleet at a glance: the console's first page and GET /admin/api/v1/overview.
type Overview struct {
	At time.Time `json:"at"`
	// RequestsPerSecond is over the last 10 s, all classes.
	RequestsPerSecond float64         `json:"requests_per_second"`
	Classes           []ClassOverview `json:"classes"`
	// Workers counts the workers in each state; every state is present.
	Workers     map[routing.WorkerState]int `json:"workers"`
	WorkerCount int                         `json:"worker_count"`
	// DeadlineMisses sums the requests whose deadline passed while queued, since start.
	DeadlineMisses int64 `json:"deadline_misses"`
	// History is the last minutes of this replica, a sample every 5 s, oldest first (see
	// Plane.Run); absent while Run has not sampled, and from the reports of the fleet view.
	History []OverviewSample `json:"history,omitempty"`
	// charts draw History for the console.
	charts []historyChart
}

// Charts are the console's charts of History.
func (o Overview) Charts() []historyChart { return o.charts }

// ClassOverview is one class in an Overview. Latencies and shed rate are over the last 60 s,
// the rate over the last 10 s, the queue is now (all models).
type ClassOverview struct {
	Class             queue.Class `json:"class"`
	RequestsPerSecond float64     `json:"requests_per_second"`
	TTFTP50Seconds    float64     `json:"ttft_p50_seconds"`
	TTFTP99Seconds    float64     `json:"ttft_p99_seconds"`
	// ShedRate is the fraction of the class's requests refused with 429 or 503.
	ShedRate          float64 `json:"shed_rate"`
	Requests          int     `json:"requests"`
	Queued            int     `json:"queued"`
	InFlight          int     `json:"in_flight"`
	OldestWaitSeconds float64 `json:"oldest_wait_seconds"`
}

// overview gathers the Overview with its history and charts.
func (p *Plane) overview() (Overview, error) {
	o, err := p.overviewNow()
	if err != nil {
		return Overview{}, err
	}
	o.History = p.hist.list()
	o.charts = historyCharts(o.History, o.At)
	return o, nil
}

// overviewNow gathers the Overview of now, without history. Cost: one queue snapshot per model
// and a sort of the last minute's latency samples per class.
func (p *Plane) overviewNow() (Overview, error) {
	o := Overview{At: p.now(), Workers: map[routing.WorkerState]int{}}
	for _, st := range []routing.WorkerState{routing.StateHealthy, routing.StateUnhealthy, routing.StateCircuitOpen, routing.StateDraining, routing.StateDrained} {
		o.Workers[st] = 0
	}
	for _, w := range p.fleet.Workers() {
		o.Workers[w.State]++
		o.WorkerCount++
	}
	classes := queue.Classes()
	byClass := make([]ClassOverview, len(classes))
	for i, cl := range classes {
		tr := p.live.Traffic(cl)
		co := ClassOverview{Class: cl, RequestsPerSecond: tr.RequestsPerSecond, Requests: tr.Requests,
			TTFTP50Seconds: tr.TTFTP50.Seconds(), TTFTP99Seconds: tr.TTFTP99.Seconds()}
		if tr.Requests > 0 {
			co.ShedRate = float64(tr.Shed) / float64(tr.Requests)
		}
		o.RequestsPerSecond += tr.RequestsPerSecond
		byClass[i] = co
	}
	for _, model := range p.fleet.Models() {
		snap, err := p.live.QueueSnapshot(model)
		if err != nil {
			return Overview{}, err
		}
		o.DeadlineMisses += snap.DeadlineMisses
		for _, cs := range snap.Classes {
			if int(cs.Class) >= len(byClass) {
				continue
			}
			co := &byClass[cs.Class]
			co.Queued += cs.Queued
			co.InFlight += cs.InFlight
			co.OldestWaitSeconds = max(co.OldestWaitSeconds, cs.OldestWait.Seconds())
		}
	}
	o.Classes = byClass
	return o, nil
}

func (p *Plane) overviewAPI(c echo.Context) error {
	o, err := p.overview()
	if err != nil {
		return adminError(c, err)
	}
	return c.JSON(http.StatusOK, o)
}
