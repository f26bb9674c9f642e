package auth

import (
	"net/netip"
	"strings"
	"testing"
)

// clientIPReference is the obvious, allocation-happy statement of the
// X-Forwarded-For rule, used as the oracle for ClientIP.
func clientIPReference(peer netip.Addr, lines []string, trusted []netip.Prefix) netip.Addr {
	peer = Normalize(peer)
	if len(trusted) == 0 || len(lines) == 0 || !Contains(trusted, peer) {
		return peer
	}
	var entries []string
	for _, l := range lines {
		for _, e := range strings.Split(l, ",") {
			if e = strings.TrimSpace(e); e != "" {
				entries = append(entries, e)
			}
		}
	}
	client := peer
	for i, hops := len(entries)-1, 1; i >= 0; i, hops = i-1, hops+1 {
		a, ok := parseForwarded(entries[i])
		if !ok {
			return client
		}
		client = a
		if !Contains(trusted, a) || hops >= MaxForwardedHops {
			return client
		}
	}
	return client
}

// FuzzClientIP compares ClientIP, which walks the header lines in place
// from the right, with the split-everything reference.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1", "198.51.100.7, 10.1.1.1", "1.1.1.1")
	f.Add("10.0.0.1", "garbage, 198.51.100.7", "")
	f.Add("::ffff:10.0.0.1", "[2001:db8::1]:80,, 10.2.2.2", "10.3.3.3")
	f.Add("203.0.113.1", "10.0.0.1", "")
	f.Add("10.0.0.1", strings.Repeat("10.0.0.2,", 40), "")
	trusted, err := ParsePrefixes([]string{"10.0.0.0/8", "fd00::/8"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, peerS, line1, line2 string) {
		peer, _ := netip.ParseAddr(peerS)
		lines := []string{line1, line2}
		got := ClientIP(peer, lines, trusted)
		if want := clientIPReference(peer, lines, trusted); got != want {
			t.Fatalf("ClientIP(%v, %q) = %v, reference %v", peer, lines, got, want)
		}
	})
}
