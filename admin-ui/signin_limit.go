package adminui

import (
	"maps"
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// attempts counts failed credential checks per client address and for all clients together (see
// SignInLimits). Safe for concurrent use.
//
// The global bound throttles guessers, not owners: it holds back only a client that failed
// itself within the last minute (and has not had a credential accepted within trustFor), so
// guessing from many addresses never locks out the admin or a tenant from an address that has
// not guessed wrong. Past the global bound each failing address thus gets at most one guess a
// minute. It remembers the addresses that failed within the last minute or have not yet got all
// their attempts back, at most twice GlobalPerMinute of them; while that table is full, a new
// address is held back by the global bound too, so a guesser cannot spread its guesses over
// more addresses than that. Addresses whose credential was accepted are remembered for
// trustFor, at most maxTrusted of them.
type attempts struct {
	perClient rate.Limit
	burst     int
	now       func() time.Time

	mu      sync.Mutex // guards global, clients and trusted
	global  *rate.Limiter
	clients map[string]*client // by address
	// trusted holds, by address, until when a client whose credential was accepted is not held
	// back by others' failures.
	trusted map[string]time.Time
}

// client is one address's failures: its own bound and when it last failed.
type client struct {
	attempts   *rate.Limiter
	lastFailed time.Time
}

// failingFor is how long a failure makes its client subject to the global bound.
const failingFor = time.Minute

// How long, and for how many addresses, an accepted credential exempts its address from the
// global bound.
const (
	trustFor   = 24 * time.Hour
	maxTrusted = 10_000
)

func newAttempts(l SignInLimits, now func() time.Time) *attempts {
	perMinute := func(n int) rate.Limit { return rate.Limit(float64(n) / time.Minute.Seconds()) }
	return &attempts{
		perClient: perMinute(l.PerClientPerMinute),
		burst:     l.PerClientPerMinute,
		now:       now,
		global:    rate.NewLimiter(perMinute(l.GlobalPerMinute), l.GlobalPerMinute),
		clients:   map[string]*client{},
		trusted:   map[string]time.Time{},
	}
}

// wait is how long the client must wait before its next attempt; 0: it may try now. Its own
// failures always count; the global bound counts for a client that failed lately and was not
// trusted since, and for a new client while the table of failing clients is full.
func (a *attempts) wait(addr string) time.Duration {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	var w time.Duration
	c := a.clients[addr]
	if c != nil {
		w = untilOne(c.attempts, now)
	}
	if until, ok := a.trusted[addr]; ok && now.Before(until) {
		return w
	}
	if c != nil && now.Sub(c.lastFailed) < failingFor || c == nil && a.fullLocked(now) {
		w = max(w, untilOne(a.global, now))
	}
	return w
}

// failed takes one attempt from the client and from the global bound.
func (a *attempts) failed(addr string) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.global.AllowN(now, 1)
	c := a.clients[addr]
	if c == nil {
		a.fullLocked(now) // forgets the rested clients when the table is full
		c = &client{attempts: rate.NewLimiter(a.perClient, a.burst)}
		a.clients[addr] = c
	}
	c.attempts.AllowN(now, 1)
	c.lastFailed = now
}

// succeeded records that the client's credential was accepted: for trustFor, others' failures
// do not hold it back (its own still do).
func (a *attempts) succeeded(addr string) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.trusted[addr]; !ok && len(a.trusted) >= maxTrusted {
		maps.DeleteFunc(a.trusted, func(_ string, until time.Time) bool { return !now.Before(until) })
		if len(a.trusted) >= maxTrusted {
			return
		}
	}
	a.trusted[addr] = now.Add(trustFor)
}

// fullLocked reports whether the table of failing clients is full (twice the global burst),
// after forgetting the clients that rested. a.mu must be held.
func (a *attempts) fullLocked(now time.Time) bool {
	if len(a.clients) < 2*a.global.Burst() {
		return false
	}
	a.forgetRestedLocked(now)
	return len(a.clients) >= 2*a.global.Burst()
}

// forgetRestedLocked drops the clients that have all their attempts back and have not failed
// for failingFor: a new entry would be the same. a.mu must be held. Cost: one pass over the
// clients.
func (a *attempts) forgetRestedLocked(now time.Time) {
	for addr, c := range a.clients {
		if c.attempts.TokensAt(now) >= float64(a.burst) && now.Sub(c.lastFailed) >= failingFor {
			delete(a.clients, addr)
		}
	}
}

// untilOne is how long until l has one token, rounded up to the millisecond; 0 if it has one
// now.
func untilOne(l *rate.Limiter, now time.Time) time.Duration {
	tokens := l.TokensAt(now)
	if tokens >= 1 {
		return 0
	}
	d := time.Duration((1 - tokens) / float64(l.Limit()) * float64(time.Second))
	return (d + time.Millisecond - 1).Truncate(time.Millisecond)
}

// connectionAddress is the address the connection came from, the client's address when no
// proxy is trusted (Deps.ClientAddr): behind a proxy every client then shares the proxy's
// address and limit.
func connectionAddress(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
