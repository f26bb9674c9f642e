package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// Defaults for the options config.GatewayLimits does not carry.
const (
	DefaultMaxIdleConns           = 4096
	DefaultIdleConnTimeout        = 30 * time.Second
	DefaultMaxResponseHeaderBytes = 64 << 10
	// connectReadBuffer sizes the reader of an upstream CONNECT reply.
	connectReadBuffer = 4 << 10
)

// Error is a failure classified by phase.
type Error struct {
	Phase worker.Phase
	Err   error
}

func (e *Error) Error() string { return e.Phase.String() + ": " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// PhaseOf returns the phase of a transport error, PhaseNone for others.
func PhaseOf(err error) worker.Phase {
	var te *Error
	if errors.As(err, &te) {
		return te.Phase
	}
	return worker.PhaseNone
}

// StatusError: the upstream proxy answered its handshake with a refusal.
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("upstream proxy answered %d %s", e.Code, http.StatusText(e.Code))
}

// ErrUnsupportedScheme: the target proxy is not of scheme http.
var ErrUnsupportedScheme = errors.New("unsupported upstream proxy scheme")

// Options bound the transport.
type Options struct {
	DialTimeout time.Duration
	// HandshakeTimeout bounds the CONNECT exchange with the upstream proxy.
	HandshakeTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for response headers after a
	// plain-HTTP request was written.
	ResponseHeaderTimeout  time.Duration
	MaxIdleConnsPerProxy   int
	MaxIdleConns           int
	IdleConnTimeout        time.Duration
	MaxResponseHeaderBytes int64
}

// OptionsFrom derives options from the gateway limits.
func OptionsFrom(l config.GatewayLimits) Options {
	return Options{
		DialTimeout:           l.DialTimeout,
		HandshakeTimeout:      l.ResponseTimeout,
		ResponseHeaderTimeout: l.ResponseTimeout,
		MaxIdleConnsPerProxy:  l.MaxIdleConnsPerUps,
	}
}

func (o *Options) defaults() {
	if o.DialTimeout <= 0 {
		o.DialTimeout = config.DefaultDialTimeout
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = config.DefaultResponseTimeout
	}
	if o.ResponseHeaderTimeout <= 0 {
		o.ResponseHeaderTimeout = config.DefaultResponseTimeout
	}
	if o.MaxIdleConnsPerProxy <= 0 {
		o.MaxIdleConnsPerProxy = 16
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = DefaultMaxIdleConns
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = DefaultIdleConnTimeout
	}
	if o.MaxResponseHeaderBytes <= 0 {
		o.MaxResponseHeaderBytes = DefaultMaxResponseHeaderBytes
	}
}

// Transport reaches targets through upstream proxies, and directly for
// routings whose onUnavailable is "direct".
type Transport struct {
	opts   Options
	dialer net.Dialer
	rt     *http.Transport
	direct *http.Transport
}

type targetKey struct{}

// directKey carries the destination addresses the guard checked.
type directKey struct{}

// dialError marks a failure to reach the upstream proxy itself, so that
// it can be told apart after net/http wrapped it.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// New returns a Transport; zero options take defaults.
func New(o Options) *Transport {
	o.defaults()
	t := &Transport{opts: o}
	t.dialer = net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	t.rt = newHTTPTransport(o, proxyFromContext, func(ctx context.Context, network, addr string) (net.Conn, error) {
		return t.dialer.DialContext(ctx, network, addr)
	})
	// Never a proxy, never a lookup of ours: only the addresses the
	// destination guard returned are dialled.
	t.direct = newHTTPTransport(o, nil, func(ctx context.Context, _, _ string) (net.Conn, error) {
		addrs, _ := ctx.Value(directKey{}).([]netip.AddrPort)
		return t.dialChecked(ctx, addrs)
	})
	return t
}

