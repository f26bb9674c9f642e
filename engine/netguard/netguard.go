package netguard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/proxypool/proxypool/engine/config"
)

// Class is what an address is, as far as destination policy cares.
type Class uint8

// Classes. Public is the only one Internal reports false for.
const (
	Public Class = iota
	Unspecified
	Loopback
	Private
	LinkLocal
	CGNAT
	Multicast
	// Broadcast covers 255.255.255.255 and the rest of 240.0.0.0/4.
	Broadcast
	Metadata
	UniqueLocal
	// SiteLocal is the deprecated fec0::/10.
	SiteLocal
	// Zoned is any address with a zone: it names an interface, so it
	// is local by construction.
	Zoned
	IPv4Compatible
	NAT64
	SixToFour
	Teredo
	ISATAP
	// ThisNetwork is 0.0.0.0/8 other than 0.0.0.0 itself.
	ThisNetwork
	Invalid
	numClasses
)

var classNames = [numClasses]string{
	Public: "public", Unspecified: "unspecified", Loopback: "loopback", Private: "private",
	LinkLocal: "link-local", CGNAT: "cgnat", Multicast: "multicast", Broadcast: "broadcast",
	Metadata: "metadata", UniqueLocal: "unique-local", SiteLocal: "site-local", Zoned: "zoned",
	IPv4Compatible: "ipv4-compatible", NAT64: "nat64", SixToFour: "6to4", Teredo: "teredo",
	ISATAP: "isatap", ThisNetwork: "this-network", Invalid: "invalid",
}

func (c Class) String() string {
	if c < numClasses {
		return classNames[c]
	}
	return "unknown"
}

// Internal reports whether c points at something that is not the public
// internet.
func (c Class) Internal() bool { return c != Public }

var (
	metadata = []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
		netip.MustParseAddr("fd00:ec2::254"),   // AWS IPv6
		netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
		netip.MustParseAddr("169.254.170.2"),   // AWS ECS task metadata
	}
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	cgnat       = netip.MustParsePrefix("100.64.0.0/10")
	reserved4   = netip.MustParsePrefix("240.0.0.0/4")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	nat64Local  = netip.MustParsePrefix("64:ff9b:1::/48")
	sixToFour   = netip.MustParsePrefix("2002::/16")
	teredo      = netip.MustParsePrefix("2001::/32")
	uniqueLocal = netip.MustParsePrefix("fc00::/7")
	siteLocal   = netip.MustParsePrefix("fec0::/10")
)

// Classify says what ip is. IPv4-mapped IPv6 is classified as the IPv4
// address it carries; NAT64 (64:ff9b::/96) as NAT64 when the embedded
// address is internal and Public otherwise; the local-use NAT64 prefix,
// IPv4-compatible, 6to4, Teredo and ISATAP forms are always internal (they
// are transition mechanisms no destination legitimately needs here, and
// each can smuggle an internal IPv4 address).
func Classify(ip netip.Addr) Class {
	if !ip.IsValid() {
		return Invalid
	}
	if ip.Zone() != "" {
		return Zoned
	}
	ip = ip.Unmap()
	for _, m := range metadata {
		if ip == m {
			return Metadata
		}
	}
	if ip.Is4() {
		return classify4(ip)
	}
	switch {
	case ip.IsUnspecified():
		return Unspecified
	case ip.IsLoopback():
		return Loopback
	case ip.IsMulticast():
		return Multicast
	case ip.IsLinkLocalUnicast():
		return LinkLocal
	case uniqueLocal.Contains(ip):
		return UniqueLocal
	case siteLocal.Contains(ip):
		return SiteLocal
	case nat64.Contains(ip):
		if classify4(embedded(ip, 12)).Internal() {
			return NAT64
		}
		return Public
	case nat64Local.Contains(ip):
		return NAT64
	case sixToFour.Contains(ip):
		return SixToFour
	case teredo.Contains(ip):
		return Teredo
	}
	b := ip.As16()
	if isZero(b[:12]) {
		// ::a.b.c.d (:: and ::1 were handled above).
		return IPv4Compatible
	}
	if (b[8]|0x02) == 0x02 && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe {
		return ISATAP
	}
	return Public
}

