package auth

import (
	"fmt"
	"net/netip"
	"strings"
)

// MaxForwardedHops bounds how many X-Forwarded-For entries are examined;
// a longer chain is answered with the last address examined, so a client
// cannot make every request walk an arbitrarily long header.
const MaxForwardedHops = 32

// ParsePrefixes parses CIDRs or bare addresses (a host prefix). IPv4-mapped
// IPv6 forms are unmapped so "::ffff:10.0.0.1" and "10.0.0.1" agree.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for i, s := range list {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			if p.Addr().Is4In6() && p.Bits() >= 96 {
				p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("entry %d: %q is not a CIDR or address", i, s)
		}
		a = Normalize(a)
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// Normalize unmaps IPv4-mapped IPv6 and drops any zone, the forms in which
// the same client can otherwise appear under two spellings.
func Normalize(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// Contains reports whether a is inside any prefix. An invalid address is
// never contained.
func Contains(ps []netip.Prefix, a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	a = Normalize(a)
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP resolves the client address of a connection from peer, the
// directly connected address. X-Forwarded-For values (each header line, in
// order) are believed only when peer is a trusted proxy, and then only as
// far as the chain stays trusted: walking from the right, the first address
// that is not itself a trusted proxy is the client. Entries to the left of
// it were written by the client and are ignored. An unparseable entry stops
// the walk at the last address known to be good.
func ClientIP(peer netip.Addr, forwardedFor []string, trusted []netip.Prefix) netip.Addr {
	peer = Normalize(peer)
	if len(trusted) == 0 || len(forwardedFor) == 0 || !Contains(trusted, peer) {
		return peer
	}
	client := peer
	hops := 0
	for i := len(forwardedFor) - 1; i >= 0; i-- {
		line := forwardedFor[i]
		for line != "" {
			var entry string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				entry, line = line, ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			hops++
			a, ok := parseForwarded(entry)
			if !ok {
				return client
			}
			client = a
			if !Contains(trusted, a) || hops >= MaxForwardedHops {
				return client
			}
		}
	}
	return client
}

// parseForwarded accepts an address, optionally with a port ("1.2.3.4:80",
// "[::1]:80"), as some proxies write one.
func parseForwarded(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return Normalize(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return Normalize(ap.Addr()), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return Normalize(a), true
		}
	}
	return netip.Addr{}, false
}
