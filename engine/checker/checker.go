package checker

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Level is the depth of a check (seed 000 §13). Only BASIC exists today;
// EGRESS and TARGET are extension points.
type Level uint8

// Check levels.
const (
	LevelBasic Level = iota + 1
)

func (l Level) String() string {
	if l == LevelBasic {
		return "basic"
	}
	return "unknown"
}

// Phase is where a check failed.
type Phase uint8

// Check phases.
const (
	PhaseNone Phase = iota
	PhaseDial
	PhaseHandshake
)

func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseDial:
		return "dial"
	case PhaseHandshake:
		return "handshake"
	}
	return "unknown"
}

// Task is one check to run. Proxy carries the credentials needed for the
// handshake; the checker never logs them.
type Task struct {
	Proxy    proxy.Proxy
	Level    Level
	Priority Priority
	// Timeout bounds the whole check (dial and handshake); 0 means
	// DefaultTimeout.
	Timeout time.Duration
}

// Observation is what a check saw. It is a fact, not a decision.
type Observation struct {
	ID       proxy.ID
	Upstream string
	Level    Level
	Success  bool
	Phase    Phase // where it failed; PhaseNone on success
	Status   int   // the proxy's HTTP status to CONNECT, 0 if none
	Latency  time.Duration
	At       time.Time
	Err      string // failure text without credentials
}

// Bounds of a check.
const (
	DefaultTimeout = 5 * time.Second
	// maxHandshakeBytes bounds what a proxy may send before its CONNECT
	// status line and headers are complete.
	maxHandshakeBytes = 16 << 10
)

// Options configures a Checker.
type Options struct {
	// ProbeTarget is the host:port the BASIC check asks the proxy to
	// CONNECT to. Empty means the proxy's own address: a 200 then proves
	// the proxy speaks CONNECT and accepts our credentials without sending
	// the probe anywhere else. Operators set a real target (cmd wires it).
	ProbeTarget string
	// Dialer dials proxies; nil means a plain net.Dialer.
	Dialer interface {
		DialContext(ctx context.Context, network, addr string) (net.Conn, error)
	}
	Now func() time.Time
}

// Checker runs checks. It is safe for concurrent use.
type Checker struct {
	probe  string
	dialer interface {
		DialContext(ctx context.Context, network, addr string) (net.Conn, error)
	}
	now func() time.Time
}

// New returns a Checker.
func New(o Options) *Checker {
	c := &Checker{probe: o.ProbeTarget, dialer: o.Dialer, now: o.Now}
	if c.dialer == nil {
		c.dialer = &net.Dialer{}
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// Check runs t and returns what it observed. It never returns an error: a
// failure is an observation with the phase it happened in.
func (c *Checker) Check(ctx context.Context, t Task) Observation {
	level := t.Level
	if level == 0 {
		level = LevelBasic
	}
	obs := Observation{ID: t.Proxy.ID, Upstream: t.Proxy.Upstream, Level: level, At: c.now()}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	phase, status, err := c.basic(ctx, &t.Proxy)
	obs.Latency = time.Since(start)
	obs.Status = status
	if err != nil {
		obs.Phase = phase
		obs.Err = err.Error()
		return obs
	}
	obs.Success = true
	return obs
}

// basic dials the proxy and performs a CONNECT handshake to the probe
// target; a 200 is success.
func (c *Checker) basic(ctx context.Context, p *proxy.Proxy) (Phase, int, error) {
	if p.Key.Scheme != proxy.SchemeHTTP {
		return PhaseNone, 0, fmt.Errorf("checking %s proxy: scheme not supported", p.Key.Scheme)
	}
	addr := p.Addr()
	conn, err := c.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return PhaseDial, 0, fmt.Errorf("dialing proxy: %w", err)
	}
	defer conn.Close()
	// The deadline bounds a proxy that accepts and then says nothing;
	// AfterFunc covers a cancelled parent context as well.
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	target := c.probe
	if target == "" {
		target = addr
	}
	req := "CONNECT " + target + " HTTP/1.1\r\nHost: " + target + "\r\n"
	if p.Key.Username != "" || p.Password != "" {
		cred := base64.StdEncoding.EncodeToString([]byte(p.Key.Username + ":" + p.Password))
		req += "Proxy-Authorization: Basic " + cred + "\r\n"
	}
	req += "\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		return PhaseHandshake, 0, fmt.Errorf("sending CONNECT: %w", ctxErr(ctx, err))
	}
	br := bufio.NewReader(io.LimitReader(conn, maxHandshakeBytes))
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		return PhaseHandshake, 0, fmt.Errorf("reading CONNECT response: %w", ctxErr(ctx, err))
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return PhaseHandshake, resp.StatusCode, fmt.Errorf("proxy answered CONNECT with %d", resp.StatusCode)
	}
	return PhaseNone, resp.StatusCode, nil
}

// ctxErr prefers the context's reason over the "use of closed connection"
// that AfterFunc's close produces.
func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return fmt.Errorf("%w (%v)", ctx.Err(), err)
	}
	return err
}
