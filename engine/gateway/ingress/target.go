package ingress

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// maxHostLen is the DNS limit on a name.
const maxHostLen = 253

var errMissingPort = errors.New("missing port")

// ParseAuthority splits and normalises host[:port]. The host comes back
// lower case, without brackets and without a trailing dot; defaultPort is
// used when the port is absent, and 0 makes the port mandatory.
func ParseAuthority(hostport string, defaultPort uint16) (host string, port uint16, err error) {
	if hostport == "" {
		return "", 0, errors.New("empty authority")
	}
	h, p, serr := net.SplitHostPort(hostport)
	if serr != nil {
		// No port at all: only acceptable with a default, and only for a
		// host that does not itself contain a colon (bare IPv6).
		if defaultPort == 0 {
			return "", 0, errMissingPort
		}
		if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
			h = hostport[1 : len(hostport)-1]
		} else if strings.ContainsAny(hostport, ":[]") {
			return "", 0, fmt.Errorf("malformed authority %q", hostport)
		} else {
			h = hostport
		}
		port = defaultPort
	} else {
		n, perr := strconv.ParseUint(p, 10, 16)
		if perr != nil || n == 0 || p[0] == '+' {
			return "", 0, fmt.Errorf("invalid port %q", p)
		}
		port = uint16(n)
	}
	host, err = normaliseHost(h)
	if err != nil {
		return "", 0, err
	}
	return host, port, nil
}

// normaliseHost validates a host name or IP literal and returns the form
// routing and the destination policy compare: lower case, no trailing dot.
func normaliseHost(h string) (string, error) {
	if strings.Contains(h, ":") {
		ip, err := netip.ParseAddr(h)
		if err != nil || !ip.Is6() || ip.Zone() != "" {
			return "", fmt.Errorf("invalid IPv6 host %q", h)
		}
		return ip.String(), nil
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > maxHostLen {
		return "", fmt.Errorf("invalid host %q", h)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '.', c == '_':
		case c >= 'A' && c <= 'Z':
		default:
			return "", fmt.Errorf("invalid character in host %q", h)
		}
	}
	if h[0] == '.' || h[len(h)-1] == '.' || strings.Contains(h, "..") {
		return "", fmt.Errorf("empty label in host %q", h)
	}
	return strings.ToLower(h), nil
}

// joinAuthority renders host and port for the upstream, bracketing IPv6.
func joinAuthority(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// forwardTarget checks an absolute-form request and returns its normalised
// destination. Only http targets are forwarded: https goes through CONNECT.
func forwardTarget(r *http.Request) (host string, port uint16, err error) {
	if r.URL == nil || !r.URL.IsAbs() || r.URL.Host == "" {
		return "", 0, errors.New("request target is not in absolute form")
	}
	if !strings.EqualFold(r.URL.Scheme, "http") {
		return "", 0, fmt.Errorf("unsupported target scheme %q (use CONNECT for https)", r.URL.Scheme)
	}
	if r.URL.User != nil {
		return "", 0, errors.New("credentials in the target URL are not forwarded")
	}
	return ParseAuthority(r.URL.Host, 80)
}

// connectTarget returns the normalised authority of a CONNECT request.
func connectTarget(r *http.Request) (host string, port uint16, err error) {
	if r.URL == nil || r.URL.Host == "" || r.URL.Path != "" || r.URL.Scheme != "" {
		return "", 0, errors.New("CONNECT target is not host:port")
	}
	return ParseAuthority(r.URL.Host, 0)
}
