package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
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
// directly to checked destination addresses.
type Forwarder interface {
	RoundTrip(req *http.Request, target *snapshot.Target) (*http.Response, error)
	Connect(ctx context.Context, target *snapshot.Target, authority string) (*transport.Tunnel, error)
	DirectRoundTrip(req *http.Request, addrs []netip.AddrPort) (*http.Response, error)
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
}

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
	}, nil
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
}

// Handler is the gateway's http.Handler.
type Handler struct {
	d       Dispatcher
	f       Forwarder
	policy  atomic.Pointer[Policy]
	log     *slog.Logger
	now     func() time.Time
	m       *metrics
	tunnels tunnelSet

	selfMu sync.Mutex
	self   []netip.AddrPort
}

// NewHandler returns a Handler; Dispatcher, Forwarder and Policy are
// required.
func NewHandler(o Options) (*Handler, error) {
	if o.Dispatcher == nil || o.Forwarder == nil || o.Policy == nil {
		return nil, errors.New("building gateway handler: dispatcher, forwarder and policy are required")
	}
	h := &Handler{d: o.Dispatcher, f: o.Forwarder, log: o.Logger, now: o.Now, m: newMetrics(o.Registerer)}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.policy.Store(o.Policy)
	h.tunnels.init()
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

// ServeHTTP serves one proxy request or CONNECT.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	class := classOf(r.Method)
	res, abort := h.serve(w, r)
	h.m.requests[class][res].Inc()
	h.m.duration[class].Observe(time.Since(start).Seconds())
	if abort {
		// The response is already under way and its body broke: the
		// client must see a broken response, not a short one.
		panic(http.ErrAbortHandler)
	}
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request) (result, bool) {
	if lc, ok := r.Context().Value(connKey{}).(*limitConn); ok && lc.fr.nextRequest() {
		w.Header().Set("Connection", "close")
		return h.reject(w, http.StatusBadRequest, ReasonBadFraming), false
	}
	p := h.policy.Load()
	var peer netip.Addr
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		peer = ap.Addr()
	}
	ip := auth.ClientIP(peer, r.Header["X-Forwarded-For"], p.Trusted)
	if len(p.Allow) > 0 && !auth.Contains(p.Allow, ip) {
		return h.reject(w, http.StatusForbidden, ReasonAccessDenied), false
	}
	if len(r.Header) > p.MaxHeaderCount {
		return h.reject(w, http.StatusRequestHeaderFieldsTooLarge, ReasonTooManyHeaders), false
	}
	creds, session := credentials(r, ip)
	who, ok := p.Auth.Authenticate(creds)
	if !ok {
		if len(p.Auth.Schemes()) == 0 {
			// No credential could help (ipWhitelist).
			return h.reject(w, http.StatusForbidden, ReasonAccessDenied), false
		}
		w.Header().Set("Proxy-Authenticate", p.challenge)
		return h.reject(w, http.StatusProxyAuthRequired, ReasonAuthRequired), false
	}
	c := Client{IP: ip, Name: who.Name, Anonymous: who.Method == auth.ModeNone, Session: session}
	key := rateKey{name: c.Name}
	if c.Anonymous {
		key = rateKey{ip: ip}
	}
	if !p.rates.allow(key, h.now()) {
		return h.reject(w, http.StatusTooManyRequests, ReasonRateLimited), false
	}
	if r.Method == http.MethodConnect {
		return h.serveConnect(w, r, p, &c), false
	}
	return h.serveForward(w, r, p, &c)
}

// reject answers with a gateway-made error and counts the reason.
func (h *Handler) reject(w http.ResponseWriter, status int, reason string) result {
	h.m.rejections[reason].Inc()
	writeError(w, status, reason)
	if status == http.StatusBadRequest {
		return resultBadRequest
	}
	return resultRejected
}

func writeError(w http.ResponseWriter, status int, reason string) {
	hdr := w.Header()
	hdr.Set(ReasonHeader, reason)
	hdr.Set("Content-Type", "text/plain; charset=utf-8")
	hdr.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, "proxypool: "+reason+"\n")
}

// refuse answers a dispatch refusal: 503 with the reason.
func (h *Handler) refuse(w http.ResponseWriter, err error) result {
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
	return h.reject(w, http.StatusServiceUnavailable, reason)
}

// goDirect reports whether a refused Acquire should fall back to dialling
// the destination directly: the rule says so and the refusal was for lack
// of a proxy (never for a stale snapshot or a missing route).
func goDirect(a dispatch.Allocation, err error) bool {
	return a.Rule != nil && a.Rule.OnUnavailable == routing.Direct && errors.Is(err, dispatch.ErrNoCandidate)
}