// newHTTPTransport builds the pooled HTTP/1.1 client shared by the proxied
// and the direct path; dial failures are marked as dialError so that
// PhaseOf can tell DIAL from later phases after net/http wrapped them.
func newHTTPTransport(o Options, proxy func(*http.Request) (*url.URL, error), dial func(context.Context, string, string) (net.Conn, error)) *http.Transport {
	return &http.Transport{
		Proxy: proxy,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, &dialError{err}
			}
			return c, nil
		},
		// The client negotiates its own encoding with the target; the
		// gateway must pass bytes through untouched.
		DisableCompression:     true,
		MaxIdleConns:           o.MaxIdleConns,
		MaxIdleConnsPerHost:    o.MaxIdleConnsPerProxy,
		IdleConnTimeout:        o.IdleConnTimeout,
		ResponseHeaderTimeout:  o.ResponseHeaderTimeout,
		MaxResponseHeaderBytes: o.MaxResponseHeaderBytes,
		ExpectContinueTimeout:  time.Second,
		// A non-nil empty map keeps net/http from negotiating HTTP/2:
		// upstream proxies speak HTTP/1.1.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}

// CloseIdleConnections closes every idle upstream connection (reload,
// shutdown).
func (t *Transport) CloseIdleConnections() {
	t.rt.CloseIdleConnections()
	t.direct.CloseIdleConnections()
}

var errNoAddress = errors.New("no checked destination address")

// dialChecked dials the first of addrs that answers.
func (t *Transport) dialChecked(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	if len(addrs) == 0 {
		return nil, errNoAddress
	}
	var first error
	for _, ap := range addrs {
		c, err := t.dialer.DialContext(ctx, "tcp", ap.String())
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// DirectRoundTrip sends req to its target without an upstream proxy,
// dialling only addrs (the destination guard's checked addresses for the
// request's host). Errors are *Error with PhaseDial or
// PhaseResponseHeaders.
func (t *Transport) DirectRoundTrip(req *http.Request, addrs []netip.AddrPort) (*http.Response, error) {
	req = req.WithContext(context.WithValue(req.Context(), directKey{}, addrs))
	resp, err := t.direct.RoundTrip(req)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) {
			return nil, &Error{Phase: worker.PhaseDial, Err: fmt.Errorf("dialing destination: %w", de.err)}
		}
		return nil, &Error{Phase: worker.PhaseResponseHeaders, Err: fmt.Errorf("awaiting response headers: %w", err)}
	}
	return resp, nil
}

// DirectConnect opens a TCP connection to the first of addrs that answers.
func (t *Transport) DirectConnect(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	c, err := t.dialChecked(ctx, addrs)
	if err != nil {
		return nil, &Error{Phase: worker.PhaseDial, Err: fmt.Errorf("dialing destination: %w", err)}
	}
	return c, nil
}

var errNoTarget = errors.New("no upstream proxy in request context")

// proxyFromContext never returns "direct": a request without a target
// fails rather than leaving from the gateway's own address.
func proxyFromContext(req *http.Request) (*url.URL, error) {
	if t, ok := req.Context().Value(targetKey{}).(*snapshot.Target); ok && t != nil {
		return t.URL, nil
	}
	return nil, errNoTarget
}

// RoundTrip sends req (absolute-form, hop-by-hop headers already removed)
// through target. A response is returned only when headers arrived and the
// upstream proxy did not refuse us (407); every error is an *Error.
func (t *Transport) RoundTrip(req *http.Request, target *snapshot.Target) (*http.Response, error) {
	if target.Scheme != proxy.SchemeHTTP {
		return nil, &Error{Phase: worker.PhaseDial, Err: ErrUnsupportedScheme}
	}
	req = req.WithContext(context.WithValue(req.Context(), targetKey{}, target))
	resp, err := t.rt.RoundTrip(req)
	if err != nil {
		var de *dialError
		if errors.As(err, &de) {
			return nil, &Error{Phase: worker.PhaseDial, Err: fmt.Errorf("dialing upstream proxy: %w", de.err)}
		}
		return nil, &Error{Phase: worker.PhaseResponseHeaders, Err: fmt.Errorf("awaiting response headers: %w", err)}
	}
	if resp.StatusCode == http.StatusProxyAuthRequired {
		// The upstream refused our credentials: that is the proxy's
		// failure, never something to show the client.
		drainClose(resp.Body)
		return nil, &Error{Phase: worker.PhaseProxyHandshake, Err: &StatusError{Code: resp.StatusCode}}
	}
	return resp, nil
}

