package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/adapters/http/auth"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
	"github.com/proxypool/proxypool/engine/gateway/relay"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/transport"
	"github.com/proxypool/proxypool/engine/netguard"
)

// MaxAttempts is the most distinct proxies one request tries (seed 000
// §7.2): GET and HEAD without a body, and CONNECT before its 200.
const MaxAttempts = 2

// ReasonHeader carries the gateway's reason on every response it makes up
// itself, so a client can tell the gateway's refusal from a target's.
const ReasonHeader = "X-Proxypool-Reason"

// Dispatcher is the allocation contract of seed 000 §7.1. A refused
// Acquire returns an invalid Allocation whose Rule is the matched rule (nil
// when none matched), so onUnavailable can be honoured.
type Dispatcher interface {
	Acquire(ctx context.Context, req *dispatch.Request) (dispatch.Allocation, error)
	Commit(a dispatch.Allocation) error
	Release(a dispatch.Allocation, o worker.Outcome)
}

// Forwarder carries requests and tunnels through an upstream proxy, or
// directly to checked destination addresses (see transport.Transport).
type Forwarder interface {
	RoundTrip(ctx context.Context, req *transport.Request, target *snapshot.Target, resp *transport.Response) error
	Connect(ctx context.Context, target *snapshot.Target, authority string) (*transport.Tunnel, error)
	DirectRoundTrip(ctx context.Context, req *transport.Request, addrs []netip.AddrPort, resp *transport.Response) error
	DirectConnect(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error)
}

// Policy is the reloadable part of the handler: who may connect, who they
// are, where they may go, how fast. It is immutable once built; reload
// swaps it.
type Policy struct {
	Auth      auth.Authenticator
	challenge string
	// Allow is access.allowCIDRs (empty admits every address); Trusted is
	// gateway.trustedProxies, the only peers whose X-Forwarded-For counts.
	Allow, Trusted []netip.Prefix
	Guard          *netguard.Guard
	MaxHeaderCount int
	rates          *clientRates
	relay          *relay.Pool // copies tunnels: gateway.tunnelSplice picks
}

// The two ways of copying tunnels, shared by every Handler of the process
// so their bounds are the process's: buffers (the default pool) or splice.
var (
	bufferRelay = relay.NewPool(relay.Options{})
	spliceRelay = relay.NewPool(relay.Options{Splice: true})
)

// NewPolicy builds the policy of cfg's gateway and security sections.
// resolver nil means net.DefaultResolver.
func NewPolicy(cfg *config.Config, resolver netguard.Resolver) (*Policy, error) {
	gw := &cfg.Gateway
	a := gw.Auth
	if a.Mode == "" {
		a.Mode = auth.ModeNone
	}
	au, err := auth.New(a)
	if err != nil {
		return nil, fmt.Errorf("building gateway policy: %w", err)
	}
	allow, err := auth.ParsePrefixes(gw.Access.AllowCIDRs)
	if err != nil {
		return nil, fmt.Errorf("building gateway policy: access.allowCIDRs: %w", err)
	}
	trusted, err := auth.ParsePrefixes(gw.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("building gateway policy: trustedProxies: %w", err)
	}
	guard, err := netguard.FromConfig(&cfg.Security, resolver)
	if err != nil {
		return nil, fmt.Errorf("building gateway policy: %w", err)
	}
	n := gw.Limits.MaxHeaderCount
	if n <= 0 {
		n = config.DefaultMaxHeaderCount
	}
	return &Policy{
		Auth: au, challenge: challenge(au.Schemes()), Allow: allow, Trusted: trusted, Guard: guard,
		MaxHeaderCount: n, rates: newClientRates(gw.Limits.RequestsPerSecond),
		relay: pickRelay(gw.TunnelSplice),
	}, nil
}

func pickRelay(splice bool) *relay.Pool {
	if splice {
		return spliceRelay
	}
	return bufferRelay
}

