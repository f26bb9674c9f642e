package netguard_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/netguard"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		addr string
		want netguard.Class
	}{
		{"93.184.216.34", netguard.Public},
		{"2606:2800:220:1:248:1893:25c8:1946", netguard.Public},
		{"0.0.0.0", netguard.Unspecified},
		{"::", netguard.Unspecified},
		{"0.1.2.3", netguard.ThisNetwork},
		{"127.0.0.1", netguard.Loopback},
		{"127.255.255.254", netguard.Loopback},
		{"::1", netguard.Loopback},
		{"10.0.0.1", netguard.Private},
		{"172.16.0.1", netguard.Private},
		{"172.31.255.255", netguard.Private},
		{"192.168.1.1", netguard.Private},
		{"169.254.1.1", netguard.LinkLocal},
		{"fe80::1", netguard.LinkLocal},
		{"100.64.0.1", netguard.CGNAT},
		{"100.127.255.255", netguard.CGNAT},
		{"224.0.0.1", netguard.Multicast},
		{"ff02::1", netguard.Multicast},
		{"255.255.255.255", netguard.Broadcast},
		{"240.0.0.1", netguard.Broadcast},
		{"169.254.169.254", netguard.Metadata},
		{"fd00:ec2::254", netguard.Metadata},
		{"100.100.100.200", netguard.Metadata},
		{"fd12:3456::1", netguard.UniqueLocal},
		{"fc00::1", netguard.UniqueLocal},
		{"fec0::1", netguard.SiteLocal},
		{"fe80::1%eth0", netguard.Zoned},
		{"::ffff:127.0.0.1", netguard.Loopback},
		{"::ffff:10.1.2.3", netguard.Private},
		{"::ffff:169.254.169.254", netguard.Metadata},
		{"::ffff:93.184.216.34", netguard.Public},
		{"::127.0.0.1", netguard.IPv4Compatible},
		{"::10.0.0.1", netguard.IPv4Compatible},
		{"64:ff9b::7f00:1", netguard.NAT64},
		{"64:ff9b::a9fe:a9fe", netguard.NAT64},
		{"64:ff9b::5db8:d822", netguard.Public},
		{"64:ff9b:1::1", netguard.NAT64},
		{"2002:7f00:1::1", netguard.SixToFour},
		{"2001:0:4136:e378:8000:63bf:3fff:fdd2", netguard.Teredo},
		{"2001:db8::5efe:7f00:1", netguard.ISATAP},
		{"2001:db8::200:5efe:a00:1", netguard.ISATAP},
		{"2001:db8::1", netguard.Public},
	}
	for _, tc := range tests {
		t.Run(tc.addr, func(t *testing.T) {
			got := netguard.Classify(netip.MustParseAddr(tc.addr))
			if got != tc.want {
				t.Fatalf("Classify(%s) = %s, want %s", tc.addr, got, tc.want)
			}
			if got.Internal() != (tc.want != netguard.Public) {
				t.Fatal("Internal disagrees with the class")
			}
		})
	}
	if netguard.Classify(netip.Addr{}) != netguard.Invalid {
		t.Fatal("zero address not Invalid")
	}
}

func TestParseHost(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"127.0.0.1.", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0X7F.1", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"10.1.65535", "10.1.255.255"},
		{"0", "0.0.0.0"},
		{"[::1]", "::1"},
		{"::ffff:10.0.0.1", "::ffff:10.0.0.1"},
		{"[fe80::1%25eth0]", "fe80::1%eth0"},
		{"fe80::1%eth0", "fe80::1%eth0"},
		{"example.com", ""},
		{"1.2.3.4.5", ""},
		{"256.1.1.1", ""},
		{"1.2.65536", ""},
		{"0x", ""},
		{"08", ""},
		{"deadbeef", ""},
		{"-1", ""},
		{"+1", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			ip, ok := netguard.ParseHost(tc.in)
			if tc.want == "" {
				if ok {
					t.Fatalf("parsed as %s", ip)
				}
				return
			}
			if !ok || ip.String() != tc.want {
				t.Fatalf("got %s %v, want %s", ip, ok, tc.want)
			}
		})
	}
}

