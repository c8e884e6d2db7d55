package adminui

import (
	"net"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// attempts counts failed credential checks per client address and for all clients together (see
// SignInLimits). Safe for concurrent use. It remembers only addresses that failed and have not
// yet got all their attempts back, so their number is bounded by the global bound: at most
// about twice GlobalPerMinute addresses.
type attempts struct {
	perClient rate.Limit
	burst     int
	now       func() time.Time

	mu      sync.Mutex // guards global and clients
	global  *rate.Limiter
	clients map[string]*rate.Limiter // by address
}

func newAttempts(l SignInLimits, now func() time.Time) *attempts {
	perMinute := func(n int) rate.Limit { return rate.Limit(float64(n) / time.Minute.Seconds()) }
	return &attempts{
		perClient: perMinute(l.PerClientPerMinute),
		burst:     l.PerClientPerMinute,
		now:       now,
		global:    rate.NewLimiter(perMinute(l.GlobalPerMinute), l.GlobalPerMinute),
		clients:   map[string]*rate.Limiter{},
	}
}

// wait is how long the client must wait before its next attempt; 0: it may try now.
func (a *attempts) wait(client string) time.Duration {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	w := untilOne(a.global, now)
	if l := a.clients[client]; l != nil {
		w = max(w, untilOne(l, now))
	}
	return w
}

// failed takes one attempt from the client and from the global bound.
func (a *attempts) failed(client string) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.global.AllowN(now, 1)
	l := a.clients[client]
	if l == nil {
		if len(a.clients) >= 2*a.global.Burst() {
			a.forgetRestedLocked(now)
		}
		l = rate.NewLimiter(a.perClient, a.burst)
		a.clients[client] = l
	}
	l.AllowN(now, 1)
}

// forgetRestedLocked drops the clients that have all their attempts back: a new limiter would
// be the same. a.mu must be held. Cost: one pass over the clients.
func (a *attempts) forgetRestedLocked(now time.Time) {
	for c, l := range a.clients {
		if l.TokensAt(now) >= float64(a.burst) {
			delete(a.clients, c)
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
