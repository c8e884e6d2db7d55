package adminui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/redis/go-redis/v9"
)

// The fleet-wide console. Each replica publishes its Overview and queue snapshot to a
// ReplicaBoard (Redis) every reportInterval, with a TTL of reportTTL; the Overview and Queue
// pages (and GET /admin/api/v1/fleet) show the sum over the fleet and each replica, whichever
// replica serves them. A replica whose report expired (killed, hung, cut off from Redis) is shown
// as stopped reporting, with the time of its last report, for forgetAfter; then it is forgotten.
const (
	reportInterval = time.Second
	reportTTL      = 5 * time.Second
	forgetAfter    = 10 * time.Minute
)

// ReplicaReport is what one replica publishes about itself.
type ReplicaReport struct {
	Replica  string      `json:"replica"`
	At       time.Time   `json:"at"`
	Overview Overview    `json:"overview"`
	Queues   []queueJSON `json:"queues"`
}

// ReplicaBoard shares the replicas' reports. RedisBoard implements it.
type ReplicaBoard interface {
	// Publish stores replica's report (JSON) for ttl and records when it was last seen.
	Publish(ctx context.Context, replica string, report []byte, ttl time.Duration) error
	// Reports returns the reports not yet expired, by replica, and the last time each replica
	// seen within forgetAfter published.
	Reports(ctx context.Context) (live map[string][]byte, lastSeen map[string]time.Time, err error)
}

// RedisBoard keeps the reports in Redis: each under `usher:replica:<name>` with a TTL, and the
// time of each replica's last report in the hash `usher:replicas`. Publish is one pipelined
// round trip, Reports two.
type RedisBoard struct {
	Client redis.UniversalClient
}

var _ ReplicaBoard = RedisBoard{}

const (
	replicaKeyPrefix = "usher:replica:"
	replicasKey      = "usher:replicas"
)

// Publish implements ReplicaBoard.
func (b RedisBoard) Publish(ctx context.Context, replica string, report []byte, ttl time.Duration) error {
	_, err := b.Client.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		pipe.Set(ctx, replicaKeyPrefix+replica, report, ttl)
		pipe.HSet(ctx, replicasKey, replica, time.Now().UnixMilli())
		return nil
	})
	if err != nil {
		return fmt.Errorf("publish replica report: %w", err)
	}
	return nil
}

// Reports implements ReplicaBoard; replicas silent for forgetAfter are dropped from the hash.
func (b RedisBoard) Reports(ctx context.Context) (map[string][]byte, map[string]time.Time, error) {
	seen, err := b.Client.HGetAll(ctx, replicasKey).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read replica reports: %w", err)
	}
	lastSeen := map[string]time.Time{}
	var names, keys, stale []string
	for name, ms := range seen {
		n, err := strconv.ParseInt(ms, 10, 64)
		if err != nil || time.Since(time.UnixMilli(n)) > forgetAfter {
			stale = append(stale, name)
			continue
		}
		lastSeen[name] = time.UnixMilli(n)
		names, keys = append(names, name), append(keys, replicaKeyPrefix+name)
	}
	if len(stale) > 0 {
		b.Client.HDel(ctx, replicasKey, stale...)
	}
	live := map[string][]byte{}
	if len(keys) == 0 {
		return live, lastSeen, nil
	}
	vals, err := b.Client.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, nil, fmt.Errorf("read replica reports: %w", err)
	}
	for i, v := range vals {
		if s, ok := v.(string); ok {
			live[names[i]] = []byte(s)
		}
	}
	return live, lastSeen, nil
}

// ReplicaView is one replica in a FleetView.
type ReplicaView struct {
	ReplicaReport
	// Live: its report has not expired. A replica that stopped reporting keeps its last report's
	// time in LastSeen and nothing else.
	Live     bool      `json:"live"`
	LastSeen time.Time `json:"last_seen"`
	// This: the replica serving the page.
	This bool `json:"this"`
}

// FleetView is every replica's report and their sum.
type FleetView struct {
	At       time.Time     `json:"at"`
	Replicas []ReplicaView `json:"replicas"`
	Total    FleetTotal    `json:"total"`
	// Shared says whether the replicas share a board; without one, only this replica is shown.
	Shared bool `json:"shared"`
}

