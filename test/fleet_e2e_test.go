package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
	"github.com/usherllm/usher/tenants"
	"github.com/usherllm/usher/test/redistest"
	"github.com/usherllm/usher/test/sim"
	"github.com/usherllm/usher/test/sim/simtest"

	"github.com/usherllm/usher/test/pgtest"
)

// Keys of the config tenants of the fleet test.
const (
	fleetLoadKey  = "sk-fleet-load"
	fleetLimitKey = "sk-fleet-limited"
)

// fleetConfig is the configuration every replica of the fleet test shares.
func fleetConfig(listen, redisAddr, dbURL string, workers []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "server:\n  listen: %s\n  shutdown_settle: 300ms\n  shutdown_grace: 10s\n", listen)
	fmt.Fprintf(&b, "routing:\n  drain_sync: 100ms\n  health: {interval: 200ms, timeout: 100ms}\n")
	fmt.Fprintf(&b, "  models:\n    %s: {policy: sticky_session}\n  workers:\n", model)
	for i, u := range workers {
		fmt.Fprintf(&b, "    - {id: sim-%d, url: %q, models: [%s]}\n", i, u, model)
	}
	fmt.Fprintf(&b, "redis: {url: \"redis://%s/0\"}\ndatabase: {url: %q}\nadmin: {token: %s}\nlog: {level: warn}\n", redisAddr, dbURL, e2eAdminToken)
	b.WriteString("default_tier: big\ntiers:\n  - {name: big, default_class: interactive}\n  - {name: small, requests_per_minute: 5}\n")
	fmt.Fprintf(&b, "tenants:\n  - {id: load, tier: big, keys: [{name: k, sha256: %s}]}\n", tenants.HashKey(fleetLoadKey))
	fmt.Fprintf(&b, "  - {id: limited, tier: small, keys: [{name: k, sha256: %s}]}\n", tenants.HashKey(fleetLimitKey))
	return b.String()
}

// requestLog records the X-Request-ID of every request a worker receives.
type requestLog struct {
	mu   sync.Mutex // guards seen
	seen map[string]int
}

func (l *requestLog) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id := r.Header.Get("X-Request-ID"); strings.HasPrefix(id, "load-") {
			l.mu.Lock()
			l.seen[id]++
			l.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

// twice counts the request IDs a worker received more than once.
func (l *requestLog) twice() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.seen {
		if c > 1 {
			n++
		}
	}
	return n
}

// fleetCall sends one request to a replica and returns the status and decoded JSON body.
func fleetCall(t *testing.T, method, url, token, body string, header map[string]string) (*http.Response, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := freshClient().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out)
	return resp, out
}