// Options build a Handler.
type Options struct {
	Dispatcher Dispatcher
	Forwarder  Forwarder
	Policy     *Policy
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock for rate limits; nil means time.Now.
	Now func() time.Time
	// StickyHeaders returns the canonical session header names of the
	// sticky rules in force (nil: none): only those are handed to Acquire.
	StickyHeaders func() []string
}

// Handler serves proxy requests and CONNECT on the connections of a
// Server.
type Handler struct {
	d      Dispatcher
	f      Forwarder
	policy atomic.Pointer[Policy]
	log    *slog.Logger
	now    func() time.Time
	m      *metrics
	sticky func() []string

	selfMu sync.Mutex
	self   []netip.AddrPort
}

// NewHandler returns a Handler; Dispatcher, Forwarder and Policy are
// required.
func NewHandler(o Options) (*Handler, error) {
	if o.Dispatcher == nil || o.Forwarder == nil || o.Policy == nil {
		return nil, errors.New("building gateway handler: dispatcher, forwarder and policy are required")
	}
	h := &Handler{d: o.Dispatcher, f: o.Forwarder, log: o.Logger, now: o.Now, m: newMetrics(o.Registerer), sticky: o.StickyHeaders}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	if h.sticky == nil {
		h.sticky = func() []string { return nil }
	}
	h.policy.Store(o.Policy)
	return h, nil
}

// SetPolicy swaps the policy for requests that start from now on; the
// gateway's own listener addresses carry over to the new guard.
func (h *Handler) SetPolicy(p *Policy) {
	h.selfMu.Lock()
	defer h.selfMu.Unlock()
	p.Guard.SetSelf(h.self)
	h.policy.Store(p)
}

// AddSelf records listener addresses the gateway serves on: requests to
// them are refused (self-connection). A wildcard address stands for every
// local address on its port.
func (h *Handler) AddSelf(addrs ...netip.AddrPort) {
	h.selfMu.Lock()
	defer h.selfMu.Unlock()
	h.self = append(h.self, netguard.ExpandSelf(addrs)...)
	h.policy.Load().Guard.SetSelf(h.self)
}

// Accepted implements ListenerEvents.
func (h *Handler) Accepted() { h.m.connsAccepted.Inc(); h.m.connsActive.Inc() }

// Closed implements ListenerEvents.
func (h *Handler) Closed() { h.m.connsActive.Dec() }

// Refused implements ListenerEvents.
func (h *Handler) Refused(reason string) { h.m.rejections[reason].Inc() }

// serve answers one request read by c; false ends the connection.
func (h *Handler) serve(c *conn) bool {
	start := time.Now()
	class := classOf(c.method)
	res, keep := h.serveRequest(c)
	h.m.requests[class][res].Inc()
	h.m.duration[class].Observe(time.Since(start).Seconds())
	return keep
}

// serveRequest makes the checks of the request path in order, then
// forwards or tunnels.
func (h *Handler) serveRequest(c *conn) (result, bool) {
	p, r := c.p, &c.req
	ip := auth.Normalize(c.peer)
	if len(p.Trusted) > 0 {
		ip = auth.ClientIP(c.peer, forwardedFor(r), p.Trusted)
	}
	if len(p.Allow) > 0 && !auth.Contains(p.Allow, ip) {
		return h.reject(c, 403, ReasonAccessDenied)
	}
	if r.Count > p.MaxHeaderCount {
		return h.reject(c, 431, ReasonTooManyHeaders)
	}
	creds, session := credentials(r, ip)
	who, ok := p.Auth.Authenticate(creds)
	if !ok {
		if len(p.Auth.Schemes()) == 0 {
			// No credential could help (ipWhitelist).
			return h.reject(c, 403, ReasonAccessDenied)
		}
		return h.rejectWith(c, 407, ReasonAuthRequired, "Proxy-Authenticate", p.challenge)
	}
	cl := Client{IP: ip, Name: who.Name, Anonymous: who.Method == auth.ModeNone, Session: session}
	key := rateKey{name: cl.Name}
	if cl.Anonymous {
		key = rateKey{ip: ip}
	}
	if !p.rates.allow(key, h.now()) {
		return h.reject(c, 429, ReasonRateLimited)
	}
	if c.method == "CONNECT" {
		return h.serveConnect(c, p, &cl), false
	}
	return h.serveForward(c, p, &cl)
}

