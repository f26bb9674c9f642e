package ingress

import (
	"fmt"
	"net/netip"
)

// AccessList admits clients by source address, independent of auth. An
// empty list admits everyone.
type AccessList struct {
	prefixes []netip.Prefix
}

// NewAccessList parses CIDRs (a bare address is a /32 or /128).
func NewAccessList(cidrs []string) (*AccessList, error) {
	a := &AccessList{}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			addr, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("parsing access.allowCIDRs entry %q: %w", c, err)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		a.prefixes = append(a.prefixes, p.Masked())
	}
	return a, nil
}

// Allowed reports whether remoteAddr (host:port as http.Request.RemoteAddr
// has it) may use the gateway.
func (a *AccessList) Allowed(remoteAddr string) bool {
	if a == nil || len(a.prefixes) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range a.prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}
