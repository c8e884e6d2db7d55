package gateway

import (
	"net/http"
	"strings"
	"testing"
)

func TestClientAddrThroughTrustedProxies(t *testing.T) {
	trusted, err := parseTrustedProxies([]string{"10.0.0.0/8", "192.168.1.5", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		trusted trustedProxies
		remote  string
		xff     []string // X-Forwarded-For headers, in order
		realIP  string
		want    string
	}{
		{"no proxy trusted: headers ignored", nil, "203.0.113.9:4000", []string{"6.6.6.6"}, "7.7.7.7", "203.0.113.9"},
		{"untrusted connection spoofing X-Forwarded-For", trusted, "203.0.113.9:4000", []string{"6.6.6.6"}, "", "203.0.113.9"},
		{"untrusted connection spoofing X-Real-IP", trusted, "203.0.113.9:4000", nil, "7.7.7.7", "203.0.113.9"},
		{"untrusted connection spoofing a trusted address", trusted, "203.0.113.9:4000", []string{"10.0.0.1"}, "", "203.0.113.9"},
		{"one trusted proxy", trusted, "10.1.2.3:4000", []string{"198.51.100.7"}, "", "198.51.100.7"},
		{"a chain of trusted proxies", trusted, "10.1.2.3:4000", []string{"198.51.100.7, 192.168.1.5, 10.9.9.9"}, "", "198.51.100.7"},
		{"the client's own entries left of the right-most untrusted one are ignored", trusted,
			"10.1.2.3:4000", []string{"6.6.6.6, 10.0.0.1, 198.51.100.7"}, "", "198.51.100.7"},
		{"several X-Forwarded-For headers read as one list", trusted,
			"10.1.2.3:4000", []string{"6.6.6.6, 198.51.100.7", "10.0.0.2"}, "", "198.51.100.7"},
		{"every hop trusted: the left-most", trusted, "10.1.2.3:4000", []string{"10.0.0.7, 10.0.0.8"}, "", "10.0.0.7"},
		{"a garbage entry stops at the proxy that appended it", trusted,
			"10.1.2.3:4000", []string{"6.6.6.6, not-an-ip, 10.0.0.4"}, "", "10.0.0.4"},
		{"an empty entry stops too", trusted, "10.1.2.3:4000", []string{"198.51.100.7,"}, "", "10.1.2.3"},
		{"X-Real-IP from a trusted proxy without X-Forwarded-For", trusted, "10.1.2.3:4000", nil, "198.51.100.7", "198.51.100.7"},
		{"X-Forwarded-For wins over X-Real-IP", trusted, "10.1.2.3:4000", []string{"198.51.100.8"}, "198.51.100.7", "198.51.100.8"},
		{"a bad X-Real-IP is the proxy", trusted, "10.1.2.3:4000", nil, "nonsense", "10.1.2.3"},
		{"IPv6 proxy and client", trusted, "[2001:db8::1]:4000", []string{"2001:db9::5"}, "", "2001:db9::5"},
		{"IPv4-mapped connection address", trusted, "[::ffff:10.1.2.3]:4000", []string{"198.51.100.7"}, "", "198.51.100.7"},
		{"a remote address that is not host:port", trusted, "pipe", []string{"198.51.100.7"}, "", "pipe"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, _ := http.NewRequest("GET", "/", nil)
			r.RemoteAddr = tt.remote
			for _, v := range tt.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if tt.realIP != "" {
				r.Header.Set("X-Real-IP", tt.realIP)
			}
			if got := tt.trusted.clientAddr(r); got != tt.want {
				t.Errorf("got %s, want %s", got, tt.want)
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	if _, err := parseTrustedProxies([]string{"10.0.0.0/8", "::1", " 127.0.0.1 "}); err != nil {
		t.Fatalf("good list: %v", err)
	}
	_, err := parseTrustedProxies([]string{"10.0.0.0/8", "10.0.0.0/33"})
	if err == nil || !strings.Contains(err.Error(), "server.trusted_proxies[1]") {
		t.Fatalf("bad CIDR: got %v, want an error naming server.trusted_proxies[1]", err)
	}
	cfg := Config{TrustedProxies: []string{"nonsense"}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `server.trusted_proxies[0]: "nonsense"`) {
		t.Fatalf("Validate: got %v, want the bad entry named", err)
	}
}

// A client cannot choose the address the gateway knows it by: Echo's RealIP on the data plane is
// the connection's address unless it comes from a trusted proxy.
func TestServerClientAddrIgnoresSpoofedHeaders(t *testing.T) {
	for _, tt := range []struct {
		name    string
		trusted []string
		want    string
	}{
		{"no trusted proxy", nil, "127.0.0.1"},
		{"loopback trusted", []string{"127.0.0.0/8"}, "198.51.100.7"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := startGateway(t, nil, func(c *Config) { c.TrustedProxies = tt.trusted }).srv
			r, _ := http.NewRequest("GET", "/v1/models", nil)
			r.RemoteAddr = "127.0.0.1:5555"
			r.Header.Set("X-Forwarded-For", "198.51.100.7")
			r.Header.Set("X-Real-IP", "6.6.6.6")
			if got := s.ClientAddr(r); got != tt.want {
				t.Errorf("ClientAddr: got %s, want %s", got, tt.want)
			}
			if got := s.echo.NewContext(r, nil).RealIP(); got != tt.want {
				t.Errorf("RealIP: got %s, want %s", got, tt.want)
			}
		})
	}
}