// forwardedFor returns the X-Forwarded-For lines (allocated only when
// the client sent some and a trusted peer could make them count).
func forwardedFor(r *h1.Request) []string {
	var xff []string
	for i := range r.Fields {
		if f := &r.Fields[i]; h1.EqualFold(f.Name, "x-forwarded-for") {
			xff = append(xff, string(f.Value))
		}
	}
	return xff
}

// stickyHeader returns the header map Acquire reads sessions from: only
// the sticky rules' session headers the client sent, nil when none.
func (h *Handler) stickyHeader(r *h1.Request) map[string][]string {
	var m map[string][]string
	for _, name := range h.sticky() {
		if v, ok := r.Get(name); ok {
			if m == nil {
				m = make(map[string][]string, 1)
			}
			m[name] = []string{string(v)}
		}
	}
	return m
}

// reject answers with a gateway-made error and counts the reason.
func (h *Handler) reject(c *conn, status int, reason string) (result, bool) {
	return h.rejectWith(c, status, reason, "", "")
}

func (h *Handler) rejectWith(c *conn, status int, reason, name, value string) (result, bool) {
	h.m.rejections[reason].Inc()
	keep := c.keepAlive() && status != 400
	keep = c.writeError(status, reason, keep, name, value) && keep
	if status == 400 {
		return resultBadRequest, keep
	}
	return resultRejected, keep
}

// refuseHead answers a request head that could not be parsed; the
// connection closes after it.
func (h *Handler) refuseHead(c *conn, he *h1.Error) {
	reason := ReasonBadRequest
	switch {
	case he.Kind == h1.KindFraming:
		reason = ReasonBadFraming
	case he.Kind == h1.KindTooLarge:
		reason = ReasonHeadersTooLarge
	}
	h.m.rejections[reason].Inc()
	h.m.requests[classOther][resultBadRequest].Inc()
	c.writeError(he.Status, reason, false, "", "")
}

// refuse answers a dispatch refusal: 503 with the reason.
func (h *Handler) refuse(c *conn, err error) (result, bool) {
	reason := ReasonNoProxy
	var nc *dispatch.NoCandidateError
	switch {
	case errors.Is(err, dispatch.ErrStale):
		reason = ReasonStale
	case errors.Is(err, dispatch.ErrNoRoute):
		reason = ReasonNoRoute
	case errors.As(err, &nc) && nc.Reason == dispatch.ReasonRoutingLimit:
		reason = ReasonRoutingLimit
	}
	return h.reject(c, 503, reason)
}

// goDirect reports whether a refused Acquire should fall back to dialling
// the destination directly: the rule says so and the refusal was for lack
// of a proxy (never for a stale snapshot or a missing route).
func goDirect(a dispatch.Allocation, err error) bool {
	return a.Rule != nil && a.Rule.OnUnavailable == routing.Direct && errors.Is(err, dispatch.ErrNoCandidate)
}

// upstreamFailed answers 502 after the last attempt failed.
func (h *Handler) upstreamFailed(c *conn, prefix string, err error) (result, bool) {
	reason := prefix + strings.ReplaceAll(transport.PhaseOf(err).String(), "_", "-")
	keep := c.keepAlive()
	keep = c.writeError(502, reason, keep, "", "") && keep
	return resultUpstreamError, keep
}

