package provider

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/proxypool/proxypool/engine/netguard"
)

// errDeniedDestination is returned for an address the controller must not
// reach or hand out.
var errDeniedDestination = errors.New("destination address not allowed")

// checkIP refuses addresses that point into the host or its networks, with
// the same classifier the gateway uses for its destinations: loopback
// (unless allowLoopback), private, link-local and cloud metadata, CGNAT,
// multicast, unspecified, and the IPv6 forms that embed such an address.
func checkIP(ip netip.Addr, allowLoopback bool) error {
	c := netguard.Classify(ip)
	switch {
	case !c.Internal():
		return nil
	case c == netguard.Loopback && allowLoopback:
		return nil
	}
	return fmt.Errorf("%w: %s is not a public address (%s)", errDeniedDestination, ip, c)
}

// dialControl checks the address actually being dialled, after DNS, so a
// vendor name that resolves (or rebinds) into the host's networks is
// refused.
func dialControl(allowLoopback bool) func(network, address string, _ syscall.RawConn) error {
	return func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			return fmt.Errorf("checking dial address: %w", err)
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return fmt.Errorf("checking dial address %q: %w", host, err)
		}
		return checkIP(ip, allowLoopback)
	}
}

// checkCandidateHost refuses a vendor-supplied proxy host that names the
// host itself or its networks: a vendor answering 127.0.0.1:6379 must never
// become a proxy the gateway dials. Names are resolved only when dialled
// (where the gateway's guard checks the address), so here only literal
// addresses, localhost and names a permissive resolver might read as a
// number ("2130706433", "0x7f.1") are judged.
func checkCandidateHost(host string, allowLoopback bool) error {
	h := strings.TrimSuffix(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"), ".")
	if ip, ok := netguard.ParseHost(h); ok {
		return checkIP(ip, allowLoopback)
	}
	lower := strings.ToLower(h)
	if lower == "localhost" || strings.HasSuffix(lower, ".localhost") {
		if allowLoopback {
			return nil
		}
		return fmt.Errorf("%w: %s is loopback", errDeniedDestination, h)
	}
	last := lower[strings.LastIndexByte(lower, '.')+1:]
	if last == "" || strings.HasPrefix(last, "0x") || strings.Trim(last, "0123456789") == "" {
		return fmt.Errorf("%w: ambiguous numeric host %q", errDeniedDestination, h)
	}
	return nil
}
