package sdk

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// MaxRetryAfter caps a Retry-After hint, as the host does.
const MaxRetryAfter = time.Hour

// The SDK avoids net and net/http on purpose: they would add megabytes to
// every plugin module, and with them compile time on every host.

// Header returns the value of the named header, case-insensitively; "" when
// absent.
func Header(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// RetryAfter reads a Retry-After value, delta-seconds or HTTP-date relative
// to now, capped at MaxRetryAfter. ok is false when absent or unreadable.
func RetryAfter(v string, now time.Time) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		if n > uint64(MaxRetryAfter/time.Second) {
			return MaxRetryAfter, true
		}
		return time.Duration(n) * time.Second, true
	}
	for _, layout := range httpTimeFormats {
		if t, err := time.Parse(layout, v); err == nil {
			return min(max(t.Sub(now), 0), MaxRetryAfter), true
		}
	}
	return 0, false
}

// httpTimeFormats are the date forms HTTP allows (RFC 9110 §5.6.7).
var httpTimeFormats = []string{
	"Mon, 02 Jan 2006 15:04:05 GMT",
	"Monday, 02-Jan-06 15:04:05 GMT",
	"Mon Jan _2 15:04:05 2006",
}

// CheckStatus returns nil when r.Status is one of ok (200 when ok is
// empty), else a *StatusError carrying the Retry-After hint of a 429 or
// 503.
func CheckStatus(r Response, ok ...int) error {
	if len(ok) == 0 {
		ok = []int{200}
	}
	for _, s := range ok {
		if r.Status == s {
			return nil
		}
	}
	e := &StatusError{Status: r.Status}
	if r.Status == 429 || r.Status == 503 {
		if d, ok := RetryAfter(Header(r.Headers, "Retry-After"), r.Now); ok {
			e.RetryAfter = d
		}
	}
	return e
}

// AddQuery returns rawURL with the query parameters set (replacing any of
// the same name); the query is re-encoded with keys sorted.
func AddQuery(rawURL string, params map[string]string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Error repeats the URL, which may carry a key.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return "", fmt.Errorf("parsing url: %w", err)
	}
	q := u.Query()
	for k, v := range params {
		q.Set(k, v)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// Lines splits a text body into its non-empty lines, trimmed of spaces and
// carriage returns, after dropping a UTF-8 byte order mark.
func Lines(body []byte) []string {
	body = bytes.TrimPrefix(body, utf8BOM)
	var out []string
	for len(body) > 0 {
		var line []byte
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			line, body = body, nil
		}
		if line = bytes.TrimSpace(line); len(line) > 0 {
			out = append(out, string(line))
		}
	}
	return out
}

// TrimBOM drops a leading UTF-8 byte order mark, which some vendors put in
// front of JSON.
func TrimBOM(body []byte) []byte { return bytes.TrimPrefix(body, utf8BOM) }

// ParseProxyLine reads one proxy from the line forms vendors use:
// host:port, host:port:user:pass (the password may contain ':'),
// [v6]:port, [v6]:port:user:pass and user:pass@host:port. Only Host, Port,
// Username and Password are set.
func ParseProxyLine(line string) (Proxy, error) {
	line = strings.TrimSpace(line)
	var p Proxy
	var port string
	if at := strings.LastIndexByte(line, '@'); at >= 0 {
		var ok bool
		p.Username, p.Password, ok = strings.Cut(line[:at], ":")
		if !ok {
			return Proxy{}, errors.New("credentials before '@' must be user:pass")
		}
		var err error
		if p.Host, port, err = splitHostPort(line[at+1:]); err != nil {
			return Proxy{}, err
		}
	} else if strings.HasPrefix(line, "[") {
		end := strings.IndexByte(line, ']')
		if end < 0 || end+1 >= len(line) || line[end+1] != ':' {
			return Proxy{}, errors.New("want [ipv6]:port")
		}
		p.Host = line[1:end]
		parts := strings.SplitN(line[end+2:], ":", 3)
		switch len(parts) {
		case 1:
			port = parts[0]
		case 3:
			port, p.Username, p.Password = parts[0], parts[1], parts[2]
		default:
			return Proxy{}, errors.New("want [ipv6]:port or [ipv6]:port:user:pass")
		}
	} else {
		parts := strings.SplitN(line, ":", 4)
		switch len(parts) {
		case 2:
			p.Host, port = parts[0], parts[1]
		case 4:
			p.Host, port, p.Username, p.Password = parts[0], parts[1], parts[2], parts[3]
		default:
			return Proxy{}, errors.New("want host:port or host:port:user:pass")
		}
	}
	if p.Host == "" {
		return Proxy{}, errors.New("empty host")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return Proxy{}, errors.New("port must be 1 to 65535")
	}
	p.Port = n
	return p, nil
}

// splitHostPort reads host:port or [v6]:port.
func splitHostPort(s string) (host, port string, err error) {
	bad := errors.New("want user:pass@host:port")
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 >= len(s) || s[end+1] != ':' {
			return "", "", bad
		}
		return s[1:end], s[end+2:], nil
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 || strings.IndexByte(s[:i], ':') >= 0 {
		return "", "", bad
	}
	return s[:i], s[i+1:], nil
}

// Number is a JSON value vendors send as a number or as a numeric string
// ("8080", "90.5"). null and "" decode as 0, meaning "not given".
type Number float64

// UnmarshalJSON implements json.Unmarshaler.
func (n *Number) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*n = 0
		return nil
	}
	s := string(b)
	if len(b) > 0 && b[0] == '"' {
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if s = strings.TrimSpace(s); s == "" {
			*n = 0
			return nil
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("%s is not a number", truncate(string(b)))
	}
	*n = Number(f)
	return nil
}

// Port reads n as a port number: an integer in 1..65535.
func (n Number) Port() (int, error) {
	f := float64(n)
	if f != math.Trunc(f) || f < 1 || f > 65535 {
		return 0, fmt.Errorf("%v is not a port in 1..65535", f)
	}
	return int(f), nil
}

// Seconds reads n as a duration in seconds (fractions allowed), refusing
// negative values.
func (n Number) Seconds() (time.Duration, error) {
	f := float64(n)
	if f < 0 || f > maxTTLSeconds {
		return 0, fmt.Errorf("%v seconds out of range 0..%d", f, int64(maxTTLSeconds))
	}
	return time.Duration(f * float64(time.Second)), nil
}

// maxTTLSeconds mirrors the host's bound on a proxy's lifetime (366 days).
const maxTTLSeconds = 366 * 24 * 3600

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
