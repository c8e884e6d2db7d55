package adminui

import (
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/usherllm/usher/routing"
)

// clock is a settable clock; safe for concurrent use.
type clock struct {
	mu sync.Mutex // guards t
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Unix(1_700_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestAttemptsPerClientAndGlobal(t *testing.T) {
	clk := newClock()
	a := newAttempts(SignInLimits{PerClientPerMinute: 3, GlobalPerMinute: 5}, clk.Now)
	for i := range 3 {
		if w := a.wait("10.0.0.1"); w != 0 {
			t.Fatalf("attempt %d: got wait %v, want none", i+1, w)
		}
		a.failed("10.0.0.1")
	}
	if w := a.wait("10.0.0.1"); w != 20*time.Second {
		t.Fatalf("after 3 failures at 3 a minute: got wait %v, want 20s", w)
	}
	if w := a.wait("10.0.0.2"); w != 0 {
		t.Fatalf("another client: got wait %v, want none", w)
	}
	// Two more clients fail once each: the global bound of 5 is spent, for every client that
	// failed lately; a client that did not is not held back by the others' failures.
	a.failed("10.0.0.2")
	a.failed("10.0.0.3")
	if w := a.wait("10.0.0.2"); w != 12*time.Second {
		t.Fatalf("a client that failed once, past the global bound: got wait %v, want 12s", w)
	}
	if w := a.wait("10.0.0.4"); w != 0 {
		t.Fatalf("a new client past the global bound: got wait %v, want none", w)
	}
	clk.Advance(12 * time.Second)
	if w := a.wait("10.0.0.2"); w != 0 {
		t.Fatalf("a client that failed once, once one global attempt is back: got wait %v, want none", w)
	}
	if w := a.wait("10.0.0.1"); w != 8*time.Second {
		t.Fatalf("the first client 12s later: got wait %v, want 8s", w)
	}
	// A minute on, every client has all its attempts back and is forgotten at the next sweep.
	clk.Advance(time.Minute)
	a.forgetRestedLocked(clk.Now())
	if n := len(a.clients); n != 0 {
		t.Fatalf("clients remembered after they rested: got %d, want 0", n)
	}
}

func TestAttemptsRememberBoundedClients(t *testing.T) {
	clk := newClock()
	a := newAttempts(SignInLimits{PerClientPerMinute: 10, GlobalPerMinute: 100}, clk.Now)
	// A guesser from many addresses, as fast as the global bound lets it, for ten minutes.
	for i := range 100_000 {
		client := "10." + strconv.Itoa(i/65536%256) + "." + strconv.Itoa(i/256%256) + "." + strconv.Itoa(i%256)
		if a.wait(client) == 0 {
			a.failed(client)
		}
		clk.Advance(6 * time.Millisecond)
	}
	if n := len(a.clients); n > 2*100 {
		t.Fatalf("clients remembered: got %d, want at most %d", n, 2*100)
	}
}

func TestSignInAttemptsAreLimited(t *testing.T) {
	clk := newClock()
	w := newFakeWorker(t)
	g := startGateway(t, []routing.WorkerSpec{w.spec("w1")}, func(s *setup) { s.Now = clk.Now })
	for i := range 10 {
		if resp, out := g.admin(t, "GET", "/workers", "wrong-"+strconv.Itoa(i), ""); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: got %d %v, want 401", i, resp.StatusCode, out)
		}
	}
	// The right token is refused too, until an attempt comes back.
	resp, out := g.admin(t, "GET", "/workers", adminToken, "")
	if resp.StatusCode != http.StatusTooManyRequests || errorCode(out) != "too_many_attempts" || resp.Header.Get("Retry-After") != "6" {
		t.Fatalf("the right token after 10 wrong ones: got %d %v Retry-After %q, want 429 too_many_attempts Retry-After 6",
			resp.StatusCode, out, resp.Header.Get("Retry-After"))
	}
	b := newBrowser(t, g.url)
	resp, _ = b.do("POST", "/admin/signin", url.Values{"csrf": {b.csrf("/admin/signin")}, "token": {adminToken}})
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("console sign-in from the same address: got %d, want 429", resp.StatusCode)
	}
	clk.Advance(6 * time.Second)
	if resp, out := g.admin(t, "GET", "/workers", adminToken, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("the right token 6s later: got %d %v, want 200", resp.StatusCode, out)
	}
	// A missing credential is not a guess.
	for range 20 {
		g.admin(t, "GET", "/workers", "", "")
	}
	if resp, _ := g.admin(t, "GET", "/workers", adminToken, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("after calls without a credential: got %d, want 200", resp.StatusCode)
	}
}

