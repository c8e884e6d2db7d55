package gateway

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Why a connection was closed as soon as it was accepted: the reason label of
// usher_connections_refused_total.
const (
	refusedPerClient = "per_client" // its address already held MaxConnectionsPerClient
	refusedGlobal    = "global"     // MaxConnections were open and it held no fewer than the heaviest client
)

// A refused connection is answered with an HTTP error saying which bound refused it, so that a
// client learns why instead of seeing a reset; at most refuseAnswers at once, each kept at most
// refuseWait. The answer goes out once the request's headers are in (a client, Go's among them,
// drops an answer that comes before its request as unsolicited), and the rest of the request
// is read and discarded (up to refuseDrain bytes in all), so that the close reaches the client
// after the answer rather than as a reset before it. A client that sends no whole headers in
// time gets no answer. Past refuseAnswers a refused connection is closed unanswered, so a flood
// of them costs no more descriptors or goroutines than that.
const (
	refuseAnswers = 32
	refuseWait    = 500 * time.Millisecond
	refuseDrain   = 64 << 10
)

// refusals are the answers to a refused connection, by reason.
var refusals = map[string][]byte{
	refusedPerClient: rawAnswer(errClientConnections),
	refusedGlobal:    rawAnswer(errAllConnections),
}

// fdReserve is the part of the file descriptor limit never given to client connections: the
// listener, Redis and database pools, health checks and files.
const fdReserve = 256

// Listen opens cfg.Listen for the data plane, admin plane and metrics with the connection
// bounds of cfg (MaxConnectionsPerClient, MaxConnections; see connBounds), registering their
// metrics with reg and logging the bounds. cfg must have passed Validate.
func Listen(cfg Config, reg prometheus.Registerer, logger *slog.Logger) (net.Listener, error) {
	trusted, err := parseTrustedProxies(cfg.TrustedProxies)
	if err != nil {
		return nil, err
	}
	fdLimit := openFileLimit()
	global := cfg.MaxConnections
	if global == 0 {
		global = connectionsForFDs(fdLimit)
	}
	perClient := 0
	if cfg.MaxConnectionsPerClient != nil {
		perClient = *cfg.MaxConnectionsPerClient
	}
	b, err := newConnBounds(perClient, global, trusted, reg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, err
	}
	logger.Info("connection bounds", "max_connections", global, "max_connections_per_client", perClient,
		"fd_limit", fdLimit, "trusted_proxies", len(trusted))
	return &boundedListener{Listener: ln, bounds: b}, nil
}

// connectionsForFDs is the default MaxConnections for a descriptor limit: half of what the
// reserve leaves, since each client connection being proxied holds a connection to a worker
// too, and at most maxDefaultConnections. An unknown limit (0) counts as 65,536.
func connectionsForFDs(limit uint64) int {
	if limit == 0 {
		limit = 1 << 16
	}
	if limit < 2*fdReserve {
		return max(int(limit)/4, 1)
	}
	return int(min((limit-fdReserve)/2, maxDefaultConnections))
}

// maxDefaultConnections caps the default MaxConnections where the descriptor limit is very
// large (containers often allow 2^20): each open connection costs a goroutine and its buffers,
// some 10 KB, so 65,536 idle ones already hold most of a gigabyte.
const maxDefaultConnections = 1 << 16

// connBounds counts the open client connections, per client and in all, and decides at accept
// which may stay: per client, at most perClient (0: no bound); in all, at most global, where a
// client holding fewer connections than the heaviest client takes the place of one of the
// heaviest's (max-min fairness: a flood from a few addresses cannot keep others out, and a
// flood spread over many addresses pays for each place by evicting its own). Connections from
// trusted proxies count only in all. Safe for concurrent use; each decision costs O(1).
type connBounds struct {
	perClient int
	global    int
	trusted   trustedProxies

	refusedPerClient prometheus.Counter
	refusedGlobal    prometheus.Counter
	evicted          prometheus.Counter
	// answering holds a token for each refused connection being answered (see refuseAnswers),
	// for at most answerWait (refuseWait).
	answering  chan struct{}
	answerWait time.Duration

	mu      sync.Mutex // guards open, clients, byCount, heaviest and every connection's released
	open    int
	clients map[netip.Addr]*connClient
	// byCount files the clients by the number of connections they hold, so that the heaviest is
	// found without a scan; heaviest is the largest such number (0: no client).
	byCount  map[int]map[*connClient]struct{}
	heaviest int
}

