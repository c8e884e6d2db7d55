package sim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// completion sends a small completion request.
func completion(t *testing.T, ctx context.Context, srv *httptest.Server) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(`{"prompt":"a b","max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	return srv.Client().Do(req)
}

// completionStatus sends a small completion request and returns its status.
func completionStatus(t *testing.T, srv *httptest.Server) int {
	t.Helper()
	resp, err := completion(t, t.Context(), srv)
	return statusOf(t, resp, err)
}

func statusOf(t *testing.T, resp *http.Response, err error) int {
	t.Helper()
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestFaultErrorRate(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.ErrorRate = 1
	e, srv := startEngine(t, cfg)
	resp, err := completion(t, t.Context(), srv)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError {
		t.Errorf("status: got %d, want 500", resp.StatusCode)
	}
	if body := decodeJSON[testError](t, resp); body.Error == nil || body.Error.Code != "injected_fault" || body.Error.Type != "server_error" {
		t.Errorf("error body: got %+v, want server_error injected_fault", body.Error)
	}
	if s := e.Stats(); s.Failed != 1 || s.Requests != 1 || s.Completed != 0 {
		t.Errorf("stats: got failed %d requests %d completed %d, want 1 1 0", s.Failed, s.Requests, s.Completed)
	}
}

func TestFaultErrorRateFraction(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.ErrorRate = 0.5
	e, srv := startEngine(t, cfg)
	const n = 40
	for range n {
		statusOf(t, post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1}), nil)
	}
	if got := e.Stats().Failed; got < n/4 || got > 3*n/4 {
		t.Errorf("Failed at error rate 0.5: got %d of %d, want about half", got, n)
	}
}

func TestFaultAddedLatency(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.AddedLatency = 50 * time.Millisecond
	_, srv := startEngine(t, cfg)
	start := time.Now()
	if got := statusOf(t, post(t, t.Context(), srv, "/v1/completions", map[string]any{"prompt": "a", "max_tokens": 1}), nil); got != 200 {
		t.Fatalf("status: got %d, want 200", got)
	}
	if got := time.Since(start); got < 50*time.Millisecond {
		t.Errorf("answered after %v, want at least the added 50ms", got)
	}
}

func TestFaultHang(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.HangRate = 1
	e, srv := startEngine(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := send(ctx, srv, "/v1/completions", map[string]any{"prompt": "a"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("hung request: got %v, want the client's deadline to pass", err)
	}
	if got := e.Stats().Hung; got != 1 {
		t.Errorf("Hung: got %d, want 1", got)
	}
}

func TestFaultUnhealthy(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.Unhealthy = true
	e, srv := startEngine(t, cfg)
	health := func() int {
		resp, err := srv.Client().Get(srv.URL + "/health")
		return statusOf(t, resp, err)
	}
	if got := health(); got != http.StatusServiceUnavailable {
		t.Errorf("unhealthy: got %d, want 503", got)
	}
	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := health(); got != http.StatusOK {
		t.Errorf("healed: got %d, want 200", got)
	}
}

func TestFaultExitAfter(t *testing.T) {
	cfg := fastConfig()
	cfg.Faults.ExitAfter = 2
	e, srv := startEngine(t, cfg)

	streamResp := post(t, t.Context(), srv, "/v1/chat/completions", chat("in flight", 5000, map[string]any{"stream": true}))
	defer streamResp.Body.Close()
	stream := sseReader{bufio.NewReader(streamResp.Body)}
	if _, err := stream.next(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-e.Exited():
		t.Fatal("Exited closed before the second request")
	default:
	}
	if got := completionStatus(t, srv); got != 200 {
		t.Fatalf("second request: got %d, want 200", got)
	}
	select {
	case <-e.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("Exited not closed after the second request")
	}
	for {
		data, err := stream.next()
		if err != nil {
			break
		}
		if data == "[DONE]" {
			t.Fatal("the stream in flight finished normally, want its connection dropped")
		}
	}
	if _, err := completion(t, t.Context(), srv); err == nil {
		t.Error("request to a dead engine got an answer, want the connection closed")
	}
	if resp, err := srv.Client().Get(srv.URL + "/health"); err == nil {
		resp.Body.Close()
		t.Errorf("health of a dead engine: got %d, want the connection closed", resp.StatusCode)
	}

	if err := e.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	if got := completionStatus(t, srv); got != 200 {
		t.Errorf("after revival: got %d, want 200", got)
	}
}

func TestSetFaultsFailThenRecover(t *testing.T) {
	e, srv := startEngine(t, fastConfig())
	steps := []struct {
		name   string
		faults Faults
		want   int
	}{
		{"healthy", Faults{}, 200},
		{"failing", Faults{ErrorRate: 1}, 500},
		{"recovered", Faults{}, 200},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if err := e.SetFaults(s.faults); err != nil {
				t.Fatal(err)
			}
			if got := completionStatus(t, srv); got != s.want {
				t.Errorf("status: got %d, want %d", got, s.want)
			}
		})
	}
	if err := e.SetFaults(Faults{ErrorRate: 2}); err == nil {
		t.Error("SetFaults with error rate 2: got nil, want an error")
	}
	if got := e.Faults(); got != (Faults{}) {
		t.Errorf("Faults after a rejected SetFaults: got %+v, want the previous ones", got)
	}
}
