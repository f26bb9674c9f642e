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
	"strings"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Level is the depth of a check (seed 000 §13).
type Level uint8

// Check levels.
const (
	// LevelBasic: TCP connect and a proxy CONNECT handshake.
	LevelBasic Level = iota + 1
	// LevelEgress: BASIC, then a request through the proxy to an echo
	// service, reporting the exit IP and what leaked (our address, proxy
	// headers). It is a proxy-level check like BASIC.
	LevelEgress
	// LevelTarget: a request through the proxy to one routing's target
	// URL; its result concerns that routing only.
	LevelTarget
)

func (l Level) String() string {
	switch l {
	case LevelBasic:
		return "basic"
	case LevelEgress:
		return "egress"
	case LevelTarget:
		return "target"
	}
	return "unknown"
}

// Phase is where a check failed.
type Phase uint8

// Check phases.
const (
	PhaseNone Phase = iota
	// PhaseDial: the proxy could not be reached.
	PhaseDial
	// PhaseHandshake: the proxy refused or garbled the CONNECT.
	PhaseHandshake
	// PhaseRequest: the request through the proxy failed before a
	// response status arrived (the proxy could not reach the URL, or cut).
	PhaseRequest
	// PhaseStatus: the URL answered with a status the check does not
	// accept.
	PhaseStatus
	// PhaseEcho: the echo service's answer could not be read as one.
	PhaseEcho
)

func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseDial:
		return "dial"
	case PhaseHandshake:
		return "handshake"
	case PhaseRequest:
		return "request"
	case PhaseStatus:
		return "status"
	case PhaseEcho:
		return "echo"
	}
	return "unknown"
}

// Task is one check to run. Proxy carries the credentials needed for the
// handshake; the checker never logs or reports them.
type Task struct {
	Proxy    proxy.Proxy
	Level    Level // 0 means LevelBasic
	Priority Priority
	// Timeout bounds the whole check; 0 means DefaultTimeout.
	Timeout time.Duration
	// ProbeTarget is the host:port BASIC (and EGRESS before its request)
	// CONNECTs to; empty: Options.ProbeTarget, then the proxy's own
	// address.
	ProbeTarget string
	// URL is the echo service (EGRESS) or the routing's target (TARGET).
	URL string
	// ExpectStatus is the status TARGET requires; 0 means 200.
	ExpectStatus int
	// Routing names the routing a TARGET check is for.
	Routing string
}

// Key identifies a task for coalescing: one proxy may have one task per
// level (and per routing for TARGET) queued or running.
type Key struct {
	ID      proxy.ID
	Level   Level
	Routing string
}

// Key returns t's coalescing key.
func (t *Task) Key() Key {
	l := t.Level
	if l == 0 {
		l = LevelBasic
	}
	k := Key{ID: t.Proxy.ID, Level: l}
	if l == LevelTarget {
		k.Routing = t.Routing
	}
	return k
}

// Observation is what a check saw. It is a fact, not a decision: the
// controller's reducer decides what it means for the proxy.
type Observation struct {
	ID       proxy.ID
	Upstream string
	Level    Level
	Routing  string // TARGET only
	Success  bool   // every step of the level completed as required
	Phase    Phase  // where it failed; PhaseNone on success
	Status   int    // the HTTP status of the last step, 0 if none
	Latency  time.Duration
	At       time.Time
	Err      string // failure text without credentials or URLs

	// EGRESS only, on success: the address the echo service saw us come
	// from, whether one of our own addresses appeared anywhere in what it
	// received, and which proxy-revealing headers it received (canonical
	// names from a fixed list, sorted).
	ExitIP        string
	AddressLeaked bool
	ProxyHeaders  []string
}

// Bounds of a check.
const (
	DefaultTimeout = 5 * time.Second
	// maxHandshakeBytes bounds what a proxy may send before its CONNECT
	// status line and headers are complete.
	maxHandshakeBytes = 16 << 10
	// maxEchoBytes bounds an echo or target answer read by a check.
	maxEchoBytes = 64 << 10
	// selfTTL is how long a learned own address is trusted.
	selfTTL = 10 * time.Minute
	// maxSelfEntries bounds the own-address cache (one entry per echo URL).
	maxSelfEntries = 64
)

