package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
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

// appendAuthority appends the authority of an absolute-form request line
// and Host header: IPv6 bracketed, port 80 left out.
func appendAuthority(dst []byte, host string, port uint16) []byte {
	if strings.IndexByte(host, ':') >= 0 {
		dst = append(dst, '[')
		dst = append(dst, host...)
		dst = append(dst, ']')
	} else {
		dst = append(dst, host...)
	}
	if port != 80 {
		dst = append(dst, ':')
		dst = strconv.AppendUint(dst, uint64(port), 10)
	}
	return dst
}

var (
	errNotAbsolute = errors.New("request target is not in absolute form with scheme http (use CONNECT for https)")
	errUserinfo    = errors.New("credentials in the target URL are not forwarded")
	slash          = []byte("/")
)

// forwardTarget checks an absolute-form request target and returns its
// normalised destination and its origin-form path and query. Only http
// targets are forwarded: https goes through CONNECT.
func forwardTarget(target []byte) (host string, port uint16, uri []byte, err error) {
	const scheme = "http://"
	if len(target) <= len(scheme) || !h1.EqualFold(target[:len(scheme)], scheme) {
		return "", 0, nil, errNotAbsolute
	}
	rest := target[len(scheme):]
	end := bytes.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	authority, uri := rest[:end], rest[end:]
	if bytes.IndexByte(authority, '@') >= 0 {
		return "", 0, nil, errUserinfo
	}
	host, port, err = ParseAuthority(string(authority), 80)
	if err != nil {
		return "", 0, nil, err
	}
	switch {
	case len(uri) == 0:
		uri = slash
	case uri[0] == '?':
		uri = append([]byte("/"), uri...)
	}
	return host, port, uri, nil
}

// connectTarget returns the normalised authority of a CONNECT request.
func connectTarget(target []byte) (host string, port uint16, err error) {
	return ParseAuthority(string(target), 0)
}
