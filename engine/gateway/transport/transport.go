package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Defaults for the options config.GatewayLimits does not carry.
const (
	DefaultMaxIdleConns           = 4096
	DefaultIdleConnTimeout        = 30 * time.Second
	DefaultMaxResponseHeaderBytes = 64 << 10
	// ExpectContinueTimeout bounds the wait for an upstream's 100 Continue
	// before a request body is sent anyway (net/http's usual second).
	ExpectContinueTimeout = time.Second
	// MaxResponseFields bounds the field lines of one response head.
	MaxResponseFields = 512
	// max1xx bounds the interim responses skipped before a final one.
	max1xx = 8
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

// BodyError: reading the client's request body failed (the client went
// away, or its body broke its framing). It says nothing about the proxy.
type BodyError struct{ Err error }

func (e *BodyError) Error() string { return "reading request body: " + e.Err.Error() }
func (e *BodyError) Unwrap() error { return e.Err }

// StatusError: the upstream proxy answered its handshake with a refusal.
type StatusError struct {
	Code int
}

func (e *StatusError) Error() string {
	return "upstream proxy answered " + strconv.Itoa(e.Code)
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
	pools  pools
	closed atomic.Bool
}

// New returns a Transport; zero options take defaults.
func New(o Options) *Transport {
	o.defaults()
	t := &Transport{opts: o}
	t.dialer = net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second}
	t.pools.init()
	return t
}

var errNoAddress = errors.New("no checked destination address")

// dial connects to addr. (Dialer.DialTCP would skip the address parsing,
// but it binds an unset local address explicitly, which exhausts
// ephemeral ports under churn where connect's own choice does not.)
func (t *Transport) dial(ctx context.Context, addr string) (net.Conn, error) {
	return t.dialer.DialContext(ctx, "tcp", addr)
}

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

// DirectConnect opens a TCP connection to the first of addrs that answers.
func (t *Transport) DirectConnect(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	c, err := t.dialChecked(ctx, addrs)
	if err != nil {
		return nil, &Error{Phase: worker.PhaseDial, Err: fmt.Errorf("dialing destination: %w", err)}
	}
	return c, nil
}