// connClient is one client address (an IPv6 client's /64) and its open connections.
type connClient struct {
	addr  netip.Addr
	conns map[*boundConn]struct{}
}

func newConnBounds(perClient, global int, trusted trustedProxies, reg prometheus.Registerer) (*connBounds, error) {
	b := &connBounds{perClient: perClient, global: global, trusted: trusted,
		clients: map[netip.Addr]*connClient{}, byCount: map[int]map[*connClient]struct{}{},
		answering: make(chan struct{}, refuseAnswers), answerWait: refuseWait}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "usher_connections_refused_total",
		Help: "Client connections refused as soon as accepted (answered 429 or 503 and closed), by bound: per_client (server.max_connections_per_client) or global (server.max_connections)."},
		[]string{"reason"})
	b.refusedPerClient = refused.WithLabelValues(refusedPerClient)
	b.refusedGlobal = refused.WithLabelValues(refusedGlobal)
	evicted := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "usher_connections_evicted_total",
		Help: "Open client connections closed at server.max_connections to make room for a client holding fewer connections than their own."})
	b.evicted = evicted
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "usher_connections_open", Help: "Client connections open (bounded by server.max_connections)."},
		func() float64 {
			b.mu.Lock()
			defer b.mu.Unlock()
			return float64(b.open)
		})
	if reg != nil {
		for _, c := range []prometheus.Collector{refused, evicted, open} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return b, nil
}

// clientKey is the address c counts against: the remote address, an IPv6 one cut to its /64
// (one subscriber's usual allocation). ok is false for connections not counted per client:
// from a trusted proxy, or not over IP.
func (b *connBounds) clientKey(c net.Conn) (key netip.Addr, ok bool) {
	tcp, isTCP := c.RemoteAddr().(*net.TCPAddr)
	if !isTCP {
		return netip.Addr{}, false
	}
	a := tcp.AddrPort().Addr().Unmap()
	if b.trusted.contains(a) {
		return netip.Addr{}, false
	}
	if a.Is6() {
		p, _ := a.Prefix(64)
		a = p.Addr()
	}
	return a, true
}

// admit decides whether c may stay. It returns the wrapped connection, or nil and the refusal
// reason; evicted, when not nil, is a connection that gave its place to c and must be closed.
func (b *connBounds) admit(c net.Conn) (bc *boundConn, evicted *boundConn, refused string) {
	key, counted := b.clientKey(c)
	b.mu.Lock()
	defer b.mu.Unlock()
	var cl *connClient
	held := 0
	if counted {
		if cl = b.clients[key]; cl != nil {
			held = len(cl.conns)
		}
		if b.perClient > 0 && held >= b.perClient {
			return nil, nil, refusedPerClient
		}
	}
	if b.open >= b.global {
		// Taking a place from a client that would then hold as many as c only moves the
		// shortage around.
		if held+1 >= b.heaviest {
			return nil, nil, refusedGlobal
		}
		evicted = b.heaviestConnLocked()
		b.releaseLocked(evicted)
	}
	bc = &boundConn{Conn: c, bounds: b}
	b.open++
	if counted {
		if cl == nil {
			cl = &connClient{addr: key, conns: map[*boundConn]struct{}{}}
			b.clients[key] = cl
		}
		cl.conns[bc] = struct{}{}
		bc.client = cl
		b.moveLocked(cl, held, held+1)
	}
	return bc, evicted, ""
}

// heaviestConnLocked is one connection of a client holding the most. b.heaviest must be > 0.
func (b *connBounds) heaviestConnLocked() *boundConn {
	for cl := range b.byCount[b.heaviest] {
		for c := range cl.conns {
			return c
		}
	}
	panic("gateway: connection bounds: no client holds the heaviest count")
}