// FleetTotal sums the live replicas' reports.
type FleetTotal struct {
	LiveReplicas      int     `json:"live_replicas"`
	GoneReplicas      int     `json:"gone_replicas"`
	RequestsPerSecond float64 `json:"requests_per_second"`
	Queued            int     `json:"queued"`
	InFlight          int     `json:"in_flight"`
	DeadlineMisses    int64   `json:"deadline_misses"`
	// TTFTP99Seconds is the worst replica's, over every class: percentiles do not add up.
	TTFTP99Seconds float64 `json:"ttft_p99_seconds"`
}

// report builds this replica's report; its Overview leaves out the history, which stays on the
// replica (its own Overview page).
func (p *Plane) report() (ReplicaReport, error) {
	o, err := p.overviewNow()
	if err != nil {
		return ReplicaReport{}, err
	}
	views, err := p.queueViews()
	if err != nil {
		return ReplicaReport{}, err
	}
	r := ReplicaReport{Replica: p.replica, At: o.At, Overview: o, Queues: make([]queueJSON, len(views))}
	for i, v := range views {
		q := toQueueJSON(v)
		// Per-tenant rows stay on the replica (its own Queue page): the report stays small.
		q.Tenants = nil
		r.Queues[i] = q
	}
	return r, nil
}

// publish sends this replica's report to the board.
func (p *Plane) publish(ctx context.Context) error {
	r, err := p.report()
	if err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return p.board.Publish(ctx, p.replica, b, reportTTL)
}

// Run samples the Overview's history (history.go) and publishes this replica's report every
// reportInterval until ctx ends (no report without a board). Failures are logged once per outage; the other replicas then show this one as stopped
// reporting.
func (p *Plane) Run(ctx context.Context) {
	var history sync.WaitGroup
	history.Go(func() { p.sampleHistory(ctx) })
	defer history.Wait()
	if p.board == nil {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(reportInterval)
	defer t.Stop()
	failing := false
	for {
		err := p.publish(ctx)
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			p.log.Warn("replica report not published; other replicas show this one as stopped reporting", "err", err)
			failing = true
		case err == nil:
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// fleetView gathers every replica's report; this replica's is always fresh, from memory. When
// the board fails, the view holds this replica only and the error is returned beside it.
func (p *Plane) fleetView(ctx context.Context) (FleetView, error) {
	own, err := p.report()
	if err != nil {
		return FleetView{}, err
	}
	v := FleetView{At: own.At, Shared: p.board != nil}
	views := map[string]ReplicaView{p.replica: {ReplicaReport: own, Live: true, LastSeen: own.At, This: true}}
	var boardErr error
	if p.board != nil {
		live, lastSeen, err := p.board.Reports(ctx)
		if err != nil {
			boardErr = err
		}
		for name, seen := range lastSeen {
			if name == p.replica {
				continue
			}
			rv := ReplicaView{ReplicaReport: ReplicaReport{Replica: name}, LastSeen: seen}
			if b, ok := live[name]; ok && json.Unmarshal(b, &rv.ReplicaReport) == nil && rv.Replica == name {
				rv.Live = true
			} else {
				rv.ReplicaReport = ReplicaReport{Replica: name}
			}
			views[name] = rv
		}
	}
	for _, rv := range views {
		v.Replicas = append(v.Replicas, rv)
		if !rv.Live {
			v.Total.GoneReplicas++
			continue
		}
		v.Total.LiveReplicas++
		o := rv.Overview
		v.Total.RequestsPerSecond += o.RequestsPerSecond
		v.Total.DeadlineMisses += o.DeadlineMisses
		for _, c := range o.Classes {
			v.Total.Queued += c.Queued
			v.Total.InFlight += c.InFlight
			v.Total.TTFTP99Seconds = max(v.Total.TTFTP99Seconds, c.TTFTP99Seconds)
		}
	}
	slices.SortFunc(v.Replicas, func(a, b ReplicaView) int { return strings.Compare(a.Replica, b.Replica) })
	return v, boardErr
}

// fleetAPI is GET /admin/api/v1/fleet. When the board fails it answers this replica alone with
// the header X-Usher-Fleet-Partial.
func (p *Plane) fleetAPI(c echo.Context) error {
	v, err := p.fleetView(c.Request().Context())
	if err != nil && v.Replicas == nil {
		return adminError(c, err)
	}
	if err != nil {
		p.log.Warn("fleet view without the other replicas", "err", err)
		c.Response().Header().Set("X-Usher-Fleet-Partial", "board unavailable")
	}
	return c.JSON(http.StatusOK, v)
}

// errNoReplica: a Deps.Replica name the board cannot carry.
var errNoReplica = errors.New("adminui: Deps.Replica must be 1 to 200 bytes without spaces")
