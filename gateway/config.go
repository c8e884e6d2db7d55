package gateway

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Config is the `server:` section of usher's configuration: the listener and the bounds of the
// data plane. Zero fields take the defaults of SetDefaults.
type Config struct {
	// Listen is the address of the data plane, admin API and metrics. Default 127.0.0.1:8080.
	Listen string `yaml:"listen"`
	// MaxBodyBytes bounds a request body; larger bodies get 413. Default 8 MiB.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxBodyBytesHeld bounds the request-body bytes the gateway holds in memory at once, every
	// call's together: a body is held from before it is read (from its Content-Length, or as it
	// arrives) until its call ends. A request that would pass it gets 503 with Retry-After.
	// Default 256 MiB.
	MaxBodyBytesHeld int64 `yaml:"max_body_bytes_held"`
	// MaxBodyBytesPerTenant bounds the request-body bytes one tenant's calls hold at once, so one
	// tenant's slow uploads cannot take every other tenant's share: a request that would pass it
	// gets 429 with Retry-After. Default a quarter of max_body_bytes_held (64 MiB: 8 bodies of
	// the largest size, thousands of ordinary ones), at least max_body_bytes; it must lie from
	// max_body_bytes to max_body_bytes_held.
	MaxBodyBytesPerTenant int64 `yaml:"max_body_bytes_per_tenant"`
	// MaxJSONDepth bounds how deep objects and arrays may nest in a request body (the body
	// itself is level 1); a deeper body gets 400. Python engines parse, validate and render JSON
	// recursively, several frames a level, under a recursion limit of 1,000: thousands of levels
	// make them drop the connection. Real bodies stay far below the default: a tool's JSON
	// schema ten levels deep (OpenAI's own bound for structured outputs) nests about 25 levels
	// in a request. Default 128; at least 5 (a chat message's content parts).
	MaxJSONDepth int `yaml:"max_json_depth"`
	// MaxHeaderBytes bounds the request line and headers. Default 64 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxResponseBytes bounds a non-streaming worker response the gateway reads to learn its
	// usage. Default 64 MiB.
	MaxResponseBytes int64 `yaml:"max_response_bytes"`
	// ReadHeaderTimeout bounds how long a client may take to send its headers. Default 10s.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// ReadTimeout bounds how long a client may take to send a whole request, headers and body:
	// a client that trickles its body is cut off instead of holding a connection and a file
	// descriptor for as long as it likes. Default 60s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// IdleTimeout closes idle keep-alive connections. Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnectionsPerClient bounds the connections one client address (an IPv6 client: its
	// /64) may hold open at once; a connection beyond it is closed as soon as it is accepted, so
	// one address cannot take the file descriptors every client needs. Connections from
	// TrustedProxies are not bounded per address (each carries many clients). Default 256; 0
	// turns the bound off.
	MaxConnectionsPerClient *int `yaml:"max_connections_per_client"`
	// MaxConnections bounds the client connections open at once, below the process's file
	// descriptor limit so that accepting never fails for want of one. At the bound, a new
	// connection from a client holding fewer connections than the heaviest client takes the
	// place of one of the heaviest's; any other is closed at once. Default 0: half of the
	// descriptor limit (RLIMIT_NOFILE) less 256, leaving the other half for the connections to
	// workers, Redis, the database and files, and at most 65,536 (each idle connection holds a
	// goroutine and its buffers).
	MaxConnections int `yaml:"max_connections"`
	// TrustedProxies are the load balancers and proxies (CIDR blocks or single addresses) whose
	// X-Forwarded-For and X-Real-IP headers name the client; the client is then the right-most
	// address of X-Forwarded-For that is not a trusted proxy. It is the address sign-in limits
	// and logs use. Default none: a client's address is its connection's, and forwarding
	// headers are ignored, since any client can send them.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// UpstreamConnectTimeout bounds dialing a worker. Default 2s.
	UpstreamConnectTimeout time.Duration `yaml:"upstream_connect_timeout"`
	// UpstreamHeaderTimeout bounds the wait for a worker's response headers (time to first
	// byte, queueing inside the worker included). Default 10m.
	UpstreamHeaderTimeout time.Duration `yaml:"upstream_header_timeout"`
	// UpstreamIdleTimeout bounds how long a streamed answer may go without a byte from its worker,
	// its first event included: a worker silent that long is cut off, the client gets an error
	// event, and the attempt counts as the worker's failure (its circuit breaker sees it), so a
	// hung worker whose health check still passes is taken out. Default 60s.
	UpstreamIdleTimeout time.Duration `yaml:"upstream_idle_timeout"`
	// MaxAttempts is how many workers one request may try while nothing has reached the client
	// (connect error, 5xx). Default 3; 1 disables retries.
	MaxAttempts int `yaml:"max_attempts"`
	// DisablePreemption turns off the preemption of standard and batch requests for interactive
	// ones: by default, an interactive request that finds no room cancels the newest standard or
	// batch request whose answer has not begun to reach its client (non-streamed, or a stream
	// the worker has not begun) and that request waits in the queue again, ahead of its tenant's
	// later ones.
	DisablePreemption bool `yaml:"disable_preemption"`
	// DefaultMaxTokens bounds the output of a request that sets no output limit and whose tier
	// sets no expected_output_tokens: usher reserves it and sends it to the worker as
	// max_tokens, so the engine never generates more than was reserved. Default 256.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
	// ShutdownSettle is how long a stopping gateway keeps accepting and serving new requests
	// after /readyz turned 503, so that load balancers and Kubernetes endpoints stop sending
	// to it before it stops listening. Default 5s.
	ShutdownSettle time.Duration `yaml:"shutdown_settle"`
	// ShutdownGrace bounds how long in-flight requests may run once the settle time is over and
	// the listener closed; a stop takes at most ShutdownSettle + ShutdownGrace. Default 30s.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
}

