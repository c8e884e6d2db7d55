package gateway

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync"
	"time"
)

// upstreamTransport carries requests to plain-HTTP workers over HTTP/1.1 keep-alive connections,
// doing all the work of an attempt on the caller's goroutine: the request goes out in one write,
// the answer is read where it is relayed. net/http's Transport runs two goroutines per
// connection and hands every request and answer between them; on the gateway's hop that was a
// third of usher's CPU per request. Everything else (https workers, methods with streamed
// bodies) goes to fallback.
//
// Its contract is http.RoundTripper's, with net/http's replay rule: a request that carries an
// Idempotency-Key header (empty or not) and went out on a reused connection that turns out
// closed before any byte of an answer is sent once more, on a new connection. It reports
// whether a connection was reused through httptrace's GotConn, as net/http does.
type upstreamTransport struct {
	dial          func(ctx context.Context, network, addr string) (net.Conn, error)
	headerTimeout time.Duration // bounds the wait for the status line and headers
	idleTimeout   time.Duration // an idle connection older than this is closed, not reused
	maxIdle       int           // idle connections kept per host
	fallback      http.RoundTripper
	now           func() time.Time

	mu        sync.Mutex
	idle      map[string][]*upstreamConn // by host:port, most recently used last
	lastSweep time.Time
}

type upstreamConn struct {
	conn     net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	idleFrom time.Time
}

// errReplayable marks a failure on a reused connection before any byte of the answer.
var errReplayable = errors.New("reused connection closed before an answer")

func newLeanTransport(cfg Config, now func() time.Time) *upstreamTransport {
	return &upstreamTransport{
		dial: (&net.Dialer{
			Timeout:   cfg.UpstreamConnectTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		headerTimeout: cfg.UpstreamHeaderTimeout,
		idleTimeout:   90 * time.Second,
		maxIdle:       1024,
		fallback:      newUpstreamTransport(cfg),
		now:           now,
		idle:          map[string][]*upstreamConn{},
	}
}

// RoundTrip sends req and returns the worker's answer; the caller must close its body. The
// connection goes back to the idle pool when the body was read to its end.
func (t *upstreamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" || (req.Body != nil && req.GetBody == nil) {
		return t.fallback.RoundTrip(req)
	}
	ctx := req.Context()
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	_, replayable := req.Header["Idempotency-Key"]
	trace := httptrace.ContextClientTrace(ctx)
	for {
		pc, reused, err := t.get(ctx, host)
		if err != nil {
			return nil, err
		}
		if trace != nil && trace.GotConn != nil {
			trace.GotConn(httptrace.GotConnInfo{Conn: pc.conn, Reused: reused})
		}
		resp, err := t.exchange(ctx, host, pc, req, reused)
		if errors.Is(err, errReplayable) && replayable && ctx.Err() == nil {
			continue // the worker closed an idle connection: once more on a new one
		}
		return resp, err
	}
}

// exchange writes req on pc and reads the answer's head; the body stays to be read.
func (t *upstreamTransport) exchange(ctx context.Context, host string, pc *upstreamConn, req *http.Request, reused bool) (*http.Response, error) {
	stop := context.AfterFunc(ctx, func() { _ = pc.conn.SetDeadline(time.Unix(1, 0)) })
	fail := func(err error) (*http.Response, error) {
		stop()
		pc.conn.Close()
		if cause := context.Cause(ctx); cause != nil {
			return nil, cause
		}
		return nil, err
	}
	if err := writeRequest(pc.bw, req); err != nil {
		if reused {
			return fail(errReplayable)
		}
		return fail(err)
	}
	// A deadline set here would undo the past one a cancel may just have set: the context is
	// looked at after each change, and the cancel's deadline set again if it fired meanwhile.
	if t.headerTimeout > 0 {
		_ = pc.conn.SetReadDeadline(t.now().Add(t.headerTimeout))
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
	}
	if _, err := pc.br.Peek(1); err != nil {
		if reused && (errors.Is(err, io.EOF) || isConnReset(err)) {
			return fail(errReplayable)
		}
		return fail(err)
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		return fail(err)
	}
	if t.headerTimeout > 0 {
		_ = pc.conn.SetReadDeadline(time.Time{})
		if ctx.Err() != nil {
			resp.Body.Close()
			return fail(ctx.Err())
		}
	}
	resp.Body = &upstreamBody{rc: resp.Body, pc: pc, t: t, ctx: ctx, stop: stop, keep: !resp.Close, host: host}
	return resp, nil
}

// validHeaderText reports whether s holds no control character but tab.
func validHeaderText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

func isConnReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// errBadHeader refuses a header net/http would refuse to send.
var errBadHeader = errors.New("invalid header in an upstream request")

// writeRequest writes the request line, the headers and the body, and flushes them as one
// write. Host and Content-Length come from the request, not from its header map.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	w.WriteString(req.Method)
	w.WriteByte(' ')
	w.WriteString(req.URL.RequestURI())
	w.WriteString(" HTTP/1.1\r\nHost: ")
	if req.Host != "" {
		w.WriteString(req.Host)
	} else {
		w.WriteString(req.URL.Host)
	}
	w.WriteString("\r\n")
	for k, vs := range req.Header {
		if k == "Host" || k == "Content-Length" {
			continue
		}
		for _, v := range vs {
			if !validHeaderText(k) || !validHeaderText(v) {
				return errBadHeader
			}
			w.WriteString(k)
			w.WriteString(": ")
			w.WriteString(v)
			w.WriteString("\r\n")
		}
	}
	if req.Body != nil {
		w.WriteString("Content-Length: ")
		w.WriteString(strconv.FormatInt(req.ContentLength, 10))
		w.WriteString("\r\n\r\n")
		body, err := req.GetBody()
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, body); err != nil {
			return err
		}
	} else {
		w.WriteString("\r\n")
	}
	return w.Flush()
}