// checkDestination applies the destination guard; false means answered.
// On success it returns the checked addresses (for a direct dial).
func (h *Handler) checkDestination(ctx context.Context, c *conn, p *Policy, host string, port uint16) ([]netip.AddrPort, result, bool) {
	addrs, err := p.Guard.Resolve(ctx, host, port)
	switch {
	case err == nil:
		return addrs, resultOK, true
	case netguard.IsDenied(err):
		h.log.Debug("destination denied", "err", err)
		res, _ := h.reject(c, 403, ReasonDeniedDestination)
		return nil, res, false
	case ctx.Err() != nil:
		return nil, resultCanceled, false
	}
	h.log.Debug("destination check failed", "err", err)
	c.writeError(502, "destination-unresolved", c.keepAlive(), "", "")
	return nil, resultUpstreamError, false
}

// serveForward forwards an absolute-form request; false ends the
// connection.
func (h *Handler) serveForward(c *conn, p *Policy, cl *Client) (result, bool) {
	host, port, uri, err := forwardTarget(c.req.Target)
	if err != nil {
		return h.reject(c, 400, ReasonBadTarget)
	}
	ctx := c.context()
	addrs, res, ok := h.checkDestination(ctx, c, p, host, port)
	if !ok {
		return res, res != resultCanceled && c.keepAlive()
	}
	c.auth = appendAuthority(c.auth[:0], host, port)
	hasBody := !c.body.Done()
	attempts := 1
	if (c.method == "GET" || c.method == "HEAD") && !hasBody {
		attempts = MaxAttempts
	}
	c.treq = transport.Request{
		Method: c.method, Authority: c.auth, URI: uri, Decode: c.req.Minor == 0,
		Idempotent: !hasBody && (c.method == "GET" || c.method == "HEAD" || c.method == "OPTIONS" || c.method == "TRACE"),
	}
	if hasBody {
		c.treq.Body = &c.body
		if c.stop == nil {
			c.stop = c.stopBody
		}
		c.treq.StopBody = c.stop
		if c.req.ExpectContinue {
			if c.cont == nil {
				c.cont = c.sendContinue
			}
			c.treq.Continue = c.cont
		}
	}
	// Kept in c: handed to an interface, it would escape per request.
	req := &c.dreq
	*req = dispatch.Request{Host: host, Port: port, Client: cl.Name, Header: h.stickyHeader(&c.req), UserSession: cl.Session}
	var lastErr error
	for try := 0; ; try++ {
		c.watchClient()
		a, err := h.d.Acquire(ctx, req)
		if c.unwatchClient() {
			if err == nil {
				h.d.Release(a, worker.Outcome{})
			}
			return resultCanceled, false
		}
		if err != nil {
			switch {
			case lastErr != nil:
				return h.upstreamFailed(c, "upstream-", lastErr)
			case goDirect(a, err):
				return h.forwardDirect(c, a.Rule.StickyHeader, addrs)
			}
			return h.refuse(c, err)
		}
		c.out = appendOutbound(c.out[:0], &c.req, c.auth, a.Rule.StickyHeader)
		c.treq.Header = c.out
		start := time.Now()
		if !hasBody { // else the transport reads the client
			c.watchClient()
		}
		err = h.f.RoundTrip(ctx, &c.treq, a.Target, &c.resp)
		left := c.unwatchClient()
		h.m.bytesUp.Add(float64(c.body.N))
		c.body.N = 0
		if left {
			// Not the proxy's failure: no outcome.
			if err == nil {
				c.resp.Close()
			}
			h.d.Release(a, worker.Outcome{})
			return resultCanceled, false
		}
		if err != nil {
			var be *transport.BodyError
			if errors.As(err, &be) {
				h.d.Release(a, worker.Outcome{})
				return h.clientBodyFailed(c, be)
			}
			lastErr = err
			switch h.failedAttempt(ctx, a, req, err, try, min(attempts, a.Rule.MaxAttempts)) {
			case attemptCanceled:
				return resultCanceled, false
			case attemptRetry:
				continue
			}
			return h.upstreamFailed(c, "upstream-", err)
		}
		h.m.upstreamConnect.Observe(time.Since(start).Seconds())
		if !h.commit(c, a) {
			c.resp.Close()
			return resultUpstreamError, false
		}
		res, outcome, keep := h.stream(c)
		h.settle(a, outcome)
		return res, keep
	}
}