// upstreamFailed answers 502 after the last attempt failed.
func (h *Handler) upstreamFailed(w http.ResponseWriter, prefix string, err error) result {
	reason := prefix + strings.ReplaceAll(transport.PhaseOf(err).String(), "_", "-")
	writeError(w, http.StatusBadGateway, reason)
	return resultUpstreamError
}

// checkDestination applies the destination guard; false means answered.
// On success it returns the checked addresses (for a direct dial).
func (h *Handler) checkDestination(ctx context.Context, w http.ResponseWriter, p *Policy, host string, port uint16) ([]netip.AddrPort, result, bool) {
	addrs, err := p.Guard.Resolve(ctx, host, port)
	switch {
	case err == nil:
		return addrs, resultOK, true
	case netguard.IsDenied(err):
		h.log.Debug("destination denied", "err", err)
		return nil, h.reject(w, http.StatusForbidden, ReasonDeniedDestination), false
	case ctx.Err() != nil:
		return nil, resultCanceled, false
	}
	h.log.Debug("destination check failed", "err", err)
	writeError(w, http.StatusBadGateway, "destination-unresolved")
	return nil, resultUpstreamError, false
}

func retryable(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Body == http.NoBody
}

// serveForward forwards an absolute-form request. The bool asks ServeHTTP
// to abort the response.
func (h *Handler) serveForward(w http.ResponseWriter, r *http.Request, p *Policy, c *Client) (result, bool) {
	host, port, err := forwardTarget(r)
	if err != nil {
		return h.reject(w, http.StatusBadRequest, ReasonBadTarget), false
	}
	ctx := r.Context()
	addrs, res, ok := h.checkDestination(ctx, w, p, host, port)
	if !ok {
		return res, false
	}
	out := h.outbound(r, host, port)
	attempts := 1
	if retryable(r) {
		attempts = MaxAttempts
	}
	req := dispatch.Request{Host: host, Port: port, Client: c.Name, Header: r.Header, UserSession: c.Session}
	var lastErr error
	for try := 0; ; try++ {
		a, err := h.d.Acquire(ctx, &req)
		if err != nil {
			switch {
			case lastErr != nil:
				return h.upstreamFailed(w, "upstream-", lastErr), false
			case goDirect(a, err):
				if a.Rule.StickyHeader != "" {
					delete(out.Header, a.Rule.StickyHeader)
				}
				return h.forwardDirect(w, r, out, addrs)
			}
			return h.refuse(w, err), false
		}
		if a.Rule.StickyHeader != "" {
			delete(out.Header, a.Rule.StickyHeader)
		}
		start := time.Now()
		resp, err := h.f.RoundTrip(out, a.Target)
		if err != nil {
			lastErr = err
			switch h.failedAttempt(ctx, a, &req, err, try, min(attempts, a.Rule.MaxAttempts)) {
			case attemptCanceled:
				return resultCanceled, false
			case attemptRetry:
				continue
			}
			return h.upstreamFailed(w, "upstream-", err), false
		}
		h.m.upstreamConnect.Observe(time.Since(start).Seconds())
		if !h.commit(w, a, resp.Body) {
			return resultUpstreamError, false
		}
		res, outcome, abort := h.stream(w, r, resp)
		h.settle(a, outcome)
		return res, abort
	}
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
func (h *Handler) commit(w http.ResponseWriter, a dispatch.Allocation, upstream io.Closer) bool {
	err := h.d.Commit(a)
	if err == nil {
		return true
	}
	_ = upstream.Close()
	h.d.Release(a, worker.Outcome{})
	h.log.Error("committing allocation", "err", err)
	writeError(w, http.StatusInternalServerError, "internal")
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
func (h *Handler) forwardDirect(w http.ResponseWriter, r *http.Request, out *http.Request, addrs []netip.AddrPort) (result, bool) {
	h.m.direct.Inc()
	resp, err := h.f.DirectRoundTrip(out, addrs)
	if err != nil {
		if r.Context().Err() != nil {
			return resultCanceled, false
		}
		h.log.Debug("direct request failed", "err", err)
		return h.upstreamFailed(w, "direct-", err), false
	}
	res, _, abort := h.stream(w, r, resp)
	return res, abort
}

// outbound is the request sent to the upstream proxy: absolute-form to the
// normalised destination, hop-by-hop, proxy and gateway headers removed.
func (h *Handler) outbound(r *http.Request, host string, port uint16) *http.Request {
	u := *r.URL
	u.Host = joinAuthority(host, port)
	if port == 80 {
		u.Host = strings.TrimSuffix(u.Host, ":80")
	}
	out := &http.Request{
		Method:     r.Method,
		URL:        &u,
		Proto:      "HTTP/1.1",
		ProtoMajor: 1,
		ProtoMinor: 1,
		Header:     cleanHeader(r.Header),
		Host:       u.Host,
		Body:       http.NoBody,
	}
	if r.Body != http.NoBody && r.Body != nil {
		out.Body = &countingReader{r: r.Body, n: h.m.bytesUp}
		out.ContentLength = r.ContentLength
	}
	if _, ok := out.Header["User-Agent"]; !ok {
		// Without this net/http would announce itself to the target.
		out.Header["User-Agent"] = []string{""}
	}
	return out.WithContext(r.Context())
}

type countingReader struct {
	r io.ReadCloser
	n prometheus.Counter
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n.Add(float64(n))
	}
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// StreamBufferSize is the copy buffer of one streamed response (pooled).
const StreamBufferSize = 32 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, StreamBufferSize); return &b }}