// get takes an idle connection to host, or dials a new one.
func (t *upstreamTransport) get(ctx context.Context, host string) (*upstreamConn, bool, error) {
	now := t.now()
	t.mu.Lock()
	for list := t.idle[host]; len(list) > 0; list = t.idle[host] {
		pc := list[len(list)-1]
		list[len(list)-1] = nil
		t.idle[host] = list[:len(list)-1]
		if now.Sub(pc.idleFrom) < t.idleTimeout {
			t.mu.Unlock()
			return pc, true, nil
		}
		pc.conn.Close()
	}
	t.mu.Unlock()
	c, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	return &upstreamConn{conn: c, br: bufio.NewReaderSize(c, 16<<10), bw: bufio.NewWriterSize(c, 8<<10)}, false, nil
}

// put returns a connection whose answer was read to its end to the idle pool.
func (t *upstreamTransport) put(host string, pc *upstreamConn) {
	now := t.now()
	pc.idleFrom = now
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.idle[host]) >= t.maxIdle {
		pc.conn.Close()
		return
	}
	t.idle[host] = append(t.idle[host], pc)
	if now.Sub(t.lastSweep) < t.idleTimeout {
		return
	}
	t.lastSweep = now
	for h, list := range t.idle {
		kept := list[:0]
		for _, c := range list {
			if now.Sub(c.idleFrom) < t.idleTimeout {
				kept = append(kept, c)
			} else {
				c.conn.Close()
			}
		}
		clear(list[len(kept):])
		if len(kept) == 0 {
			delete(t.idle, h)
		} else {
			t.idle[h] = kept
		}
	}
}

// CloseIdleConnections closes every idle connection.
func (t *upstreamTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*upstreamConn{}
	t.mu.Unlock()
	for _, list := range idle {
		for _, pc := range list {
			pc.conn.Close()
		}
	}
	if c, ok := t.fallback.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// upstreamBody is an answer's body; it gives the connection back once read to its end, and
// closes it when the body is closed early.
type upstreamBody struct {
	rc   io.ReadCloser
	ctx  context.Context
	pc   *upstreamConn
	t    *upstreamTransport
	stop func() bool
	host string
	keep bool
	eof  bool
	done bool
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	switch {
	case b.eof:
		return 0, io.EOF // as often as asked, like net/http's bodies
	case b.done:
		return 0, http.ErrBodyReadAfterClose
	}
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.eof = true
		b.finish()
	case err != nil:
		// A cancelled attempt shows as a read past the deadline its context set: say why.
		if cause := context.Cause(b.ctx); cause != nil {
			err = cause
		}
	}
	return n, err
}

func (b *upstreamBody) Close() error {
	b.finish()
	return nil
}

func (b *upstreamBody) finish() {
	if b.done {
		return
	}
	b.done = true
	// stop reports false when the context already fired: the connection's deadline is then
	// in the past, and it cannot be used again.
	if b.stop() && b.eof && b.keep {
		b.t.put(b.host, b.pc)
		return
	}
	b.pc.conn.Close()
}
