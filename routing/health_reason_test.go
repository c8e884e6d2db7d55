package routing

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestUnhealthyLogSaysWhy: the line that marks a worker unhealthy carries the failed check's
// reason, an error status or the connection's error.
func TestUnhealthyLogSaysWhy(t *testing.T) {
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(down.Close)
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	for _, tt := range []struct {
		url, want string
	}{
		{down.URL, "answered 503 Service Unavailable"},
		{gone.URL, "connection refused"},
	} {
		var log bytes.Buffer
		cfg := Config{Policy: "round_robin", Workers: []WorkerSpec{{ID: "w0", URL: tt.url, Models: []string{"m"}}}}
		cfg.Health.Interval, cfg.Health.Timeout = time.Minute, time.Minute // the reason is the answer, never a timeout of a loaded machine
		cfg.SetDefaults()
		p, err := NewPool(cfg, Options{Logger: slog.New(slog.NewTextHandler(&log, nil))})
		if err != nil {
			t.Fatal(err)
		}
		p.check(context.Background(), modelWorkers(t, p, "m")[0])
		line := log.String()
		if !strings.Contains(line, "worker unhealthy") || !strings.Contains(line, tt.want) {
			t.Errorf("worker at %s: log %q, want 'worker unhealthy' with the reason %q", tt.url, line, tt.want)
		}
	}
}