// clientBodyFailed ends a request whose body the client broke or never
// finished: a malformed chunked body is refused as bad framing.
func (h *Handler) clientBodyFailed(c *conn, be *transport.BodyError) (result, bool) {
	h.log.Debug("client request body failed", "err", be.Err)
	if errors.Is(be.Err, h1.ErrBadChunk) {
		h.m.rejections[ReasonBadFraming].Inc()
		c.writeError(400, ReasonBadFraming, false, "", "")
		return resultBadRequest, false
	}
	return resultCanceled, false
}

type attemptEnd uint8

const (
	attemptFinal attemptEnd = iota
	attemptRetry
	attemptCanceled
)

// failedAttempt settles an attempt whose upstream failed before anything
// reached the client, for plain requests and CONNECT alike. A client that
// left says nothing about the proxy (no outcome); otherwise the failure is
// blamed on the proxy, which the next attempt excludes so that a retry
// never lands on the same one.
func (h *Handler) failedAttempt(ctx context.Context, a dispatch.Allocation, req *dispatch.Request, err error, try, limit int) attemptEnd {
	if ctx.Err() != nil {
		h.d.Release(a, worker.Outcome{})
		return attemptCanceled
	}
	phase := transport.PhaseOf(err)
	h.m.upstreamFailures[phase].Inc()
	h.d.Release(a, worker.Outcome{Phase: phase})
	h.log.Debug("upstream attempt failed", "proxy", a.Target.ID, "attempt", try+1, "err", err)
	if try+1 < limit && req.AddExclude(a.Target.ID) {
		h.m.retries.Inc()
		return attemptRetry
	}
	return attemptFinal
}

// commit moves a to active once the upstream answered. Commit cannot fail
// on a fresh allocation; if it ever does the request fails closed (500)
// rather than run uncounted.
func (h *Handler) commit(c *conn, a dispatch.Allocation) bool {
	err := h.d.Commit(a)
	if err == nil {
		return true
	}
	h.d.Release(a, worker.Outcome{})
	h.log.Error("committing allocation", "err", err)
	c.writeError(500, "internal", false, "", "")
	return false
}

// settle releases a committed allocation with its final outcome.
func (h *Handler) settle(a dispatch.Allocation, o worker.Outcome) {
	if o.Phase != worker.PhaseNone {
		h.m.upstreamFailures[o.Phase].Inc()
	}
	h.d.Release(a, o)
}

// forwardDirect serves a request of an onUnavailable "direct" rule without
// a proxy, dialling only the guard's checked addresses.
func (h *Handler) forwardDirect(c *conn, sticky string, addrs []netip.AddrPort) (result, bool) {
	h.m.direct.Inc()
	c.out = appendOutbound(c.out[:0], &c.req, c.auth, sticky)
	c.treq.Header = c.out
	if c.body.Done() {
		c.watchClient()
	}
	err := h.f.DirectRoundTrip(c.ctx, &c.treq, addrs, &c.resp)
	left := c.unwatchClient()
	h.m.bytesUp.Add(float64(c.body.N))
	c.body.N = 0
	if left {
		if err == nil {
			c.resp.Close()
		}
		return resultCanceled, false
	}
	if err != nil {
		var be *transport.BodyError
		if errors.As(err, &be) {
			return h.clientBodyFailed(c, be)
		}
		if c.ctx.Err() != nil {
			return resultCanceled, false
		}
		h.log.Debug("direct request failed", "err", err)
		return h.upstreamFailed(c, "direct-", err)
	}
	res, _, keep := h.stream(c)
	return res, keep
}