// FuzzParseHost checks ParseHost against net/netip where both apply: any
// standard spelling netip accepts must parse to the same address.
func FuzzParseHost(f *testing.F) {
	for _, s := range []string{"127.0.0.1", "::1", "0x7f.1", "1.2.3.4.", "[::ffff:1.2.3.4]", "fe80::1%eth0", "017700000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ip, ok := netguard.ParseHost(s)
		if std, err := netip.ParseAddr(s); err == nil {
			if !ok || ip != std {
				t.Fatalf("ParseHost(%q) = %v %v, netip says %v", s, ip, ok, std)
			}
		}
		_ = netguard.Classify(ip)
	})
}

// fakeResolver answers from a table; it stands in for DNS, which a test on
// this machine cannot reach.
type fakeResolver map[string][]string

func (f fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	addrs, ok := f[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	var out []netip.Addr
	for _, a := range addrs {
		out = append(out, netip.MustParseAddr(a))
	}
	return out, nil
}

func TestGuardResolve(t *testing.T) {
	res := fakeResolver{
		"public.example":  {"93.184.216.34"},
		"private.example": {"10.0.0.5"},
		"mixed.example":   {"93.184.216.34", "192.168.1.1"},
		"localhost":       {"127.0.0.1", "::1"},
		"meta.example":    {"169.254.169.254"},
		"deny.example":    {"203.0.113.9"},
		"mapped.example":  {"::ffff:10.0.0.1"},
	}
	strict, err := netguard.FromConfig(&config.Security{DeniedCIDRs: []string{"203.0.113.0/24"}}, res)
	if err != nil {
		t.Fatal(err)
	}
	local, _ := netguard.FromConfig(&config.Security{AllowLoopbackDestinations: true}, res)
	local.SetSelf([]netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:8080")})
	tests := []struct {
		host       string
		port       uint16
		strictDeny bool
		localDeny  bool
		fail       bool
	}{
		{host: "public.example", port: 80},
		{host: "93.184.216.34", port: 80},
		{host: "private.example", port: 80, strictDeny: true, localDeny: true},
		{host: "mixed.example", port: 80, strictDeny: true, localDeny: true},
		{host: "mapped.example", port: 80, strictDeny: true, localDeny: true},
		{host: "localhost", port: 80, strictDeny: true},
		{host: "localhost.", port: 80, strictDeny: true},
		{host: "127.0.0.1", port: 80, strictDeny: true},
		{host: "127.0.0.1", port: 8080, strictDeny: true, localDeny: true}, // self
		{host: "2130706433", port: 8080, strictDeny: true, localDeny: true},
		{host: "::ffff:127.0.0.1", port: 80, strictDeny: true},
		{host: "::1", port: 80, strictDeny: true},
		{host: "10.1.2.3", port: 80, strictDeny: true, localDeny: true},
		{host: "meta.example", port: 80, strictDeny: true, localDeny: true},
		{host: "0.0.0.0", port: 80, strictDeny: true, localDeny: true},
		{host: "203.0.113.7", port: 80, strictDeny: true},
		{host: "deny.example", port: 80, strictDeny: true},
		{host: "nxdomain.example", port: 80, fail: true},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			for _, c := range []struct {
				name string
				g    *netguard.Guard
				deny bool
			}{{"strict", strict, tc.strictDeny}, {"allowLoopback", local, tc.localDeny}} {
				addrs, err := c.g.Resolve(context.Background(), tc.host, tc.port)
				switch {
				case tc.fail:
					if err == nil || netguard.IsDenied(err) {
						t.Fatalf("%s: err = %v, want a lookup failure", c.name, err)
					}
				case c.deny != netguard.IsDenied(err) || (!c.deny && err != nil):
					t.Fatalf("%s: err = %v, want denied=%v", c.name, err, c.deny)
				case !c.deny:
					for _, a := range addrs {
						if a.Port() != tc.port || c.g.CheckAddrPort(a) != nil {
							t.Fatalf("%s: returned unchecked %s", c.name, a)
						}
					}
				}
			}
		})
	}
}

func TestExpandSelf(t *testing.T) {
	got := netguard.ExpandSelf([]netip.AddrPort{netip.MustParseAddrPort("0.0.0.0:9000"), netip.MustParseAddrPort("192.0.2.1:80")})
	var loop, fixed bool
	for _, a := range got {
		loop = loop || a == netip.MustParseAddrPort("127.0.0.1:9000")
		fixed = fixed || a == netip.MustParseAddrPort("192.0.2.1:80")
	}
	if !loop || !fixed {
		t.Fatalf("ExpandSelf = %v", got)
	}
}