// Dialer dials proxies.
type Dialer interface {
	DialContext(ctx context.Context, network, addr string) (net.Conn, error)
}

// Options configures a Checker.
type Options struct {
	// ProbeTarget is the default host:port the BASIC check asks the proxy
	// to CONNECT to. Empty means the proxy's own address: a 200 then
	// proves the proxy speaks CONNECT and accepts our credentials without
	// sending the probe anywhere else. A task's ProbeTarget overrides it.
	ProbeTarget string
	// Dialer dials proxies; nil means a plain net.Dialer.
	Dialer Dialer
	// Self returns our own addresses as an echo service at echoURL sees
	// them, for the EGRESS leak test. nil: learned by one direct request
	// to the echo URL (no proxy), cached for ten minutes. The local
	// address of the connection to the proxy always counts as ours too.
	Self func(ctx context.Context, echoURL string) ([]string, error)
	Now  func() time.Time
}

// Checker runs checks. It is safe for concurrent use.
type Checker struct {
	probe  string
	dialer Dialer
	now    func() time.Time
	self   func(ctx context.Context, echoURL string) ([]string, error)
	// through sends EGRESS and TARGET requests through the proxy named in
	// the request's context; direct learns our own address.
	through *http.Client
	direct  *http.Client

	selfMu    sync.Mutex
	selfCache map[string]selfEntry
}

type selfEntry struct {
	addrs []string
	at    time.Time
}

// New returns a Checker.
func New(o Options) *Checker {
	c := &Checker{probe: o.ProbeTarget, dialer: o.Dialer, now: o.Now, self: o.Self, selfCache: map[string]selfEntry{}}
	if c.dialer == nil {
		c.dialer = &net.Dialer{}
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.through = &http.Client{
		Transport: &http.Transport{
			Proxy:                  proxyFromContext,
			DialContext:            c.dialRecording,
			DisableKeepAlives:      true, // every check judges a fresh connection
			MaxResponseHeaderBytes: maxHandshakeBytes,
			ForceAttemptHTTP2:      false,
		},
		// A check judges the first answer; a redirect is an answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c.direct = &http.Client{
		Transport: &http.Transport{
			Proxy:                  nil,
			DisableKeepAlives:      true,
			MaxResponseHeaderBytes: maxHandshakeBytes,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	if c.self == nil {
		c.self = c.learnSelf
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
	if level == LevelTarget {
		obs.Routing = t.Routing
	}
	timeout := t.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()

	var (
		phase  Phase
		status int
		err    error
	)
	switch level {
	case LevelBasic:
		phase, status, err = c.basic(ctx, &t.Proxy, c.probeFor(&t))
	case LevelEgress:
		phase, status, err = c.basic(ctx, &t.Proxy, c.probeFor(&t))
		if err == nil {
			phase, status, err = c.egress(ctx, &t, &obs)
		}
	case LevelTarget:
		phase, status, err = c.target(ctx, &t)
	default:
		err = fmt.Errorf("checking: unknown level %d", level)
	}
	obs.Latency = time.Since(start)
	obs.Status = status
	if err != nil {
		obs.Phase = phase
		obs.Err = redact(err.Error(), &t)
		obs.ExitIP, obs.AddressLeaked, obs.ProxyHeaders = "", false, nil
		return obs
	}
	obs.Success = true
	return obs
}

func (c *Checker) probeFor(t *Task) string {
	if t.ProbeTarget != "" {
		return t.ProbeTarget
	}
	return c.probe
}

// basic dials the proxy and performs a CONNECT handshake to target (the
// proxy's own address when empty); a 200 is success.
func (c *Checker) basic(ctx context.Context, p *proxy.Proxy, target string) (Phase, int, error) {
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

// redact removes what an error text must never carry out of the checker:
// the proxy password and the task's URL (target URLs may hold tokens).
func redact(s string, t *Task) string {
	if t.Proxy.Password != "" {
		s = strings.ReplaceAll(s, t.Proxy.Password, "REDACTED")
	}
	if t.URL != "" {
		s = strings.ReplaceAll(s, t.URL, "URL")
	}
	return s
}

var _ Executor = (*Checker)(nil)
