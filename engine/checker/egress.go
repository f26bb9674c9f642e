package checker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// leakHeaders are request headers by which a proxy reveals itself or the
// client behind it. Only these names are ever reported, so an observation
// carries no text chosen by a proxy or an echo service.
var leakHeaders = []string{
	"Client-Ip", "Forwarded", "Proxy-Connection", "True-Client-Ip", "Via",
	"X-Client-Ip", "X-Forwarded-For", "X-Originating-Ip", "X-Proxy-Id", "X-Real-Ip",
}

// ownRequestHeaders are set by us or describe the echo service itself;
// an address in them says nothing about a leak.
var ownRequestHeaders = map[string]bool{"Host": true, "User-Agent": true, "Accept-Encoding": true}

const userAgent = "proxypool-checker"

type viaKey struct{}

// via travels in a request's context: which proxy to use, and the local
// address the dial to it came from (one of our own addresses).
type via struct {
	proxy *url.URL
	mu    sync.Mutex
	local string
}

func (v *via) setLocal(a string) {
	v.mu.Lock()
	v.local = a
	v.mu.Unlock()
}

func (v *via) localAddr() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.local
}

// proxyFromContext makes the shared transport use the task's proxy. A
// request without one fails rather than going out directly.
func proxyFromContext(r *http.Request) (*url.URL, error) {
	if v, ok := r.Context().Value(viaKey{}).(*via); ok && v.proxy != nil {
		return v.proxy, nil
	}
	return nil, errors.New("no proxy for a check request")
}

func (c *Checker) dialRecording(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := c.dialer.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	if v, ok := ctx.Value(viaKey{}).(*via); ok {
		if ap, err := netip.ParseAddrPort(conn.LocalAddr().String()); err == nil {
			v.setLocal(ap.Addr().Unmap().String())
		}
	}
	return conn, nil
}

func proxyURL(p *proxy.Proxy) *url.URL {
	u := &url.URL{Scheme: string(p.Key.Scheme), Host: p.Addr()}
	if p.Key.Username != "" || p.Password != "" {
		u.User = url.UserPassword(p.Key.Username, p.Password)
	}
	return u
}

// fetchThrough sends GET t.URL through t.Proxy and returns the response
// with its body read up to maxEchoBytes.
func (c *Checker) fetchThrough(ctx context.Context, t *Task) (*http.Response, []byte, *via, Phase, error) {
	if t.Proxy.Key.Scheme != proxy.SchemeHTTP {
		return nil, nil, nil, PhaseNone, fmt.Errorf("checking %s proxy: scheme not supported", t.Proxy.Key.Scheme)
	}
	if t.URL == "" {
		return nil, nil, nil, PhaseNone, errors.New("checking: no URL for the check")
	}
	v := &via{proxy: proxyURL(&t.Proxy)}
	req, err := http.NewRequestWithContext(context.WithValue(ctx, viaKey{}, v), http.MethodGet, t.URL, nil)
	if err != nil {
		return nil, nil, nil, PhaseNone, errors.New("checking: unusable URL")
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.through.Do(req)
	if err != nil {
		return nil, nil, v, transportPhase(err), fmt.Errorf("requesting through proxy: %w", ctxErr(ctx, unwrapURL(err)))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEchoBytes+1))
	if err != nil {
		return resp, nil, v, PhaseRequest, fmt.Errorf("reading answer through proxy: %w", ctxErr(ctx, err))
	}
	return resp, body, v, PhaseNone, nil
}

// transportPhase tells a proxy that cannot be reached (or refuses our
// CONNECT to an https URL) from a request that failed beyond it.
func transportPhase(err error) Phase {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "proxyconnect" {
		return PhaseDial
	}
	msg := err.Error()
	if strings.Contains(msg, "Proxy Authentication Required") || strings.Contains(msg, "proxyconnect") {
		return PhaseHandshake
	}
	return PhaseRequest
}

// unwrapURL drops the *url.Error wrapper, which quotes the request URL.
func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// egress asks the echo service at t.URL, through the proxy, what it saw,
// and fills obs with the exit IP and the leaks.
func (c *Checker) egress(ctx context.Context, t *Task, obs *Observation) (Phase, int, error) {
	resp, body, v, phase, err := c.fetchThrough(ctx, t)
	if err != nil {
		return phase, 0, err
	}
	switch {
	case resp.StatusCode == http.StatusProxyAuthRequired:
		return PhaseHandshake, resp.StatusCode, fmt.Errorf("proxy answered %d", resp.StatusCode)
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return PhaseStatus, resp.StatusCode, fmt.Errorf("echo service answered %d", resp.StatusCode)
	case len(body) > maxEchoBytes:
		return PhaseEcho, resp.StatusCode, fmt.Errorf("echo answer larger than %d bytes", maxEchoBytes)
	}
	echo, ok := ParseEcho(body)
	if !ok {
		return PhaseEcho, resp.StatusCode, errors.New("echo answer names no address")
	}
	own, _ := c.self(ctx, t.URL) // unknown: only the local address is judged
	if l := v.localAddr(); l != "" {
		own = append(own, l)
	}
	obs.ExitIP = echo.Exit
	obs.AddressLeaked, obs.ProxyHeaders = Leaks(echo, own)
	return PhaseNone, resp.StatusCode, nil
}