// StreamBufferSize is the copy buffer of one streamed response (pooled).
const StreamBufferSize = 32 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, StreamBufferSize); return &b }}

// stream writes the upstream response to the client: its end-to-end
// fields, its body in its own framing (chunked passed through verbatim).
// Bytes are flushed whenever the upstream has nothing more at hand, so
// streams (SSE, long polls) flow as they come. Only an upstream read error
// is the proxy's failure; a client that stops reading is not.
func (h *Handler) stream(c *conn) (result, worker.Outcome, bool) {
	resp := &c.resp
	defer resp.Close()
	keep := c.keepAlive() && !resp.BodyUnsent
	body := resp.HasBody()
	// Content-Length frames the body unless a transfer coding overrides
	// it (RFC 9112 §6.3).
	keepLength := resp.TE == nil
	switch {
	case !body:
	case resp.Chunked && c.req.Minor == 1:
	case resp.ContentLength < 0:
		keep = false // until close (or decoded chunks for HTTP/1.0)
	}
	// The client's body was never asked for (or never finished).
	c.linger = c.linger || resp.BodyUnsent || !c.body.Done()
	bw := c.bw
	w := bw.AvailableBuffer()
	w = appendStatusLine(w, c.req.Minor, resp.Status, resp.Reason)
	w = appendResponseFields(w, &resp.Response, keepLength)
	if resp.TE != nil && c.req.Minor == 1 && (body || c.method == "HEAD") {
		w = append(w, "Transfer-Encoding: "...)
		w = append(w, resp.TE...)
		w = append(w, "\r\n"...)
	}
	w = appendConnection(w, c.req.Minor, keep)
	w = append(w, "\r\n"...)
	if _, err := bw.Write(w); err != nil {
		return resultCanceled, worker.Outcome{Success: true}, false
	}
	if !body {
		resp.Close() // pool the upstream connection before the client can ask again
		if err := bw.Flush(); err != nil {
			return resultCanceled, worker.Outcome{Success: true}, false
		}
		return resultOK, worker.Outcome{Success: true}, keep
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int64
	defer func() { h.m.bytesDown.Add(float64(n)) }()
	for {
		if resp.Body.Buffered() == 0 && bw.Buffered() > 0 {
			// The next read may wait: let the client have what we hold.
			if err := bw.Flush(); err != nil {
				return resultCanceled, worker.Outcome{Success: true}, false
			}
		}
		nr, rerr := resp.Body.Read(buf)
		if nr > 0 {
			nw, werr := bw.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return resultCanceled, worker.Outcome{Success: true}, false
			}
		}
		if rerr == io.EOF || (rerr == nil && resp.Body.Done()) {
			// The body is in our buffer: pool the upstream connection
			// before the client, once it has the end, can ask again.
			resp.Close()
			if err := bw.Flush(); err != nil {
				return resultCanceled, worker.Outcome{Success: true}, false
			}
			return resultOK, worker.Outcome{Success: true}, keep
		}
		if rerr != nil {
			h.log.Debug("upstream response body failed", "err", rerr)
			// The client must see a broken response, not a short one.
			_ = bw.Flush()
			c.abort()
			return resultUpstreamError, worker.Outcome{Phase: worker.PhaseTunnel}, false
		}
	}
}