func TestFleetOfThreeReplicas(t *testing.T) {
	dbURL := pgtest.URL(t)
	rs := redistest.Start(t)
	reqs := &requestLog{seen: map[string]int{}}
	var workers []string
	for range 3 {
		cfg := sim.DefaultConfig()
		cfg.Model, cfg.TimeScale = model, 0.5 // about 6 ms a token
		e, err := sim.New(cfg, sim.Options{})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(reqs.wrap(e))
		// The engine stops first, so the server closes without waiting for cut requests.
		t.Cleanup(srv.Close)
		t.Cleanup(e.Close)
		workers = append(workers, srv.URL)
	}
	var reps []*serveProcess
	for i := range 3 {
		// One after the other: the first migrates the shared schema.
		reps = append(reps, startServe(t, fmt.Sprintf("replica-%d", i), func(listen string) string {
			return fleetConfig(listen, rs.Addr(), dbURL, workers)
		}))
	}
	chatURL := func(r *serveProcess) string { return r.url + "/v1/chat/completions" }

	t.Run("sticky sessions agree", func(t *testing.T) {
		for s := range 6 {
			session := fmt.Sprintf("session-%d", s)
			want := ""
			for i := range 2 * len(reps) {
				// A replica whose share of the pinned worker is full at that moment (its part of
				// the worker is split with the others, and settles over the first exchanges)
				// serves the request elsewhere and keeps the pin: route spill. That is no
				// disagreement; the request is sent again until the pinned worker has room.
				var got, route string
				for try := 0; ; try++ {
					resp, out := fleetCall(t, "POST", chatURL(reps[(s+i)%3]), fleetLoadKey, chat("hello", 2, false), map[string]string{"X-Session-ID": session})
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("%s: %d %v", session, resp.StatusCode, out)
					}
					got, route = resp.Header.Get("X-Usher-Worker"), resp.Header.Get("X-Usher-Route")
					if route != string(routing.RouteSpill) || try == 50 {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
				if want == "" {
					want = got
				}
				if got != want {
					t.Fatalf("%s on replica-%d: served by %s (route %s), want %s as on the first replica", session, (s+i)%3, got, route, want)
				}
			}
		}
	})

	t.Run("one rate limit for the tenant", func(t *testing.T) {
		var ok, limited int
		for i := range 9 {
			resp, out := fleetCall(t, "POST", chatURL(reps[i%3]), fleetLimitKey, chat("hi", 2, false), nil)
			switch resp.StatusCode {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				limited++
			default:
				t.Fatalf("request %d: %d %v", i, resp.StatusCode, out)
			}
		}
		if ok != 5 || limited != 4 {
			t.Fatalf("got %d served and %d limited, want 5 and 4 across three replicas", ok, limited)
		}
	})

	t.Run("a revocation reaches every replica within a second", func(t *testing.T) {
		admin := reps[0].url + "/admin/api/v1"
		if resp, out := fleetCall(t, "POST", admin+"/tenants", e2eAdminToken, `{"id":"acme","tier":"big"}`, nil); resp.StatusCode != http.StatusCreated {
			t.Fatalf("create tenant: %d %v", resp.StatusCode, out)
		}
		resp, out := fleetCall(t, "POST", admin+"/tenants/acme/keys", e2eAdminToken, `{"name":"ci"}`, nil)
		secret, _ := out["secret"].(string)
		key, _ := out["key"].(map[string]any)
		if resp.StatusCode != http.StatusCreated || secret == "" || key == nil {
			t.Fatalf("create key: %d %v", resp.StatusCode, out)
		}
		status := func(r *serveProcess) int {
			resp, _ := fleetCall(t, "GET", r.url+"/v1/models", secret, "", nil)
			return resp.StatusCode
		}
		eventually(t, time.Second, "the new key works on every replica", func() bool {
			return status(reps[0]) == 200 && status(reps[1]) == 200 && status(reps[2]) == 200
		})
		if resp, out := fleetCall(t, "DELETE", admin+"/tenants/acme/keys/"+key["id"].(string), e2eAdminToken, "", nil); resp.StatusCode != http.StatusNoContent {
			t.Fatalf("revoke: %d %v", resp.StatusCode, out)
		}
		revoked := time.Now()
		eventually(t, time.Second, "the revoked key is refused by every replica", func() bool {
			return status(reps[0]) == 401 && status(reps[1]) == 401 && status(reps[2]) == 401
		})
		t.Logf("revocation effective on three replicas after %v", time.Since(revoked).Round(time.Millisecond))
	})

	t.Run("a drain started on one replica reaches the others", func(t *testing.T) {
		state := func(r *serveProcess) string {
			_, out := fleetCall(t, "GET", r.url+"/admin/api/v1/workers/sim-0", e2eAdminToken, "", nil)
			s, _ := out["state"].(string)
			return s
		}
		if resp, out := fleetCall(t, "POST", reps[0].url+"/admin/api/v1/workers/sim-0/drain", e2eAdminToken, "", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("drain: %d %v", resp.StatusCode, out)
		}
		eventually(t, time.Second, "replicas 1 and 2 see sim-0 drained", func() bool {
			return strings.HasPrefix(state(reps[1]), "drain") && strings.HasPrefix(state(reps[2]), "drain")
		})
		for i := range 6 {
			resp, _ := fleetCall(t, "POST", chatURL(reps[i%3]), fleetLoadKey, chat("hi", 2, false), nil)
			if w := resp.Header.Get("X-Usher-Worker"); resp.StatusCode != http.StatusOK || w == "sim-0" {
				t.Fatalf("request %d during the drain: %d from %q, want 200 from another worker", i, resp.StatusCode, w)
			}
		}
		if resp, out := fleetCall(t, "POST", reps[2].url+"/admin/api/v1/workers/sim-0/undrain", e2eAdminToken, "", nil); resp.StatusCode != http.StatusOK {
			t.Fatalf("undrain: %d %v", resp.StatusCode, out)
		}
		eventually(t, time.Second, "every replica sees sim-0 healthy again", func() bool {
			return state(reps[0]) == "healthy" && state(reps[1]) == "healthy"
		})
	})

	t.Run("SIGKILL one replica and SIGTERM another under load", func(t *testing.T) {
		fleetUnderLoad(t, reps, reqs)
	})
}

// loadOutcome is how one request of the load ended for its client.
type loadOutcome int

const (
	// answered: 200 and the stream ended with data: [DONE].
	answered loadOutcome = iota
	// failedVisibly: the client saw an error: a refused or reset connection, an error status
	// (503 with Retry-After while a replica stops), or a stream cut with a read error.
	failedVisibly
	// lost: neither: the stream ended cleanly without [DONE], or nothing came back before the
	// client's timeout.
	lost
)

func fleetUnderLoad(t *testing.T, reps []*serveProcess, reqs *requestLog) {
	const (
		total       = 300
		concurrency = 24
		maxTokens   = 40
	)
	type counts struct {
		sent, inFlight atomic.Int64
	}
	perReplica := make([]counts, len(reps))
	outcomes := make([]loadOutcome, total)
	reasons := make([]string, total)
	var finished atomic.Int64
	clients := make([]*http.Client, len(reps))
	for i := range clients {
		clients[i] = &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: concurrency}}
	}

	jobs := make(chan int)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for i := range jobs {
				r := i % len(reps)
				perReplica[r].sent.Add(1)
				perReplica[r].inFlight.Add(1)
				var reason string
				outcomes[i], reason = loadRequest(clients[r], reps[r].url, fmt.Sprintf("load-%d", i), maxTokens)
				reasons[i] = fmt.Sprintf("replica-%d: %s", r, reason)
				perReplica[r].inFlight.Add(-1)
				finished.Add(1)
			}
		})
	}
	killed, terminated := reps[1], reps[2]
	var atKill [3]int64
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for finished.Load() < total/5 {
			time.Sleep(time.Millisecond)
		}
		for i := range atKill {
			atKill[i] = perReplica[i].inFlight.Load()
		}
		_ = killed.cmd.Process.Signal(syscall.SIGKILL)
		_ = terminated.cmd.Process.Signal(syscall.SIGTERM)
	}()
	start := time.Now()
	for i := range total {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	<-stopped
	elapsed := time.Since(start)

	var n [3]int
	byReason := map[string]int{}
	for i, o := range outcomes {
		n[o]++
		if o != answered {
			byReason[reasons[i]]++
		}
	}
	t.Logf("load: %d requests sent over 3 replicas in %v; %d answered, %d failed with a visible error, %d lost; workers saw %d request IDs twice",
		total, elapsed.Round(time.Millisecond), n[answered], n[failedVisibly], n[lost], reqs.twice())
	t.Logf("in flight when replica-1 got SIGKILL and replica-2 SIGTERM: %v; failures by reason: %v", atKill, byReason)
	if code := terminated.exitCode(15 * time.Second); code != 0 {
		t.Errorf("replica-2 after SIGTERM: exit code %d, want 0", code)
	}
	if n[answered]+n[failedVisibly]+n[lost] != total {
		t.Fatalf("outcomes: got %d, want %d", n[answered]+n[failedVisibly]+n[lost], total)
	}
	if n[lost] != 0 {
		t.Errorf("lost requests: got %d, want 0", n[lost])
	}
	if d := reqs.twice(); d != 0 {
		t.Errorf("requests sent to a worker twice: got %d, want 0", d)
	}
	if atKill[2] == 0 {
		t.Errorf("replica-2 had no stream in flight at SIGTERM; the test did not test a stop mid-stream")
	}
	for reason, count := range byReason {
		if strings.HasPrefix(reason, "replica-0:") || strings.HasPrefix(reason, "replica-2: stream:") {
			t.Errorf("%d requests failed with %q: the replica that kept running, and the streams in flight on the one stopped with SIGTERM, must all finish", count, reason)
		}
	}
}