// stream writes the upstream response to the client. Only an upstream
// read error is the proxy's failure; a client that stops reading is not.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, resp *http.Response) (result, worker.Outcome, bool) {
	defer resp.Body.Close()
	copyEndToEnd(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	if r.Method == http.MethodHead {
		return resultOK, worker.Outcome{Success: true}, false
	}
	var flusher http.Flusher
	if resp.ContentLength < 0 {
		// Unknown length is how streams (SSE, long polls) arrive: pass
		// each chunk on as it comes.
		flusher, _ = w.(http.Flusher)
	}
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	var n int64
	defer func() { h.m.bytesDown.Add(float64(n)) }()
	for {
		nr, rerr := resp.Body.Read(buf)
		if nr > 0 {
			nw, werr := w.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return resultCanceled, worker.Outcome{Success: true}, false
			}
			if flusher != nil {
				flusher.Flush()
			}
		}
		if rerr == io.EOF {
			return resultOK, worker.Outcome{Success: true}, false
		}
		if rerr != nil {
			if r.Context().Err() != nil {
				return resultCanceled, worker.Outcome{}, false
			}
			h.log.Debug("upstream response body failed", "err", rerr)
			return resultUpstreamError, worker.Outcome{Phase: worker.PhaseTunnel}, true
		}
	}
}

// serveConnect opens a tunnel through an upstream proxy.
func (h *Handler) serveConnect(w http.ResponseWriter, r *http.Request, p *Policy, c *Client) result {
	host, port, err := connectTarget(r)
	if err != nil {
		return h.reject(w, http.StatusBadRequest, ReasonBadTarget)
	}
	ctx := r.Context()
	addrs, res, ok := h.checkDestination(ctx, w, p, host, port)
	if !ok {
		return res
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		writeError(w, http.StatusHTTPVersionNotSupported, "connect-unsupported")
		return resultBadRequest
	}
	authority := joinAuthority(host, port)
	req := dispatch.Request{Host: host, Port: port, Client: c.Name, Header: r.Header, UserSession: c.Session}
	var lastErr error
	for try := 0; ; try++ {
		a, err := h.d.Acquire(ctx, &req)
		if err != nil {
			switch {
			case lastErr != nil:
				return h.upstreamFailed(w, "upstream-", lastErr)
			case goDirect(a, err):
				return h.connectDirect(w, hj, ctx, addrs)
			}
			return h.refuse(w, err)
		}
		start := time.Now()
		tun, err := h.f.Connect(ctx, a.Target, authority)
		if err != nil {
			lastErr = err
			switch h.failedAttempt(ctx, a, &req, err, try, min(MaxAttempts, a.Rule.MaxAttempts)) {
			case attemptCanceled:
				return resultCanceled
			case attemptRetry:
				continue
			}
			return h.upstreamFailed(w, "upstream-", err)
		}
		h.m.upstreamConnect.Observe(time.Since(start).Seconds())
		if !h.commit(w, a, tun.Conn) {
			return resultUpstreamError
		}
		return h.tunnel(hj, tun, func(o worker.Outcome) { h.settle(a, o) })
	}
}

// connectDirect opens a tunnel straight to the guard's checked addresses.
func (h *Handler) connectDirect(w http.ResponseWriter, hj http.Hijacker, ctx context.Context, addrs []netip.AddrPort) result {
	h.m.direct.Inc()
	conn, err := h.f.DirectConnect(ctx, addrs)
	if err != nil {
		if ctx.Err() != nil {
			return resultCanceled
		}
		return h.upstreamFailed(w, "direct-", err)
	}
	return h.tunnel(hj, &transport.Tunnel{Conn: conn}, func(worker.Outcome) {})
}

