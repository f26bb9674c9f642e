package ingress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/config"
)

// DestinationPolicy decides whether the gateway may carry a request to
// host (normalised: lower case, no trailing dot, no brackets). It returns a
// *DeniedError for a refusal; any other error means the decision could not
// be made (the client gets 502).
type DestinationPolicy interface {
	Allow(ctx context.Context, host string) error
}

// DeniedError is a policy refusal of a destination.
type DeniedError struct {
	Host string
	Addr netip.Addr
}

func (e *DeniedError) Error() string {
	if e.Addr.IsValid() && e.Addr.String() != e.Host {
		return fmt.Sprintf("checking destination %s: resolves to denied address %s", e.Host, e.Addr)
	}
	return fmt.Sprintf("checking destination %s: denied address", e.Host)
}

// Resolver is the part of *net.Resolver the policy uses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DefaultResolveTimeout bounds one destination lookup.
const DefaultResolveTimeout = 5 * time.Second

// basicDestinations is the foundation's guard: it refuses loopback,
// private, link-local, unspecified, "this network" and multicast
// destinations, and any configured denied range, whether written as an IP
// (any IPv4 spelling inet_aton accepts, IPv4-mapped IPv6) or resolving to
// one. allowLocal re-admits loopback and private ranges, for tests and the
// demo. The complete SSRF and rebinding guard (CGNAT, metadata services,
// pinning the resolved address) replaces it later.
type basicDestinations struct {
	allowLocal bool
	denied     []netip.Prefix
	resolver   Resolver
	timeout    time.Duration
}

// NewDestinationPolicy builds the foundation policy from the security
// section; resolver nil means net.DefaultResolver.
func NewDestinationPolicy(sec *config.Security, resolver Resolver) (DestinationPolicy, error) {
	d := &basicDestinations{allowLocal: sec.AllowLoopbackDestinations, resolver: resolver, timeout: DefaultResolveTimeout}
	if d.resolver == nil {
		d.resolver = net.DefaultResolver
	}
	for _, c := range sec.DeniedCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("parsing security.deniedCIDRs entry %q: %w", c, err)
		}
		d.denied = append(d.denied, p.Masked())
	}
	return d, nil
}

var thisNetwork = netip.MustParsePrefix("0.0.0.0/8")

func (d *basicDestinations) deniedAddr(ip netip.Addr) bool {
	ip = ip.Unmap()
	if ip.IsUnspecified() || thisNetwork.Contains(ip) || ip.IsMulticast() ||
		ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() {
		return true
	}
	for _, p := range d.denied {
		if p.Contains(ip) {
			return true
		}
	}
	if ip.IsLoopback() || ip.IsPrivate() {
		return !d.allowLocal
	}
	return false
}

func (d *basicDestinations) Allow(ctx context.Context, host string) error {
	if ip, ok := ParseIPLiteral(host); ok {
		if d.deniedAddr(ip) {
			return &DeniedError{Host: host, Addr: ip}
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	addrs, err := d.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("checking destination %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return fmt.Errorf("checking destination %s: no address", host)
	}
	// Any denied address refuses the name: a name that resolves to both a
	// public and a private address is a rebinding attempt or a mistake.
	for _, ip := range addrs {
		if d.deniedAddr(ip) {
			return &DeniedError{Host: host, Addr: ip.Unmap()}
		}
	}
	return nil
}

// ParseIPLiteral recognises host as an IP address in any spelling a
// resolver or an upstream proxy might accept: IPv6 (a zone is refused),
// dotted-quad IPv4, and the inet_aton forms (1 to 4 parts, each decimal,
// octal with a leading 0 or hex with 0x, e.g. "2130706433", "0x7f.1",
// "017700000001").
func ParseIPLiteral(host string) (netip.Addr, bool) {
	if ip, err := netip.ParseAddr(host); err == nil {
		if ip.Zone() != "" {
			return netip.Addr{}, false
		}
		return ip, true
	}
	return parseInetAton(host)
}

func parseInetAton(s string) (netip.Addr, bool) {
	if s == "" || len(s) > 64 {
		return netip.Addr{}, false
	}
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	var vals [4]uint64
	for i, p := range parts {
		if p == "" {
			return netip.Addr{}, false
		}
		base := 10
		switch {
		case len(p) > 2 && (p[:2] == "0x" || p[:2] == "0X"):
			base, p = 16, p[2:]
		case len(p) > 1 && p[0] == '0':
			base, p = 8, p[1:]
		}
		v, err := strconv.ParseUint(p, base, 32)
		if err != nil {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	n := len(parts)
	// Every part but the last is one byte; the last fills what remains.
	var out uint64
	for i := 0; i < n-1; i++ {
		if vals[i] > 0xff {
			return netip.Addr{}, false
		}
		out |= vals[i] << (8 * (3 - i))
	}
	last := vals[n-1]
	if last >= 1<<(8*(5-n)) {
		return netip.Addr{}, false
	}
	out |= last
	return netip.AddrFrom4([4]byte{byte(out >> 24), byte(out >> 16), byte(out >> 8), byte(out)}), true
}

// IsDenied reports whether err is a destination refusal.
func IsDenied(err error) bool {
	var de *DeniedError
	return errors.As(err, &de)
}

var _ DestinationPolicy = (*basicDestinations)(nil)