// releaseLocked stops counting bc; it does nothing the second time.
func (b *connBounds) releaseLocked(bc *boundConn) {
	if bc.released {
		return
	}
	bc.released = true
	b.open--
	cl := bc.client
	if cl == nil {
		return
	}
	delete(cl.conns, bc)
	held := len(cl.conns)
	b.moveLocked(cl, held+1, held)
	if held == 0 {
		delete(b.clients, cl.addr)
	}
}

// moveLocked refiles cl from holding from connections to holding to (one more or one less).
func (b *connBounds) moveLocked(cl *connClient, from, to int) {
	if from > 0 {
		delete(b.byCount[from], cl)
		if len(b.byCount[from]) == 0 {
			delete(b.byCount, from)
		}
	}
	if to > 0 {
		if b.byCount[to] == nil {
			b.byCount[to] = map[*connClient]struct{}{}
		}
		b.byCount[to][cl] = struct{}{}
	}
	switch {
	case to > b.heaviest:
		b.heaviest = to
	case from == b.heaviest && b.byCount[from] == nil:
		// Counts move by one, so the next heaviest holds to (or there is no client left).
		b.heaviest = to
	}
}

// boundedListener applies connBounds at accept: a connection that may not stay is answered and
// closed (see refuse) before the HTTP server sees it.
type boundedListener struct {
	net.Listener
	bounds *connBounds
}

// Accept returns the next connection that may stay, refusing the others (and closing those they
// evict).
func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		bc, evicted, refused := l.bounds.admit(c)
		// Counted before closing, so whoever sees the close sees the count.
		if evicted != nil {
			l.bounds.evicted.Inc()
			_ = evicted.Conn.Close()
		}
		if bc != nil {
			return bc, nil
		}
		if refused == refusedPerClient {
			l.bounds.refusedPerClient.Inc()
		} else {
			l.bounds.refusedGlobal.Inc()
		}
		l.bounds.refuse(c, refused)
	}
}

// refuse ends c, which may not stay, with the answer for reason when fewer than refuseAnswers
// are being answered, else at once. It does not block.
func (b *connBounds) refuse(c net.Conn, reason string) {
	select {
	case b.answering <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	go func() {
		defer func() { <-b.answering }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(b.answerWait))
		if !awaitHeaders(c, refuseDrain) {
			return
		}
		if _, err := c.Write(refusals[reason]); err != nil {
			return
		}
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.CopyN(io.Discard, c, refuseDrain)
	}()
}

// awaitHeaders reads c up to the end of a request's headers (its first blank line); false when c
// ends, fails or sends limit bytes first.
func awaitHeaders(c net.Conn, limit int) bool {
	var buf [4096]byte
	var window []byte // the last 3 bytes read before this chunk, then the chunk
	for read := 0; read < limit; {
		n, err := c.Read(buf[:min(len(buf), limit-read)])
		read += n
		window = append(window, buf[:n]...)
		if bytes.Contains(window, []byte("\r\n\r\n")) {
			return true
		}
		if err != nil {
			return false
		}
		window = append(window[:0], window[max(len(window)-3, 0):]...)
	}
	return false
}

// boundConn is an admitted connection; closing it gives its place back.
type boundConn struct {
	net.Conn
	bounds   *connBounds
	client   *connClient // nil: not counted per client
	released bool        // guarded by bounds.mu
}

func (c *boundConn) Close() error {
	c.bounds.mu.Lock()
	c.bounds.releaseLocked(c)
	c.bounds.mu.Unlock()
	return c.Conn.Close()
}

// CloseWrite half-closes the connection, as net/http does before closing one whose request it
// did not read to the end (a 401 or 413 before the body), so that the client reads the answer
// rather than a reset; the embedded net.Conn alone would hide the TCP connection's method.
func (c *boundConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

var _ interface{ CloseWrite() error } = (*boundConn)(nil)