// drainClose reads a little of an unwanted body so the connection can be
// reused, then closes it.
func drainClose(b io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, b, 4<<10)
	_ = b.Close()
}

// Tunnel is an established CONNECT tunnel through an upstream proxy.
type Tunnel struct {
	// Conn is the raw connection to the upstream proxy (a *net.TCPConn),
	// so that copying can splice.
	Conn net.Conn
	// Buffered holds bytes the upstream sent right after its 2xx that were
	// read with the reply; they must reach the client before Conn's data.
	Buffered []byte
}

var readerPool = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, connectReadBuffer) }}

// Connect dials target and asks it to CONNECT to authority (host:port).
func (t *Transport) Connect(ctx context.Context, target *snapshot.Target, authority string) (*Tunnel, error) {
	if target.Scheme != proxy.SchemeHTTP {
		return nil, &Error{Phase: worker.PhaseDial, Err: ErrUnsupportedScheme}
	}
	conn, err := t.dialer.DialContext(ctx, "tcp", target.Addr)
	if err != nil {
		return nil, &Error{Phase: worker.PhaseDial, Err: fmt.Errorf("dialing upstream proxy: %w", err)}
	}
	tun, err := t.handshake(ctx, conn, target, authority)
	if err != nil {
		_ = conn.Close()
		return nil, &Error{Phase: worker.PhaseProxyHandshake, Err: err}
	}
	return tun, nil
}

func (t *Transport) handshake(ctx context.Context, conn net.Conn, target *snapshot.Target, authority string) (*Tunnel, error) {
	_ = conn.SetDeadline(time.Now().Add(t.opts.HandshakeTimeout))
	// A client that goes away aborts the handshake at once.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	buf := make([]byte, 0, 64+2*len(authority)+len(target.ProxyAuthorization))
	buf = append(buf, "CONNECT "...)
	buf = append(buf, authority...)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, authority...)
	if target.ProxyAuthorization != "" {
		buf = append(buf, "\r\nProxy-Authorization: "...)
		buf = append(buf, target.ProxyAuthorization...)
	}
	buf = append(buf, "\r\n\r\n"...)
	if _, err := conn.Write(buf); err != nil {
		return nil, fmt.Errorf("writing CONNECT: %w", err)
	}

	br := readerPool.Get().(*bufio.Reader)
	defer func() { br.Reset(nil); readerPool.Put(br) }()
	// The limit bounds what a hostile proxy can make us buffer for its
	// reply; the tunnel itself is read from conn directly afterwards.
	br.Reset(&io.LimitedReader{R: conn, N: t.opts.MaxResponseHeaderBytes})
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return nil, fmt.Errorf("reading CONNECT reply: %w", err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		_ = resp.Body.Close()
		return nil, &StatusError{Code: resp.StatusCode}
	}
	if !stop() {
		// ctx was cancelled in the meantime and the deadline is poisoned.
		return nil, fmt.Errorf("reading CONNECT reply: %w", context.Cause(ctx))
	}
	if err := conn.SetDeadline(time.Time{}); err != nil {
		return nil, fmt.Errorf("clearing handshake deadline: %w", err)
	}
	tun := &Tunnel{Conn: conn}
	if n := br.Buffered(); n > 0 {
		b, _ := br.Peek(n)
		tun.Buffered = append([]byte(nil), b...)
	}
	return tun, nil
}