// SetDefaults fills every zero field with its default.
func (c *Config) SetDefaults() {
	setDefault(&c.Listen, "127.0.0.1:8080")
	setDefault(&c.MaxBodyBytes, 8<<20)
	setDefault(&c.MaxBodyBytesHeld, 256<<20)
	setDefault(&c.MaxBodyBytesPerTenant, min(max(c.MaxBodyBytesHeld/4, c.MaxBodyBytes), c.MaxBodyBytesHeld))
	setDefault(&c.MaxJSONDepth, defaultMaxJSONDepth)
	setDefault(&c.MaxHeaderBytes, 64<<10)
	setDefault(&c.MaxResponseBytes, 64<<20)
	setDefault(&c.ReadHeaderTimeout, 10*time.Second)
	setDefault(&c.ReadTimeout, 60*time.Second)
	setDefault(&c.IdleTimeout, 120*time.Second)
	if c.MaxConnectionsPerClient == nil {
		n := 256
		c.MaxConnectionsPerClient = &n
	}
	setDefault(&c.UpstreamConnectTimeout, 2*time.Second)
	setDefault(&c.UpstreamHeaderTimeout, 10*time.Minute)
	setDefault(&c.UpstreamIdleTimeout, time.Minute)
	setDefault(&c.MaxAttempts, 3)
	setDefault(&c.DefaultMaxTokens, 256)
	setDefault(&c.ShutdownSettle, 5*time.Second)
	setDefault(&c.ShutdownGrace, 30*time.Second)
}

// defaultMaxJSONDepth is MaxJSONDepth's default.
const defaultMaxJSONDepth = 128

func setDefault[T comparable](field *T, value T) {
	var zero T
	if *field == zero {
		*field = value
	}
}

// Validate reports every invalid field, each error naming the field as it is written in YAML.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		errs = append(errs, fmt.Errorf("server.listen: %q is not host:port", c.Listen))
	}
	positive := []struct {
		name string
		ok   bool
	}{
		{"server.max_body_bytes", c.MaxBodyBytes > 0},
		{"server.max_header_bytes", c.MaxHeaderBytes > 0},
		{"server.max_response_bytes", c.MaxResponseBytes > 0},
		{"server.read_header_timeout", c.ReadHeaderTimeout > 0},
		{"server.read_timeout", c.ReadTimeout > 0},
		{"server.idle_timeout", c.IdleTimeout > 0},
		{"server.upstream_connect_timeout", c.UpstreamConnectTimeout > 0},
		{"server.upstream_header_timeout", c.UpstreamHeaderTimeout > 0},
		{"server.upstream_idle_timeout", c.UpstreamIdleTimeout > 0},
		{"server.max_attempts", c.MaxAttempts > 0},
		{"server.default_max_tokens", c.DefaultMaxTokens > 0},
		{"server.shutdown_settle", c.ShutdownSettle > 0},
		{"server.shutdown_grace", c.ShutdownGrace > 0},
	}
	for _, p := range positive {
		if !p.ok {
			errs = append(errs, fmt.Errorf("%s: must be positive", p.name))
		}
	}
	if c.MaxBodyBytesPerTenant < c.MaxBodyBytes || c.MaxBodyBytesPerTenant > c.MaxBodyBytesHeld {
		errs = append(errs, fmt.Errorf("server.max_body_bytes_per_tenant: must be from max_body_bytes (%d) to max_body_bytes_held (%d)",
			c.MaxBodyBytes, c.MaxBodyBytesHeld))
	}
	if c.MaxJSONDepth < 5 {
		errs = append(errs, errors.New("server.max_json_depth: must be at least 5 (a chat message's content parts nest 5 deep)"))
	}
	if c.MaxConnectionsPerClient != nil && *c.MaxConnectionsPerClient < 0 {
		errs = append(errs, errors.New("server.max_connections_per_client: must not be negative (0 turns the bound off)"))
	}
	if c.MaxConnections < 0 {
		errs = append(errs, errors.New("server.max_connections: must not be negative (0 derives it from the file descriptor limit)"))
	}
	if _, err := parseTrustedProxies(c.TrustedProxies); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
