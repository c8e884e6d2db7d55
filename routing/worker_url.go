package routing

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// metadataNames are the names clouds give their instance metadata services (lowercase, without
// a trailing dot). Their link-local addresses are refused by address.
var metadataNames = map[string]bool{
	"metadata.google.internal": true, "metadata.goog": true, "metadata": true, // Google Cloud
	"instance-data": true, "instance-data.ec2.internal": true, // AWS
	"metadata.tencentyun.com":      true, // Tencent Cloud
	"metadata.platformequinix.com": true, // Equinix Metal
}

// metadataAddrs are metadata services outside the link-local ranges.
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("fd00:ec2::254"):   true, // AWS over IPv6
	netip.MustParseAddr("100.100.100.200"): true, // Alibaba Cloud
}

// checkWorkerHost refuses, unless allowed, a worker URL whose host is a link-local address
// (169.254.0.0/16, fe80::/10, also written as an IPv4-mapped IPv6 address or in the decimal,
// octal or hexadecimal forms C's inet_aton reads) or a cloud's instance metadata service: a
// worker there would let whoever adds workers through the admin API read the cloud's
// credentials through usher's health checks, scrapes and proxy. A name that merely resolves to
// such an address is not caught here (see Config.AllowLinkLocalWorkers).
func checkWorkerHost(raw string, allowed bool) error {
	if allowed {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil // parseWorkerURL reports it
	}
	host := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if metadataNames[host] {
		return fmt.Errorf("%q is a cloud metadata service; set routing.allow_link_local_workers to add it", host)
	}
	addr, ok := hostAddr(host)
	if ok && (addr.IsLinkLocalUnicast() || metadataAddrs[addr]) {
		return fmt.Errorf("%s is a link-local or cloud metadata address; set routing.allow_link_local_workers to add it", addr)
	}
	return nil
}

// hostAddr parses host as an IP address, in every form a resolver may read as one.
func hostAddr(host string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(host); err == nil {
		return a.WithZone("").Unmap(), true
	}
	return inetAton(host)
}

// inetAton parses the IPv4 forms of C's inet_aton ("a.b.c.d", "a.b.c", "a.b", "a", each part
// decimal, octal with a leading 0 or hexadecimal with 0x), which some resolvers accept as
// addresses: 2852039166 and 0xa9.0xfe.0xa9.0xfe are 169.254.169.254.
func inetAton(host string) (netip.Addr, bool) {
	parts := strings.Split(host, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		base := 10
		switch {
		case strings.HasPrefix(p, "0x"):
			p, base = p[2:], 16
		case len(p) > 1 && p[0] == '0':
			p, base = p[1:], 8
		}
		v, err := strconv.ParseUint(p, base, 32)
		if p == "" || err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	// The last part fills the bytes the others leave.
	var n uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		n |= v << (8 * (3 - i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*(5-len(vals))) {
		return netip.Addr{}, false
	}
	n |= last
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}), true
}
