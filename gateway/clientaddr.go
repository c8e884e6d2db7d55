package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// trustedProxies are the networks whose connections may say which client they forward for
// (Config.TrustedProxies). The zero value trusts no one.
type trustedProxies []netip.Prefix

// parseTrustedProxies reads server.trusted_proxies: each entry a CIDR block or one address.
func parseTrustedProxies(list []string) (trustedProxies, error) {
	var t trustedProxies
	for i, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			t = append(t, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("server.trusted_proxies[%d]: %q is neither a CIDR block nor an IP address", i, s)
		}
		a = a.Unmap()
		t = append(t, netip.PrefixFrom(a, a.BitLen()))
	}
	return t, nil
}

func (t trustedProxies) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// clientAddr is the address of the client that sent r. It is the connection's address unless
// the connection comes from a trusted proxy; then X-Forwarded-For is read from the right (each
// proxy appends the address it was connected from) past the trusted proxies, and the first
// address that is not one is the client; without X-Forwarded-For, a valid X-Real-IP is. An
// entry that is not an IP address ends the walk at the proxy that appended it, so a client can
// never name an address of its choosing, only be known by the last proxy that vouched for it.
// Cost: one pass over the header's entries, none when no proxy is trusted.
func (t trustedProxies) clientAddr(r *http.Request) string {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
			return host
		}
		return r.RemoteAddr
	}
	addr := peer.Addr().Unmap()
	if len(t) == 0 || !t.contains(addr) {
		return addr.String()
	}
	forwarded := r.Header.Values("X-Forwarded-For")
	if len(forwarded) == 0 {
		if real, err := netip.ParseAddr(strings.TrimSpace(r.Header.Get("X-Real-IP"))); err == nil {
			return real.Unmap().String()
		}
		return addr.String()
	}
	for i := len(forwarded) - 1; i >= 0; i-- {
		hops := forwarded[i]
		for hops != "" {
			var hop string
			if j := strings.LastIndexByte(hops, ','); j >= 0 {
				hops, hop = hops[:j], hops[j+1:]
			} else {
				hops, hop = "", hops
			}
			next, err := netip.ParseAddr(strings.TrimSpace(hop))
			if err != nil {
				return addr.String()
			}
			addr = next.Unmap()
			if !t.contains(addr) {
				return addr.String()
			}
		}
	}
	return addr.String()
}

// ClientAddr is the address of the client that sent r: its connection's, or the one the trusted
// proxies in server.trusted_proxies name (see Config.TrustedProxies). The admin plane's sign-in
// limits and logs use it; it is Echo's IPExtractor on the data plane. Safe for concurrent use.
func (s *Server) ClientAddr(r *http.Request) string { return s.trusted.clientAddr(r) }