// loadRequest sends one streamed request and says how it ended, with a short reason for a
// failure.
func loadRequest(client *http.Client, url, id string, maxTokens int) (loadOutcome, string) {
	ctx := context.Background()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chat("a story under load", maxTokens, true)))
	req.Header.Set("Authorization", "Bearer "+fleetLoadKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-ID", id)
	resp, err := client.Do(req)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return lost, "timeout"
		}
		return failedVisibly, "connect: " + errClass(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return failedVisibly, fmt.Sprintf("status %d", resp.StatusCode)
	}
	events := newSSEReader(resp.Body)
	last := ""
	for e, ok := events.next(); ok; e, ok = events.next() {
		last = e
	}
	switch {
	case last == "[DONE]":
		return answered, ""
	case events.sc.Err() != nil:
		var ne net.Error
		if errors.As(events.sc.Err(), &ne) && ne.Timeout() {
			return lost, "timeout mid-stream"
		}
		return failedVisibly, "stream: " + errClass(events.sc.Err())
	}
	return lost, "ended without [DONE]"
}

// errClass shortens a transport error to its kind.
func errClass(err error) string {
	s := err.Error()
	for _, kind := range []string{"connection refused", "connection reset", "unexpected EOF", "EOF", "broken pipe"} {
		if strings.Contains(s, kind) {
			return kind
		}
	}
	return s
}