// Sign-in attempts are counted per client address as server.trusted_proxies reads it: behind a
// trusted proxy, per forwarded client; from anyone else, per connection, whatever
// X-Forwarded-For or X-Real-IP it sends (issue 10, item 10).
func TestSignInLimitsReadClientsThroughTrustedProxies(t *testing.T) {
	try := func(g *testGateway, token, forwardedFor string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", g.url+"/admin/api/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("X-Forwarded-For", forwardedFor)
		req.Header.Set("X-Real-IP", forwardedFor)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tt := range []struct {
		name    string
		trusted []string
		// wantOther is the answer to the right token from another forwarded address after ten
		// wrong ones from the first.
		wantOther int
	}{
		{"spoofed headers from an untrusted client are one client", nil, http.StatusTooManyRequests},
		{"clients behind a trusted proxy are counted apart", []string{"127.0.0.0/8"}, http.StatusOK},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := startGateway(t, []routing.WorkerSpec{newFakeWorker(t).spec("w1")}, func(s *setup) {
				s.Now = newClock().Now
				s.TrustedProxies = tt.trusted
			})
			for i := range 10 {
				if got := try(g, "wrong-"+strconv.Itoa(i), "198.51.100."+strconv.Itoa(i+1)); got != http.StatusUnauthorized {
					t.Fatalf("wrong token %d: got %d, want 401", i, got)
				}
			}
			if tt.trusted != nil {
				// One forwarded client that fails ten times is refused, right token or not.
				for range 9 {
					try(g, "wrong-again", "198.51.100.1")
				}
				if got := try(g, adminToken, "198.51.100.1"); got != http.StatusTooManyRequests {
					t.Fatalf("the right token from the forwarded client that failed 10 times: got %d, want 429", got)
				}
			}
			if got := try(g, adminToken, "203.0.113.50"); got != tt.wantOther {
				t.Fatalf("the right token forwarded for another address: got %d, want %d", got, tt.wantOther)
			}
		})
	}
}

// TestGuessersDoNotLockOutTheOwner is issue 26's weak spot: wrong credentials from 12 addresses
// spent the global bound, and the admin plane then refused everyone, the real admin and every
// tenant reading its usage included. The global bound holds back only clients that failed
// lately: the guessers. An address whose credential was accepted, or one that has not guessed,
// still gets in.
func TestGuessersDoNotLockOutTheOwner(t *testing.T) {
	try := func(g *testGateway, token, from string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", g.url+"/admin/api/v1/workers", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("X-Forwarded-For", from)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	g := startGateway(t, []routing.WorkerSpec{newFakeWorker(t).spec("w1")}, func(s *setup) {
		s.Now = newClock().Now
		s.TrustedProxies = []string{"127.0.0.0/8"}
		s.Config.SignIn = SignInLimits{PerClientPerMinute: 10, GlobalPerMinute: 10}
	})
	const owner, newcomer = "192.0.2.10", "192.0.2.20"
	if got := try(g, adminToken, owner); got != http.StatusOK {
		t.Fatalf("the admin before any guess: got %d, want 200", got)
	}
	refused := 0
	for i := range 12 {
		guesser := "198.51.100." + strconv.Itoa(i+1)
		for j := range 2 {
			switch try(g, "wrong-"+strconv.Itoa(j), guesser) {
			case http.StatusUnauthorized:
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Fatalf("guesser %s: want 401 or 429", guesser)
			}
		}
	}
	if refused < 24-12-10 {
		t.Errorf("guesses refused by the global bound of 10: got %d of 24, want at least %d", refused, 24-12-10)
	}
	if got := try(g, adminToken, "198.51.100.1"); got != http.StatusTooManyRequests {
		t.Errorf("the right token from an address that guessed: got %d, want 429", got)
	}
	if got := try(g, adminToken, owner); got != http.StatusOK {
		t.Errorf("the admin from the address it used before: got %d, want 200", got)
	}
	if got := try(g, adminToken, newcomer); got != http.StatusOK {
		t.Errorf("the admin from an address that never guessed: got %d, want 200", got)
	}
}