var established = []byte("HTTP/1.1 200 Connection established\r\n\r\n")

// tunnel answers 200 and carries bytes both ways until both sides closed;
// release is called exactly once with the outcome. From the 200 on nothing
// is retried (seed 000 §7.2).
func (h *Handler) tunnel(hj http.Hijacker, tun *transport.Tunnel, release func(worker.Outcome)) result {
	upstream := tun.Conn
	defer upstream.Close()
	client, rw, err := hj.Hijack()
	if err != nil {
		release(worker.Outcome{})
		return resultCanceled
	}
	defer client.Close()
	raw := rawConn(client)
	// The server's header and idle deadlines do not apply to a tunnel.
	_ = raw.SetDeadline(time.Time{})
	if _, err := raw.Write(established); err != nil {
		release(worker.Outcome{Success: true})
		return resultCanceled
	}
	if len(tun.Buffered) > 0 {
		if _, err := raw.Write(tun.Buffered); err != nil {
			release(worker.Outcome{Success: true})
			return resultCanceled
		}
		h.m.bytesDown.Add(float64(len(tun.Buffered)))
	}
	if n := rw.Reader.Buffered(); n > 0 {
		// Bytes the client pipelined behind its CONNECT (a TLS hello).
		b, _ := rw.Reader.Peek(n)
		if _, err := upstream.Write(b); err != nil {
			release(worker.Outcome{Phase: worker.PhaseTunnel})
			return resultUpstreamError
		}
		h.m.bytesUp.Add(float64(n))
	}
	t := &tunnelConns{client: raw, upstream: upstream}
	h.tunnels.add(t)
	h.m.tunnelsActive.Inc()
	up, down := pipe(raw, upstream)
	h.m.tunnelsActive.Dec()
	h.tunnels.remove(t)
	h.m.bytesUp.Add(float64(up))
	h.m.bytesDown.Add(float64(down))
	release(worker.Outcome{Success: true})
	return resultOK
}

// pipe copies both ways between two raw connections (normally
// *net.TCPConn, which relay splices holding no pipe while idle). A clean
// end of one direction is passed on as a half-close; an error in either
// tears both down.
func pipe(client, upstream io.ReadWriteCloser) (up, down int64) {
	up, down, _ = relay.Copy(client, upstream)
	return up, down
}

type tunnelConns struct {
	client, upstream io.Closer
	shard            int
}

// tunnelSet tracks open tunnels so shutdown can close them: hijacked
// connections are invisible to http.Server. It is sharded round-robin so
// that CONNECT setup does not serialise on one lock.
type tunnelSet struct {
	next   atomic.Uint32
	count  atomic.Int64
	shards [16]struct {
		mu sync.Mutex
		m  map[*tunnelConns]struct{}
	}
}

func (s *tunnelSet) init() {
	for i := range s.shards {
		s.shards[i].m = make(map[*tunnelConns]struct{})
	}
}

func (s *tunnelSet) add(t *tunnelConns) {
	t.shard = int(s.next.Add(1) % uint32(len(s.shards)))
	sh := &s.shards[t.shard]
	sh.mu.Lock()
	sh.m[t] = struct{}{}
	sh.mu.Unlock()
	s.count.Add(1)
}

func (s *tunnelSet) remove(t *tunnelConns) {
	sh := &s.shards[t.shard]
	sh.mu.Lock()
	delete(sh.m, t)
	sh.mu.Unlock()
	s.count.Add(-1)
}

// closeAll closes both ends of every open tunnel; their goroutines then
// finish and release their allocations.
func (s *tunnelSet) closeAll() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for t := range sh.m {
			_ = t.client.Close()
			_ = t.upstream.Close()
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// ActiveTunnels is the number of open tunnels.
func (h *Handler) ActiveTunnels() int64 { return h.tunnels.count.Load() }

// CloseTunnels force-closes every open tunnel (end of a drain) and returns
// how many it closed.
func (h *Handler) CloseTunnels() int { return h.tunnels.closeAll() }

// drainPoll is how often WaitTunnels looks again; http.Server.Shutdown
// polls its connections the same way.
const drainPoll = 20 * time.Millisecond

// WaitTunnels returns nil once no tunnel is open, or ctx's error.
func (h *Handler) WaitTunnels(ctx context.Context) error {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for h.tunnels.count.Load() > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

var (
	_ http.Handler   = (*Handler)(nil)
	_ ListenerEvents = (*Handler)(nil)
)