// serveConnect opens a tunnel through an upstream proxy.
func (h *Handler) serveConnect(c *conn, p *Policy, cl *Client) result {
	host, port, err := connectTarget(c.req.Target)
	if err != nil {
		res, _ := h.reject(c, 400, ReasonBadTarget)
		return res
	}
	ctx := c.srv.ctx
	addrs, res, ok := h.checkDestination(ctx, c, p, host, port)
	if !ok {
		return res
	}
	authority := joinAuthority(host, port)
	req := &c.dreq
	*req = dispatch.Request{Host: host, Port: port, Client: cl.Name, Header: h.stickyHeader(&c.req), UserSession: cl.Session}
	var lastErr error
	for try := 0; ; try++ {
		a, err := h.d.Acquire(ctx, req)
		if err != nil {
			switch {
			case lastErr != nil:
				res, _ := h.upstreamFailed(c, "upstream-", lastErr)
				return res
			case goDirect(a, err):
				return h.connectDirect(c, ctx, addrs)
			}
			res, _ := h.refuse(c, err)
			return res
		}
		start := time.Now()
		tun, err := h.f.Connect(ctx, a.Target, authority)
		if err != nil {
			lastErr = err
			switch h.failedAttempt(ctx, a, req, err, try, min(MaxAttempts, a.Rule.MaxAttempts)) {
			case attemptCanceled:
				return resultCanceled
			case attemptRetry:
				continue
			}
			res, _ := h.upstreamFailed(c, "upstream-", err)
			return res
		}
		h.m.upstreamConnect.Observe(time.Since(start).Seconds())
		if !h.commit(c, a) {
			_ = tun.Conn.Close()
			return resultUpstreamError
		}
		return h.tunnel(c, tun, func(o worker.Outcome) { h.settle(a, o) })
	}
}

// connectDirect opens a tunnel straight to the guard's checked addresses.
func (h *Handler) connectDirect(c *conn, ctx context.Context, addrs []netip.AddrPort) result {
	h.m.direct.Inc()
	conn, err := h.f.DirectConnect(ctx, addrs)
	if err != nil {
		if ctx.Err() != nil {
			return resultCanceled
		}
		res, _ := h.upstreamFailed(c, "direct-", err)
		return res
	}
	return h.tunnel(c, &transport.Tunnel{Conn: conn}, func(worker.Outcome) {})
}

var established = []byte("HTTP/1.1 200 Connection established\r\n\r\n")

// tunnel answers 200 and carries bytes both ways until both sides closed;
// release is called exactly once with the outcome. From the 200 on nothing
// is retried (seed 000 §7.2).
func (h *Handler) tunnel(c *conn, tun *transport.Tunnel, release func(worker.Outcome)) result {
	upstream := tun.Conn
	defer upstream.Close()
	client := c.raw
	// The head deadline does not apply to a tunnel.
	_ = client.SetDeadline(time.Time{})
	w := append(c.bw.AvailableBuffer(), established...)
	if _, err := client.Write(append(w, tun.Buffered...)); err != nil {
		release(worker.Outcome{Success: true})
		return resultCanceled
	}
	h.m.bytesDown.Add(float64(len(tun.Buffered)))
	if n := c.br.Buffered(); n > 0 {
		// Bytes the client pipelined behind its CONNECT (a TLS hello).
		if _, err := upstream.Write(c.br.Bytes()); err != nil {
			release(worker.Outcome{Phase: worker.PhaseTunnel})
			return resultUpstreamError
		}
		h.m.bytesUp.Add(float64(n))
	}
	// An idle tunnel holds no buffer of ours.
	c.releaseBuffers()
	h.m.tunnelsActive.Inc()
	up, down := pipe(h.policy.Load().relay, client, upstream)
	h.m.tunnelsActive.Dec()
	h.m.bytesUp.Add(float64(up))
	h.m.bytesDown.Add(float64(down))
	release(worker.Outcome{Success: true})
	return resultOK
}

// pipe copies both ways between two raw connections (normally
// *net.TCPConn, which relay copies holding no buffer or pipe while idle).
// A clean end of one direction is passed on as a half-close; an error in
// either tears both down.
func pipe(rp *relay.Pool, client, upstream io.ReadWriteCloser) (up, down int64) {
	if rp == nil { // a Policy built by hand, in tests
		rp = bufferRelay
	}
	up, down, _ = rp.Copy(client, upstream)
	return up, down
}

var _ ListenerEvents = (*Handler)(nil)
