package plugin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Bounds the host enforces on every adapter, whatever its kind.
const (
	// MaxProxies bounds the candidates of one response.
	MaxProxies = 10000
	// MaxRetryAfter caps a vendor's Retry-After hint, so a typo on the
	// vendor's side cannot park an upstream for a day.
	MaxRetryAfter = time.Hour
	// MaxRequestBodyBytes bounds a request body built by an adapter.
	MaxRequestBodyBytes = 1 << 20
	// MaxURLBytes bounds a request URL.
	MaxURLBytes = 8 << 10
	// MaxRequestHeaders bounds the headers an adapter may set.
	MaxRequestHeaders = 64
	// MaxHeaderValueBytes bounds one request header value.
	MaxHeaderValueBytes = 8 << 10
)

// StatusError is a response whose HTTP status the plugin does not accept.
// The controller classifies it as Error (seed 000 §8.1); RetryAfter carries
// the vendor's Retry-After hint for 429 and 503, also returned in the
// ParseResult.
type StatusError struct {
	Status     int
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("unexpected http status %d (retry after %s)", e.Status, e.RetryAfter)
	}
	return fmt.Sprintf("unexpected http status %d", e.Status)
}

// VendorError is an error the vendor reported inside an accepted response
// (a non-zero code in a JSON envelope, say). Message is produced by the
// plugin, bounded and stripped of control characters.
type VendorError struct {
	Message string
}

func (e *VendorError) Error() string { return "vendor reported an error: " + e.Message }

// maxVendorMessage bounds VendorError.Message.
const maxVendorMessage = 256

// NewVendorError sanitises msg (control characters dropped, bounded) so it
// can be logged and shown to operators.
func NewVendorError(msg string) *VendorError {
	var b strings.Builder
	for _, r := range msg {
		if b.Len() >= maxVendorMessage {
			b.WriteString("…")
			break
		}
		if r < 0x20 || r == 0x7f {
			r = ' '
		}
		b.WriteRune(r)
	}
	return &VendorError{Message: b.String()}
}

// ParseRetryAfter reads a Retry-After value, delta-seconds or HTTP-date
// relative to now, capped at MaxRetryAfter. ok is false when absent or
// unreadable.
func ParseRetryAfter(v string, now time.Time) (time.Duration, bool) {
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
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d := t.Sub(now)
	switch {
	case d < 0:
		return 0, true
	case d > MaxRetryAfter:
		return MaxRetryAfter, true
	}
	return d, true
}

// CheckHost accepts an IP literal (no zone, no brackets) or a DNS name. It
// refuses URLs, spaces, and dotted or single numbers that are not canonical
// IPv4 (127.1, 0x7f000001, 2130706433): resolvers disagree on those, and
// the SSRF guard downstream must see one spelling.
func CheckHost(host string) error {
	if host == "" || len(host) > 253 {
		return fmt.Errorf("host must be 1 to 253 bytes")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("host %q: ip zone not allowed", trunc(host))
		}
		return nil
	}
	if strings.ContainsAny(host, ":[]") {
		return fmt.Errorf("host %q: not an ip literal or dns name", trunc(host))
	}
	labels := strings.Split(host, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return fmt.Errorf("host %q: empty or over-long dns label", trunc(host))
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("host %q: dns label starts or ends with '-'", trunc(host))
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '-' && c != '_' {
				return fmt.Errorf("host %q: not an ip literal or dns name", trunc(host))
			}
		}
	}
	last := labels[len(labels)-1]
	if _, err := strconv.ParseUint(last, 0, 64); err == nil || allDigits(last) {
		return fmt.Errorf("host %q: numeric name that is not a canonical ip literal", trunc(host))
	}
	return nil
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// CheckCandidate is the host's validation of one candidate, applied to the
// output of every kind.
func CheckCandidate(c *proxy.Candidate) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if err := CheckHost(c.Host); err != nil {
		return err
	}
	if hasCtl(c.Username) || hasCtl(c.Password) {
		return errors.New("credentials contain control characters")
	}
	return nil
}

func hasCtl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] == 0x7f {
			return true
		}
	}
	return false
}

// guarded wraps every loaded adapter: whatever the kind, a panic becomes an
// error and the output is checked against the host's bounds.
type guarded struct {
	name  string
	inner upstream.Adapter
}

