package ingress

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/config"
)

func TestCleanHeader(t *testing.T) {
	src := http.Header{
		"Accept":              {"*/*"},
		"Connection":          {"keep-alive, X-Secret-Hop", "x-other-hop"},
		"X-Secret-Hop":        {"1"},
		"X-Other-Hop":         {"1"},
		"Proxy-Authorization": {"Basic Zm9vOmJhcg=="},
		"Proxy-Connection":    {"keep-alive"},
		"Keep-Alive":          {"timeout=5"},
		"Te":                  {"trailers"},
		"Trailer":             {"X-T"},
		"Transfer-Encoding":   {"chunked"},
		"Upgrade":             {"websocket"},
		"Proxy-Authenticate":  {"Basic"},
		"X-Keep":              {"yes"},
	}
	got := cleanHeader(src)
	want := map[string]bool{"Accept": true, "X-Keep": true}
	if len(got) != len(want) {
		t.Fatalf("kept %v", got)
	}
	for k := range got {
		if !want[k] {
			t.Fatalf("kept %s", k)
		}
	}
	if len(src) != 13 {
		t.Fatal("source header modified")
	}
}

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		in       string
		def      uint16
		host     string
		port     uint16
		wantFail bool
	}{
		{in: "Example.COM.:443", host: "example.com", port: 443},
		{in: "example.com", def: 80, host: "example.com", port: 80},
		{in: "example.com", wantFail: true},
		{in: "[::1]:8080", host: "::1", port: 8080},
		{in: "[::FFFF:127.0.0.1]:80", host: "::ffff:127.0.0.1", port: 80},
		{in: "[::1]", def: 80, host: "::1", port: 80},
		{in: "::1", def: 80, wantFail: true},
		{in: "[fe80::1%eth0]:80", wantFail: true},
		{in: "example.com:0", wantFail: true},
		{in: "example.com:65536", wantFail: true},
		{in: "example.com:+80", wantFail: true},
		{in: "exa mple.com:80", wantFail: true},
		{in: "a..b:80", wantFail: true},
		{in: ":80", wantFail: true},
		{in: "", def: 80, wantFail: true},
		{in: strings.Repeat("a", 254) + ":80", wantFail: true},
		{in: "under_score.example:80", host: "under_score.example", port: 80},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			host, port, err := ParseAuthority(tc.in, tc.def)
			if tc.wantFail {
				if err == nil {
					t.Fatalf("accepted as %q %d", host, port)
				}
				return
			}
			if err != nil || host != tc.host || port != tc.port {
				t.Fatalf("got %q %d %v, want %q %d", host, port, err, tc.host, tc.port)
			}
		})
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"example.com:443", "[::1]:80", "a.b.", "x:y:z", "[]:1", "%00:1", "0x7f.1:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		host, port, err := ParseAuthority(in, 80)
		if err != nil {
			return
		}
		if host == "" || port == 0 || strings.HasSuffix(host, ".") || host != strings.ToLower(host) {
			t.Fatalf("%q -> %q %d", in, host, port)
		}
		// The normalised form is a fixed point.
		h2, p2, err := ParseAuthority(joinAuthority(host, port), 0)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q -> %q %d does not round-trip: %q %d %v", in, host, port, h2, p2, err)
		}
	})
}

func TestParseBasic(t *testing.T) {
	tests := []struct {
		h          string
		user, pass string
		ok         bool
	}{
		{"Basic YWxpY2U6czNjcmV0", "alice", "s3cret", true},
		{"basic YWxpY2U6czNjcmV0", "alice", "s3cret", true},
		{"Basic YWxpY2U6", "alice", "", true},
		{"Basic YWxpY2U6YTpi", "alice", "a:b", true},
		{"Basic OnBhc3M=", "", "", false}, // empty user
		{"Basic YWxpY2U=", "", "", false}, // no colon
		{"Basic !!!", "", "", false},
		{"Bearer abc", "", "", false},
		{"Basic", "", "", false},
		{"", "", "", false},
		{"Basic " + strings.Repeat("A", 2000), "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.h, func(t *testing.T) {
			u, p, ok := ParseBasic(tc.h)
			if ok != tc.ok || u != tc.user || p != tc.pass {
				t.Fatalf("got %q %q %v", u, p, ok)
			}
		})
	}
}

