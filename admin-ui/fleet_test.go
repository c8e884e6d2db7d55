package adminui

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// memoryBoard is a ReplicaBoard in memory; failing makes Reports fail.
type memoryBoard struct {
	mu      sync.Mutex // guards live and seen
	live    map[string][]byte
	seen    map[string]time.Time
	failing bool
}

func (b *memoryBoard) Publish(_ context.Context, replica string, report []byte, _ time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.seen[replica] = time.Now()
	b.live[replica] = report
	return nil
}

func (b *memoryBoard) Reports(context.Context) (map[string][]byte, map[string]time.Time, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failing {
		return nil, nil, context.DeadlineExceeded
	}
	live, seen := map[string][]byte{}, map[string]time.Time{}
	for k, v := range b.live {
		live[k] = v
	}
	for k, v := range b.seen {
		seen[k] = v
	}
	return live, seen, nil
}

// The fleet view sums the live replicas, lists each, and marks one whose report expired.
func TestFleetViewSumsAndMarksGoneReplicas(t *testing.T) {
	board := &memoryBoard{live: map[string][]byte{}, seen: map[string]time.Time{}}
	other := ReplicaReport{Replica: "other", Overview: Overview{RequestsPerSecond: 2.5, DeadlineMisses: 3,
		Classes: []ClassOverview{{Queued: 4, InFlight: 1, TTFTP99Seconds: 0.2}}}}
	b, _ := json.Marshal(other)
	_ = board.Publish(context.Background(), "other", b, time.Second)
	board.seen["gone"] = time.Now().Add(-10 * time.Second)
	g := startGateway(t, nil, func(s *setup) {
		s.Pool = newPool(t, nil, "round_robin")
		s.Board, s.Replica = board, "this"
	})
	resp, out := g.admin(t, "GET", "/fleet", adminToken, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /fleet: %d %v", resp.StatusCode, out)
	}
	var v FleetView
	if err := json.Unmarshal([]byte(toJSON(out)), &v); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range v.Replicas {
		names = append(names, r.Replica+":"+map[bool]string{true: "live", false: "gone"}[r.Live])
	}
	if got := strings.Join(names, ","); got != "gone:gone,other:live,this:live" {
		t.Fatalf("replicas: got %s, want gone, other and this, gone marked", got)
	}
	if tot := v.Total; tot.LiveReplicas != 2 || tot.GoneReplicas != 1 || tot.Queued != 4 || tot.InFlight != 1 ||
		tot.DeadlineMisses != 3 || tot.RequestsPerSecond != 2.5 || tot.TTFTP99Seconds != 0.2 {
		t.Fatalf("total: got %+v, want other's figures (this replica is idle) over 2 live, 1 gone", tot)
	}

	// Without the board the view is this replica's alone, and says so.
	board.mu.Lock()
	board.failing = true
	board.mu.Unlock()
	resp, out = g.admin(t, "GET", "/fleet", adminToken, "")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Usher-Fleet-Partial") == "" || len(out["replicas"].([]any)) != 1 {
		t.Fatalf("GET /fleet with the board down: got %d %v, want this replica only, marked partial", resp.StatusCode, out)
	}
}
