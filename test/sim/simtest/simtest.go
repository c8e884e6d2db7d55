// Package simtest serves simulated inference engines to tests.
package simtest

import (
	"net/http/httptest"
	"testing"

	"github.com/usherllm/usher/test/sim"
)

// Start serves a new sim.Engine with cfg on a loopback httptest server (a free port of
// 127.0.0.1) and stops both when tb ends: the engine first, so requests still in flight (hung
// ones included) end and the server can close without waiting for them. The worker's base URL
// is the server's URL. A config New refuses fails the test.
func Start(tb testing.TB, cfg sim.Config) (*sim.Engine, *httptest.Server) {
	tb.Helper()
	e, err := sim.New(cfg, sim.Options{})
	if err != nil {
		tb.Fatalf("simtest: %v", err)
	}
	srv := httptest.NewServer(e)
	tb.Cleanup(srv.Close)
	tb.Cleanup(e.Close)
	return e, srv
}
