package ingress

import (
	"strconv"

	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
)

// HopByHop lists the headers that describe one connection (RFC 9110
// §7.6.1) plus the proxy credentials and the gateway's own API key header:
// none of them may travel past the gateway, in either direction. Headers
// named in Connection are dropped too.
var HopByHop = []string{
	APIKeyHeader, "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// hopByHop reports whether name is in HopByHop, without allocating.
func hopByHop(name []byte) bool {
	switch len(name) {
	case 2:
		return h1.EqualFold(name, "te")
	case 7:
		return h1.EqualFold(name, "trailer") || h1.EqualFold(name, "upgrade")
	case 10:
		return h1.EqualFold(name, "connection") || h1.EqualFold(name, "keep-alive")
	case 16:
		return h1.EqualFold(name, "proxy-connection")
	case 17:
		return h1.EqualFold(name, "transfer-encoding")
	case 18:
		return h1.EqualFold(name, "proxy-authenticate")
	case 19:
		return h1.EqualFold(name, "proxy-authorization") || h1.EqualFold(name, APIKeyHeader)
	}
	return false
}

func isContentLength(name []byte) bool {
	return len(name) == 14 && h1.EqualFold(name, "content-length")
}

// appendOutbound appends the field lines of the request to forward:
// Host set to the normalised destination, every end-to-end field of the
// client in its order, minus the routing's sticky-session header, and the
// body's framing (one Content-Length, or chunked).
func appendOutbound(dst []byte, r *h1.Request, authority []byte, sticky string) []byte {
	dst = append(dst, "Host: "...)
	dst = append(dst, authority...)
	dst = append(dst, "\r\n"...)
	for i := range r.Fields {
		f := &r.Fields[i]
		if hopByHop(f.Name) || isContentLength(f.Name) || (len(f.Name) == 4 && h1.EqualFold(f.Name, "host")) ||
			(r.Listed && h1.ListedBy(r.Fields, f.Name)) || (sticky != "" && h1.EqualFold(f.Name, sticky)) {
			continue
		}
		dst = appendField(dst, f.Name, f.Value)
	}
	switch {
	case r.Chunked:
		dst = append(dst, "Transfer-Encoding: chunked\r\n"...)
	case r.ContentLength >= 0:
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, r.ContentLength, 10)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// appendResponseFields appends the end-to-end fields of an upstream
// response; Content-Length is kept exactly when it frames the body we send,
// whatever Connection lists (dropping it there would leave the client a
// kept-alive response without framing).
func appendResponseFields(dst []byte, r *h1.Response, keepLength bool) []byte {
	for i := range r.Fields {
		f := &r.Fields[i]
		if isContentLength(f.Name) {
			if keepLength {
				dst = appendField(dst, f.Name, f.Value)
			}
			continue
		}
		if hopByHop(f.Name) || (r.Listed && h1.ListedBy(r.Fields, f.Name)) {
			continue
		}
		dst = appendField(dst, f.Name, f.Value)
	}
	return dst
}

func appendField(dst, name, value []byte) []byte {
	dst = append(dst, name...)
	dst = append(dst, ": "...)
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}