func FuzzParseBasic(f *testing.F) {
	f.Add("Basic YWxpY2U6czNjcmV0")
	f.Add("basic Og==")
	f.Fuzz(func(t *testing.T, h string) {
		u, p, ok := ParseBasic(h)
		if !ok {
			return
		}
		if u == "" || strings.Contains(u, ":") {
			t.Fatalf("%q -> user %q", h, u)
		}
		// Differential oracle: net/http's own Basic parser on the same
		// credentials (it reads Authorization; the scheme is the same).
		r := &http.Request{Header: http.Header{"Authorization": {h}}}
		u2, p2, ok2 := r.BasicAuth()
		if ok2 && (u2 != u || p2 != p) {
			t.Fatalf("%q: ours %q/%q, net/http %q/%q", h, u, p, u2, p2)
		}
	})
}

func TestParseIPLiteral(t *testing.T) {
	tests := []struct {
		in   string
		want string
	}{
		{"127.0.0.1", "127.0.0.1"},
		{"2130706433", "127.0.0.1"},
		{"0x7f000001", "127.0.0.1"},
		{"0x7f.1", "127.0.0.1"},
		{"0177.0.0.1", "127.0.0.1"},
		{"017700000001", "127.0.0.1"},
		{"127.1", "127.0.0.1"},
		{"10.1.65535", "10.1.255.255"},
		{"::ffff:10.0.0.1", "::ffff:10.0.0.1"},
		{"0", "0.0.0.0"},
		{"example.com", ""},
		{"1.2.3.4.5", ""},
		{"256.1.1.1", ""},
		{"1.2.65536", ""},
		{"0x", ""},
		{"08", ""},
		{"deadbeef", ""},
		{"fe80::1%eth0", ""},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			ip, ok := ParseIPLiteral(tc.in)
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

// fakeResolver answers from a table; it stands in for DNS, not for the
// network under test.
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

func TestDestinationPolicy(t *testing.T) {
	res := fakeResolver{
		"public.example":  {"93.184.216.34"},
		"private.example": {"10.0.0.5"},
		"mixed.example":   {"93.184.216.34", "192.168.1.1"},
		"localhost":       {"127.0.0.1", "::1"},
		"meta.example":    {"169.254.169.254"},
		"deny.example":    {"203.0.113.9"},
	}
	strict, _ := NewDestinationPolicy(&config.Security{DeniedCIDRs: []string{"203.0.113.0/24"}}, res)
	local, _ := NewDestinationPolicy(&config.Security{AllowLoopbackDestinations: true}, res)
	tests := []struct {
		host       string
		strictDeny bool
		localDeny  bool
		fail       bool
	}{
		{host: "public.example"},
		{host: "93.184.216.34"},
		{host: "private.example", strictDeny: true},
		{host: "mixed.example", strictDeny: true},
		{host: "localhost", strictDeny: true},
		{host: "127.0.0.1", strictDeny: true},
		{host: "2130706433", strictDeny: true},
		{host: "::ffff:127.0.0.1", strictDeny: true},
		{host: "::1", strictDeny: true},
		{host: "10.1.2.3", strictDeny: true},
		{host: "fd00::1", strictDeny: true},
		{host: "meta.example", strictDeny: true, localDeny: true},
		{host: "169.254.169.254", strictDeny: true, localDeny: true},
		{host: "0.0.0.0", strictDeny: true, localDeny: true},
		{host: "0.1.2.3", strictDeny: true, localDeny: true},
		{host: "224.0.0.1", strictDeny: true, localDeny: true},
		{host: "ff02::1", strictDeny: true, localDeny: true},
		{host: "203.0.113.7", strictDeny: true},
		{host: "deny.example", strictDeny: true},
		{host: "nxdomain.example", fail: true},
	}
	for _, tc := range tests {
		t.Run(tc.host, func(t *testing.T) {
			for _, c := range []struct {
				name string
				p    DestinationPolicy
				deny bool
			}{{"strict", strict, tc.strictDeny}, {"allowLoopback", local, tc.localDeny}} {
				err := c.p.Allow(context.Background(), tc.host)
				switch {
				case tc.fail:
					if err == nil || IsDenied(err) {
						t.Fatalf("%s: err = %v, want a lookup failure", c.name, err)
					}
				case c.deny != IsDenied(err) || (!c.deny && err != nil):
					t.Fatalf("%s: err = %v, want denied=%v", c.name, err, c.deny)
				}
			}
		})
	}
}

func TestAccessList(t *testing.T) {
	a, err := NewAccessList([]string{"10.0.0.0/8", "192.0.2.7", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		remote string
		ok     bool
	}{
		{"10.1.2.3:5555", true},
		{"192.0.2.7:1", true},
		{"192.0.2.8:1", false},
		{"[::ffff:10.0.0.1]:80", true},
		{"[2001:db8::1]:80", true},
		{"[2001:db9::1]:80", false},
		{"garbage", false},
	}
	for _, tc := range tests {
		t.Run(tc.remote, func(t *testing.T) {
			if got := a.Allowed(tc.remote); got != tc.ok {
				t.Fatalf("allowed = %v", got)
			}
		})
	}
	if _, err := NewAccessList([]string{"nope"}); err == nil {
		t.Fatal("bad CIDR accepted")
	}
	empty, _ := NewAccessList(nil)
	if !empty.Allowed("203.0.113.1:1") {
		t.Fatal("empty list refuses")
	}
}

func TestAuthenticators(t *testing.T) {
	users := []config.User{{Username: "alice"}}
	if err := users[0].Password.UnmarshalText([]byte("env:PROXYPOOL_TEST_GW_PASS")); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PROXYPOOL_TEST_GW_PASS", "s3cret")
	if err := users[0].Password.Resolve(); err != nil {
		t.Fatal(err)
	}
	up, err := NewAuthenticator(&config.Auth{Mode: "usernamePassword", Users: users})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		header string
		who    string
		ok     bool
	}{
		{"Basic YWxpY2U6czNjcmV0", "alice", true},
		{"Basic YWxpY2U6d3Jvbmc=", "", false},
		{"Basic Ym9iOnMzY3JldA==", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.header, func(t *testing.T) {
			r := &http.Request{Header: http.Header{}}
			if tc.header != "" {
				r.Header.Set("Proxy-Authorization", tc.header)
			}
			p, err := up.Authenticate(r)
			if tc.ok != (err == nil) || p.Name != tc.who {
				t.Fatalf("principal %q err %v", p.Name, err)
			}
			if err != nil && !errors.Is(err, ErrAuthRequired) {
				t.Fatalf("err = %v, want ErrAuthRequired", err)
			}
		})
	}
	if _, err := NewAuthenticator(&config.Auth{Mode: "bearer"}); err == nil {
		t.Fatal("unregistered mode accepted")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("duplicate registration did not panic")
			}
		}()
		RegisterAuth("none", nil)
	}()
}

func TestLimitListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{}, 4)
	l := NewLimitListener(ln, 1, func() { refused <- struct{}{} })
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	s1 := <-accepted
	if _, ok := rawConn(s1).(*net.TCPConn); !ok {
		t.Fatalf("raw conn is %T, want *net.TCPConn (splice)", rawConn(s1))
	}
	// Above the cap: refused with a 503 and closed.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got, _ := io.ReadAll(c2)
	if !strings.HasPrefix(string(got), "HTTP/1.1 503") || !strings.Contains(string(got), "overload") {
		t.Fatalf("refused connection got %q", got)
	}
	<-refused
	// Closing the first frees the slot.
	s1.Close()
	s1.Close() // a second close must not free a second slot
	if n := l.Open(); n != 0 {
		t.Fatalf("open = %d after close", n)
	}
	c3, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	s3 := <-accepted
	s3.Close()
}