var _ upstream.Adapter = (*guarded)(nil)

func (g *guarded) BuildRequest(ctx context.Context, in upstream.BuildInput) (req upstream.Request, err error) {
	defer func() {
		if r := recover(); r != nil {
			req, err = upstream.Request{}, fmt.Errorf("plugin %s: building request: adapter panicked: %v", g.name, r)
		}
	}()
	if err := ctx.Err(); err != nil {
		return upstream.Request{}, fmt.Errorf("plugin %s: building request: %w", g.name, err)
	}
	req, err = g.inner.BuildRequest(ctx, in)
	if err != nil {
		return upstream.Request{}, fmt.Errorf("plugin %s: building request: %w", g.name, err)
	}
	if err := CheckRequest(req); err != nil {
		return upstream.Request{}, fmt.Errorf("plugin %s: building request: %w", g.name, err)
	}
	return req, nil
}

func (g *guarded) ParseResponse(ctx context.Context, resp upstream.Response, now time.Time) (res upstream.ParseResult, err error) {
	defer func() {
		if r := recover(); r != nil {
			res, err = upstream.ParseResult{}, fmt.Errorf("plugin %s: parsing response: adapter panicked: %v", g.name, r)
		}
	}()
	if err := ctx.Err(); err != nil {
		return upstream.ParseResult{}, fmt.Errorf("plugin %s: parsing response: %w", g.name, err)
	}
	res, err = g.inner.ParseResponse(ctx, resp, now)
	res.RetryAfter = min(max(res.RetryAfter, 0), MaxRetryAfter)
	if err != nil {
		return upstream.ParseResult{RetryAfter: res.RetryAfter}, fmt.Errorf("plugin %s: parsing response: %w", g.name, err)
	}
	if len(res.Proxies) > MaxProxies {
		return upstream.ParseResult{RetryAfter: res.RetryAfter}, fmt.Errorf("plugin %s: parsing response: %d proxies, more than %d", g.name, len(res.Proxies), MaxProxies)
	}
	for i := range res.Proxies {
		if err := CheckCandidate(&res.Proxies[i]); err != nil {
			return upstream.ParseResult{RetryAfter: res.RetryAfter}, fmt.Errorf("plugin %s: parsing response: proxy %d: %w", g.name, i, err)
		}
	}
	return res, nil
}

// hopHeaders are set by the host's HTTP client, never by a plugin.
var hopHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Te": true, "Trailer": true, "Upgrade": true,
}

// CheckRequest validates a request built by an adapter: method token,
// absolute http(s) URL, header names and values free of injection, bounds.
func CheckRequest(r upstream.Request) error {
	if r.Method == "" || len(r.Method) > 16 {
		return fmt.Errorf("invalid method %q", trunc(r.Method))
	}
	for i := 0; i < len(r.Method); i++ {
		if c := r.Method[i]; c < 'A' || c > 'Z' {
			return fmt.Errorf("invalid method %q", trunc(r.Method))
		}
	}
	if len(r.URL) > MaxURLBytes {
		return fmt.Errorf("url longer than %d bytes", MaxURLBytes)
	}
	u, err := url.Parse(r.URL)
	if err != nil {
		// url.Error quotes the URL, which may hold a key: drop it.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("invalid url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("url scheme %q: want http or https", trunc(u.Scheme))
	}
	if u.Host == "" {
		return errors.New("url has no host")
	}
	if len(r.Headers) > MaxRequestHeaders {
		return fmt.Errorf("more than %d headers", MaxRequestHeaders)
	}
	for k, v := range r.Headers {
		if !validToken(k) {
			return fmt.Errorf("invalid header name %q", trunc(k))
		}
		if hopHeaders[http.CanonicalHeaderKey(k)] {
			return fmt.Errorf("header %s is set by the host", http.CanonicalHeaderKey(k))
		}
		if len(v) > MaxHeaderValueBytes {
			return fmt.Errorf("header %s: value longer than %d bytes", k, MaxHeaderValueBytes)
		}
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
				return fmt.Errorf("header %s: control character in value", k)
			}
		}
	}
	if len(r.Body) > MaxRequestBodyBytes {
		return fmt.Errorf("body longer than %d bytes", MaxRequestBodyBytes)
	}
	return nil
}

// validToken is RFC 9110's token, the grammar of header names.
func validToken(s string) bool {
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
