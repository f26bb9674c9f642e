package ingress

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopByHop lists the headers that describe one connection (RFC 9110 §7.6.1)
// plus the proxy credentials and the gateway's own API key header: none of
// them may travel past the gateway.
var hopByHop = map[string]bool{
	APIKeyHeader:          true,
	"Connection":          true,
	"Proxy-Connection":    true,
	"Keep-Alive":          true,
	"Proxy-Authenticate":  true,
	"Proxy-Authorization": true,
	"Te":                  true,
	"Trailer":             true,
	"Transfer-Encoding":   true,
	"Upgrade":             true,
}

// connectionListed returns the headers named in Connection (canonical
// form), nil when there are none: the common case costs nothing.
func connectionListed(h http.Header) map[string]bool {
	var listed map[string]bool
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if listed == nil {
					listed = make(map[string]bool, 2)
				}
				listed[textproto.CanonicalMIMEHeaderKey(name)] = true
			}
		}
	}
	return listed
}

// copyEndToEnd copies src's end-to-end headers into dst: everything but
// hop-by-hop headers and those the Connection header names. Value slices
// are shared; neither side is modified afterwards.
func copyEndToEnd(dst, src http.Header) {
	listed := connectionListed(src)
	for k, vv := range src {
		if !hopByHop[k] && !listed[k] {
			dst[k] = vv
		}
	}
}

// cleanHeader returns a copy of src fit to forward to a target.
func cleanHeader(src http.Header) http.Header {
	dst := make(http.Header, len(src))
	copyEndToEnd(dst, src)
	return dst
}