// target requests a routing's URL through the proxy; only ExpectStatus
// (default 200) passes.
func (c *Checker) target(ctx context.Context, t *Task) (Phase, int, error) {
	resp, _, _, phase, err := c.fetchThrough(ctx, t)
	if err != nil {
		return phase, 0, err
	}
	want := t.ExpectStatus
	if want == 0 {
		want = http.StatusOK
	}
	switch {
	case resp.StatusCode == want:
		return PhaseNone, resp.StatusCode, nil
	case resp.StatusCode == http.StatusProxyAuthRequired:
		return PhaseHandshake, resp.StatusCode, fmt.Errorf("proxy answered %d", resp.StatusCode)
	}
	return PhaseStatus, resp.StatusCode, fmt.Errorf("target answered %d, want %d", resp.StatusCode, want)
}

// Echo is what an echo service reported about a request.
type Echo struct {
	// Exit is the address the request came from, canonical.
	Exit string
	// Headers are the request headers it received.
	Headers map[string][]string
}

// ParseEcho reads an echo service's answer: a JSON object with the remote
// address under "remoteAddr", "origin" (httpbin), "ip" or "remote_addr"
// (host or host:port) and the headers under "headers" (string or list
// values); or a body that is just an IP address. ok is false when no
// address can be found.
func ParseEcho(body []byte) (Echo, bool) {
	var e Echo
	trimmed := strings.TrimSpace(string(body))
	if a, ok := canonicalAddr(trimmed); ok {
		e.Exit = a
		return e, true
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(body, &raw) != nil {
		return e, false
	}
	for _, k := range []string{"remoteAddr", "remote_addr", "origin", "ip"} {
		var s string
		if json.Unmarshal(raw[k], &s) != nil || s == "" {
			continue
		}
		// httpbin's origin is "client, proxy1, ...": the first hop is who
		// connected to the service's edge.
		first, _, _ := strings.Cut(s, ",")
		if a, ok := canonicalAddr(strings.TrimSpace(first)); ok {
			e.Exit = a
			break
		}
	}
	if e.Exit == "" {
		return e, false
	}
	var hs map[string]json.RawMessage
	if json.Unmarshal(raw["headers"], &hs) == nil {
		e.Headers = make(map[string][]string, len(hs))
		for k, v := range hs {
			name := http.CanonicalHeaderKey(k)
			var one string
			var many []string
			switch {
			case json.Unmarshal(v, &one) == nil:
				e.Headers[name] = append(e.Headers[name], one)
			case json.Unmarshal(v, &many) == nil:
				e.Headers[name] = append(e.Headers[name], many...)
			}
		}
	}
	return e, true
}

// Leaks judges an echo against our own addresses: leaked when the exit is
// one of them or one of them appears in any header the echo received
// (other than the ones describing the service itself); proxyHeaders lists
// the proxy-revealing headers present.
func Leaks(e Echo, own []string) (leaked bool, proxyHeaders []string) {
	mine := make(map[string]bool, len(own))
	for _, a := range own {
		if c, ok := canonicalAddr(a); ok {
			mine[c] = true
		}
	}
	if mine[e.Exit] {
		leaked = true
	}
	for name, vals := range e.Headers {
		if slices.Contains(leakHeaders, name) {
			proxyHeaders = append(proxyHeaders, name)
		}
		if leaked || ownRequestHeaders[name] {
			continue
		}
		for _, v := range vals {
			if mentions(v, mine) {
				leaked = true
				break
			}
		}
	}
	slices.Sort(proxyHeaders)
	return leaked, proxyHeaders
}

// mentions reports whether a header value names one of the addresses, as
// a whole token (so 10.0.0.1 is not found in 10.0.0.12).
func mentions(v string, addrs map[string]bool) bool {
	if len(addrs) == 0 {
		return false
	}
	for _, tok := range strings.FieldsFunc(v, func(r rune) bool {
		return r == ',' || r == ';' || r == '=' || r == '"' || r == ' ' || r == '\t'
	}) {
		if a, ok := canonicalAddr(tok); ok && addrs[a] {
			return true
		}
	}
	return false
}

// canonicalAddr reads "ip", "ip:port", "[ip]:port" or "[ip]" and returns
// the unmapped IP without zone.
func canonicalAddr(s string) (string, bool) {
	if s == "" || len(s) > 64 {
		return "", false
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("").String(), true
	}
	s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("").String(), true
	}
	return "", false
}

// learnSelf asks the echo service directly, without a proxy, where we
// come from; the answer is cached per URL for selfTTL.
func (c *Checker) learnSelf(ctx context.Context, echoURL string) ([]string, error) {
	now := c.now()
	c.selfMu.Lock()
	if e, ok := c.selfCache[echoURL]; ok && now.Sub(e.at) < selfTTL {
		c.selfMu.Unlock()
		return slices.Clone(e.addrs), nil
	}
	c.selfMu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, echoURL, nil)
	if err != nil {
		return nil, errors.New("learning own address: unusable URL")
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.direct.Do(req)
	if err != nil {
		return nil, fmt.Errorf("learning own address: %w", unwrapURL(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxEchoBytes))
	if err != nil {
		return nil, fmt.Errorf("learning own address: %w", err)
	}
	e, ok := ParseEcho(body)
	if !ok {
		return nil, errors.New("learning own address: echo answer names no address")
	}
	addrs := []string{e.Exit}
	c.selfMu.Lock()
	if len(c.selfCache) >= maxSelfEntries {
		var oldest string
		for k, v := range c.selfCache {
			if oldest == "" || v.at.Before(c.selfCache[oldest].at) {
				oldest = k
			}
		}
		delete(c.selfCache, oldest)
	}
	c.selfCache[echoURL] = selfEntry{addrs: addrs, at: now}
	c.selfMu.Unlock()
	return slices.Clone(addrs), nil
}