func classify4(ip netip.Addr) Class {
	switch {
	case ip.IsUnspecified():
		return Unspecified
	case thisNetwork.Contains(ip):
		return ThisNetwork
	case ip.IsLoopback():
		return Loopback
	case ip.IsPrivate():
		return Private
	case ip.IsLinkLocalUnicast():
		return LinkLocal
	case cgnat.Contains(ip):
		return CGNAT
	case ip.IsMulticast():
		return Multicast
	case reserved4.Contains(ip):
		return Broadcast
	}
	return Public
}

func embedded(ip netip.Addr, at int) netip.Addr {
	b := ip.As16()
	return netip.AddrFrom4([4]byte{b[at], b[at+1], b[at+2], b[at+3]})
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// DeniedError is a refusal of a destination. Class is Public when the
// refusal came from a configured deny range or a self-connection.
type DeniedError struct {
	Host  string
	Addr  netip.Addr
	Class Class
	// Why is "class", "deniedCIDRs" or "self".
	Why string
}

func (e *DeniedError) Error() string {
	what := e.Class.String()
	if e.Why != "class" {
		what = e.Why
	}
	if e.Host != "" && e.Host != e.Addr.String() {
		return fmt.Sprintf("checking destination %s: resolves to denied address %s (%s)", e.Host, e.Addr, what)
	}
	return fmt.Sprintf("checking destination %s: denied (%s)", e.Addr, what)
}

// IsDenied reports whether err is a destination refusal.
func IsDenied(err error) bool {
	var de *DeniedError
	return errors.As(err, &de)
}

// Resolver is the part of *net.Resolver a Guard uses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// DefaultResolveTimeout bounds one lookup.
const DefaultResolveTimeout = 5 * time.Second

// MaxAddrs bounds the addresses Resolve checks and returns for one name.
const MaxAddrs = 16

// Options build a Guard.
type Options struct {
	// AllowLoopback admits the Loopback class (and nothing else internal):
	// security.allowLoopbackDestinations, for tests and the demo.
	AllowLoopback bool
	// Denied are extra ranges refused whatever their class
	// (security.deniedCIDRs).
	Denied []netip.Prefix
	// Resolver resolves names; nil means net.DefaultResolver.
	Resolver Resolver
	// ResolveTimeout bounds one lookup; 0 means DefaultResolveTimeout.
	ResolveTimeout time.Duration
}

// Guard applies destination policy. It is immutable but for the set of
// self addresses, which the gateway updates as it binds listeners.
type Guard struct {
	allowLoopback bool
	denied        []netip.Prefix
	resolver      Resolver
	timeout       time.Duration
	self          atomic.Pointer[[]netip.AddrPort]
}

// New returns a Guard.
func New(o Options) *Guard {
	g := &Guard{allowLoopback: o.AllowLoopback, resolver: o.Resolver, timeout: o.ResolveTimeout}
	for _, p := range o.Denied {
		g.denied = append(g.denied, unmapPrefix(p))
	}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	if g.timeout <= 0 {
		g.timeout = DefaultResolveTimeout
	}
	return g
}

// FromConfig builds the Guard of a security section.
func FromConfig(sec *config.Security, r Resolver) (*Guard, error) {
	o := Options{AllowLoopback: sec.AllowLoopbackDestinations, Resolver: r}
	for _, c := range sec.DeniedCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			a, aerr := netip.ParseAddr(c)
			if aerr != nil {
				return nil, fmt.Errorf("parsing security.deniedCIDRs entry %q: %w", c, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		o.Denied = append(o.Denied, p)
	}
	return New(o), nil
}

func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	return p.Masked()
}

// SetSelf records the addresses the gateway listens on. An unspecified
// listener address stands for every local address: the caller expands it
// (see ExpandSelf).
func (g *Guard) SetSelf(addrs []netip.AddrPort) {
	cp := append([]netip.AddrPort(nil), addrs...)
	for i := range cp {
		cp[i] = netip.AddrPortFrom(cp[i].Addr().Unmap().WithZone(""), cp[i].Port())
	}
	g.self.Store(&cp)
}

// Self returns the recorded self addresses.
func (g *Guard) Self() []netip.AddrPort {
	if p := g.self.Load(); p != nil {
		return *p
	}
	return nil
}

// ExpandSelf turns listener addresses into the addresses a connection to
// them could use: a wildcard listener becomes every interface address plus
// loopback, on its port.
func ExpandSelf(listeners []netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	var ifaddrs []netip.Addr
	loaded := false
	for _, l := range listeners {
		a := l.Addr().Unmap()
		if !a.IsUnspecified() {
			out = append(out, netip.AddrPortFrom(a, l.Port()))
			continue
		}
		if !loaded {
			loaded = true
			ifaddrs = append(ifaddrs, netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback())
			if as, err := net.InterfaceAddrs(); err == nil {
				for _, ia := range as {
					if pn, ok := ia.(*net.IPNet); ok {
						if x, ok := netip.AddrFromSlice(pn.IP); ok {
							ifaddrs = append(ifaddrs, x.Unmap())
						}
					}
				}
			}
		}
		for _, x := range ifaddrs {
			out = append(out, netip.AddrPortFrom(x, l.Port()))
		}
	}
	return out
}

// CheckAddr decides on one address, without a port: nil, or a
// *DeniedError.
func (g *Guard) CheckAddr(ip netip.Addr) error {
	c := Classify(ip)
	if c.Internal() && !(c == Loopback && g.allowLoopback) {
		return &DeniedError{Addr: ip, Class: c, Why: "class"}
	}
	u := ip.Unmap()
	for _, p := range g.denied {
		if p.Contains(u) {
			return &DeniedError{Addr: ip, Class: c, Why: "deniedCIDRs"}
		}
	}
	return nil
}

// CheckAddrPort is CheckAddr plus the self-connection rule.
func (g *Guard) CheckAddrPort(ap netip.AddrPort) error {
	if err := g.CheckAddr(ap.Addr()); err != nil {
		return err
	}
	u := ap.Addr().Unmap()
	for _, s := range g.Self() {
		if s.Port() == ap.Port() && s.Addr() == u {
			return &DeniedError{Addr: ap.Addr(), Class: Classify(ap.Addr()), Why: "self"}
		}
	}
	return nil
}

// Resolve checks host:port and returns the addresses traffic may go to. A
// host that is an address in any spelling (see ParseHost) is checked as
// such; a name is resolved and refused if any of its addresses is refused
// (a name answering both public and internal addresses is a rebinding
// attempt or a mistake). The returned addresses are the only ones a direct
// dial may use. A refusal is a *DeniedError; any other error means the
// decision could not be made.
func (g *Guard) Resolve(ctx context.Context, host string, port uint16) ([]netip.AddrPort, error) {
	if ip, ok := ParseHost(host); ok {
		ap := netip.AddrPortFrom(ip, port)
		if err := g.CheckAddrPort(ap); err != nil {
			setHost(err, host)
			return nil, err
		}
		return []netip.AddrPort{netip.AddrPortFrom(ip.Unmap(), port)}, nil
	}
	name := strings.TrimSuffix(host, ".")
	if name == "" {
		return nil, fmt.Errorf("checking destination: empty host")
	}
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	addrs, err := g.resolver.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, fmt.Errorf("checking destination %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("checking destination %s: no address", host)
	}
	if len(addrs) > MaxAddrs {
		addrs = addrs[:MaxAddrs]
	}
	out := make([]netip.AddrPort, 0, len(addrs))
	for _, ip := range addrs {
		ap := netip.AddrPortFrom(ip, port)
		if err := g.CheckAddrPort(ap); err != nil {
			setHost(err, host)
			return nil, err
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), port))
	}
	return out, nil
}

func setHost(err error, host string) {
	var de *DeniedError
	if errors.As(err, &de) {
		de.Host = host
	}
}

// ParseHost recognises host as an IP address in any spelling a resolver or
// an upstream proxy might accept: brackets, a trailing dot, an IPv6 zone
// (kept, so the address classifies as Zoned; "%25" is unescaped),
// dotted-quad IPv4 and the inet_aton forms (1 to 4 parts, each decimal,
// octal with a leading 0 or hex with 0x, e.g. "2130706433", "0x7f.1",
// "017700000001").
func ParseHost(host string) (netip.Addr, bool) {
	h := host
	if len(h) >= 2 && h[0] == '[' && h[len(h)-1] == ']' {
		h = h[1 : len(h)-1]
	}
	if strings.Contains(h, ":") {
		h = strings.Replace(h, "%25", "%", 1)
		ip, err := netip.ParseAddr(h)
		return ip, err == nil
	}
	h = strings.TrimSuffix(h, ".")
	if ip, err := netip.ParseAddr(h); err == nil {
		return ip, true
	}
	return parseInetAton(h)
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
