package ingress

import (
	"net"
	"strconv"
)

// statusText is the reason phrase of every status the gateway makes up.
func statusText(code int) string {
	switch code {
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	case 407:
		return "Proxy Authentication Required"
	case 429:
		return "Too Many Requests"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 501:
		return "Not Implemented"
	case 502:
		return "Bad Gateway"
	case 503:
		return "Service Unavailable"
	case 505:
		return "HTTP Version Not Supported"
	}
	return "Error"
}

// writeError answers with a gateway-made error: the reason in the
// X-Proxypool-Reason header and in a short text body, one optional extra
// field (name, value). It reports whether the answer was written.
func (c *conn) writeError(status int, reason string, keep bool, name, value string) bool {
	if c.bw == nil {
		return false
	}
	// Closing after a refusal: the client may still be sending.
	c.linger = c.linger || !keep
	w := c.bw.AvailableBuffer()
	w = append(w, "HTTP/1.1 "...)
	w = strconv.AppendInt(w, int64(status), 10)
	w = append(w, ' ')
	w = append(w, statusText(status)...)
	w = append(w, "\r\n"+ReasonHeader+": "...)
	w = append(w, reason...)
	w = append(w, "\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\n"...)
	if name != "" {
		w = append(w, name...)
		w = append(w, ": "...)
		w = append(w, value...)
		w = append(w, "\r\n"...)
	}
	w = append(w, "Content-Length: "...)
	w = strconv.AppendInt(w, int64(len("proxypool: \n")+len(reason)), 10)
	w = append(w, "\r\n"...)
	w = appendConnection(w, c.req.Minor, keep)
	w = append(w, "\r\nproxypool: "...)
	w = append(w, reason...)
	w = append(w, '\n')
	if _, err := c.bw.Write(w); err != nil {
		return false
	}
	return c.bw.Flush() == nil
}

// appendStatusLine appends a forwarded response's status line in the
// client's HTTP version.
func appendStatusLine(w []byte, minor, status int, reason []byte) []byte {
	if minor == 0 {
		w = append(w, "HTTP/1.0 "...)
	} else {
		w = append(w, "HTTP/1.1 "...)
	}
	w = strconv.AppendInt(w, int64(status), 10)
	w = append(w, ' ')
	w = append(w, reason...)
	return append(w, "\r\n"...)
}

// appendConnection says whether the connection stays open, where the
// version's default does not say it already.
func appendConnection(w []byte, minor int, keep bool) []byte {
	switch {
	case !keep:
		return append(w, "Connection: close\r\n"...)
	case minor == 0:
		return append(w, "Connection: keep-alive\r\n"...)
	}
	return w
}

// abort closes the connection so that the client sees a broken response
// rather than a short one: a reset, whatever the response's framing.
func (c *conn) abort() {
	if tc, ok := c.raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.nc.Close()
}