func TestReplicasLeaveAWorkerTheOthersFill(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.Model, cfg.TimeScale = model, 1
	_, worker := simtest.Start(t, cfg)
	config := func(dir string) func(listen string) string {
		return func(listen string) string {
			c := serveConfig(listen, dir, []string{worker.URL}, "  shutdown_settle: 100ms\n", "", "admin: {token: "+e2eAdminToken+"}\n")
			c = strings.Replace(c, "max_concurrency: 1", "max_concurrency: 4", 1)
			return strings.Replace(c, "routing:\n", "routing:\n  scrape: {interval: 100ms}\n", 1)
		}
	}
	a := startServe(t, "replica-a", config(t.TempDir()))
	b := startServe(t, "replica-b", config(t.TempDir()))
	capacity := func(r *serveProcess) (requests, others int) {
		var list struct {
			Queues []struct{ Capacity struct{ Requests int } }
		}
		req, _ := http.NewRequest(http.MethodGet, r.url+"/admin/api/v1/queue", nil)
		req.Header.Set("Authorization", "Bearer "+e2eAdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(&list)
		queues := list.Queues
		_, w := fleetCall(t, "GET", r.url+"/admin/api/v1/workers/sim-0", e2eAdminToken, "", nil)
		o, _ := w["others_in_flight"].(float64)
		if len(queues) == 0 {
			return -1, int(o)
		}
		return queues[0].Capacity.Requests, int(o)
	}
	eventually(t, 5*time.Second, "replica-b's queue holds the worker's 4 slots", func() bool { n, _ := capacity(b); return n == 4 })

	// replica-a fills the worker: replica-b's queue keeps one slot.
	var streams []<-chan streamResult
	for range 4 {
		streams = append(streams, startStream(t, &http.Client{}, a.url, apiKey, 150))
	}
	eventually(t, 2*time.Second, "replica-b sees the worker full", func() bool { n, o := capacity(b); return n == 1 && o == 4 })
	if n, o := capacity(a); n != 4 || o != 0 {
		t.Fatalf("replica-a: capacity %d with %d others' requests, want 4 and 0: its own requests are not others'", n, o)
	}
	for _, s := range streams {
		if r := <-s; r.err != nil || !r.done {
			t.Fatalf("stream on replica-a: %+v", r)
		}
	}
	eventually(t, 2*time.Second, "replica-b gets the slots back", func() bool { n, _ := capacity(b); return n == 4 })
}
