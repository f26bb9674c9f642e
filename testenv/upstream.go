package testenv

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// UpstreamHeader carries an upstream proxy's ID: added to requests it
// forwards and to responses it returns, so tests can tell which proxy served.
const UpstreamHeader = "X-Upstream-Proxy"

// UpstreamFault is a failure an UpstreamProxy can be told to simulate.
type UpstreamFault int32

const (
	// FaultNone behaves correctly.
	FaultNone UpstreamFault = iota
	// FaultRefuse closes the listener and all connections, so connecting is
	// refused; clearing the fault listens again on the same port.
	FaultRefuse
	// FaultHandshake407 answers every request and CONNECT with 407.
	FaultHandshake407
	// FaultHandshake502 answers every request and CONNECT with 502.
	FaultHandshake502
	// FaultSlow waits SetSlowDelay (default 5s) before handling anything.
	FaultSlow
	// FaultDropMidResponse sends headers and half the body, then closes the
	// connection; for CONNECT it closes right after the 200.
	FaultDropMidResponse
)

var upstreamFaultNames = [...]string{"none", "refuse", "handshake-407", "handshake-502", "slow", "drop-mid-response"}

func (f UpstreamFault) String() string {
	if f >= 0 && int(f) < len(upstreamFaultNames) {
		return upstreamFaultNames[f]
	}
	return "UpstreamFault(" + strconv.Itoa(int(f)) + ")"
}

// UpstreamConfig configures NewUpstreamProxy.
type UpstreamConfig struct {
	ID                 string // reported in UpstreamHeader; default "upstream-<port>"
	Addr               string // listen address; default 127.0.0.1:0
	Username, Password string // if either is set, Proxy-Authorization Basic is required
	DialSource         string // loopback IP to dial targets from, so targets can tell proxies apart
}

const (
	upstreamDialTimeout  = 10 * time.Second
	upstreamMaxDropBody  = 64 << 20
	upstreamDefaultDelay = 5 * time.Second
	// The forwarding transport keeps this many idle target connections, so
	// a few hundred concurrent clients on one upstream reuse them instead
	// of dialing per request (the bench's "one upstream directly" reference
	// runs 64 clients on one upstream).
	upstreamMaxIdleConns        = 1024
	upstreamMaxIdleConnsPerHost = 256
)

// UpstreamProxy is a simulated upstream HTTP forward proxy supporting
// absolute-form requests and CONNECT, with injectable faults. It only ever
// dials loopback addresses.
type UpstreamProxy struct {
	cfg       UpstreamConfig
	id        string
	addr      string // fixed at creation so FaultRefuse can re-listen on it
	port      int
	dialer    *net.Dialer
	transport *http.Transport

	fault     atomic.Int32
	slowDelay atomic.Int64
	requests  atomic.Int64
	connects  atomic.Int64
	active    atomic.Int64

	mu       sync.Mutex
	srv      *http.Server // nil while refusing or closed
	serving  chan struct{}
	tunnels  map[net.Conn]struct{}
	closed   bool
	closedCh chan struct{}
	wg       sync.WaitGroup // running tunnels
}

// NewUpstreamProxy starts a proxy on a loopback address.
func NewUpstreamProxy(cfg UpstreamConfig) (*UpstreamProxy, error) {
	if strings.ContainsFunc(cfg.ID, func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return nil, fmt.Errorf("starting upstream: id %q contains control characters", cfg.ID)
	}
	dialer := &net.Dialer{Timeout: upstreamDialTimeout, KeepAlive: 30 * time.Second}
	if cfg.DialSource != "" {
		ip := net.ParseIP(cfg.DialSource)
		if ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("starting upstream: dial source %q is not a loopback IP", cfg.DialSource)
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	ln, err := listenLoopback(cfg.Addr, "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("starting upstream: %w", err)
	}
	p := &UpstreamProxy{
		cfg:      cfg,
		id:       cfg.ID,
		addr:     ln.Addr().String(),
		port:     ln.Addr().(*net.TCPAddr).Port,
		dialer:   dialer,
		tunnels:  make(map[net.Conn]struct{}),
		closedCh: make(chan struct{}),
	}
	if p.id == "" {
		p.id = "upstream-" + strconv.Itoa(p.port)
	}
	p.slowDelay.Store(int64(upstreamDefaultDelay))
	p.transport = &http.Transport{
		Proxy:                 nil, // never chain to an environment proxy
		DialContext:           p.dialTarget,
		MaxIdleConns:          upstreamMaxIdleConns,
		MaxIdleConnsPerHost:   upstreamMaxIdleConnsPerHost,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true, // pass bodies through untouched
	}
	p.mu.Lock()
	p.serve(ln)
	p.mu.Unlock()
	return p, nil
}

// StartUpstreams starts n proxies with IDs "up-1".."up-n" sharing the given
// credentials. Where the OS allows (Linux routes all of 127/8 to lo), proxy i
// dials targets from 127.0.0.(20+i), so a Target that Learn()s them can tell
// which proxy a CONNECT tunnel came through.
func StartUpstreams(n int, username, password string) ([]*UpstreamProxy, error) {
	if n < 1 || n > 200 {
		return nil, fmt.Errorf("starting upstreams: n=%d out of range 1..200", n)
	}
	ups := make([]*UpstreamProxy, 0, n)
	for i := 1; i <= n; i++ {
		cfg := UpstreamConfig{ID: "up-" + strconv.Itoa(i), Username: username, Password: password}
		if src := fmt.Sprintf("127.0.0.%d", 20+i); canBind(src) {
			cfg.DialSource = src
		}
		up, err := NewUpstreamProxy(cfg)
		if err != nil {
			for _, u := range ups {
				_ = u.Close()
			}
			return nil, fmt.Errorf("starting upstream %s: %w", cfg.ID, err)
		}
		ups = append(ups, up)
	}
	return ups, nil
}

func canBind(ip string) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// ID returns the proxy's ID.
func (p *UpstreamProxy) ID() string { return p.id }

// Addr returns host:port.
func (p *UpstreamProxy) Addr() string { return p.addr }

// Host returns the listening IP.
func (p *UpstreamProxy) Host() string {
	host, _, _ := net.SplitHostPort(p.addr)
	return host
}

// Port returns the listening port.
func (p *UpstreamProxy) Port() int { return p.port }

// DialSource returns the IP targets are dialled from ("" for the default).
func (p *UpstreamProxy) DialSource() string { return p.cfg.DialSource }

// Requests returns the number of HTTP requests forwarded to targets.
func (p *UpstreamProxy) Requests() int64 { return p.requests.Load() }

// Connects returns the number of CONNECT tunnels established.
func (p *UpstreamProxy) Connects() int64 { return p.connects.Load() }

// ActiveConns returns the number of open client connections, tunnels included.
func (p *UpstreamProxy) ActiveConns() int64 { return p.active.Load() }

// Fault returns the current fault.
func (p *UpstreamProxy) Fault() UpstreamFault { return UpstreamFault(p.fault.Load()) }

// SetSlowDelay sets the FaultSlow delay.
func (p *UpstreamProxy) SetSlowDelay(d time.Duration) { p.slowDelay.Store(int64(d)) }

// SetFault switches the simulated fault. Entering FaultRefuse closes the
// listener and every connection; leaving it listens again on the same port,
// which is the only way it can fail.
func (p *UpstreamProxy) SetFault(f UpstreamFault) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("setting fault on upstream %s: %w", p.id, errClosed)
	}
	if f == FaultRefuse {
		p.fault.Store(int32(f))
		p.stopServing()
		return nil
	}
	if p.srv == nil {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			return fmt.Errorf("re-listening upstream %s on %s: %w", p.id, p.addr, err)
		}
		p.serve(ln)
	}
	p.fault.Store(int32(f))
	return nil
}

// Close stops the proxy, cutting all connections and tunnels, and waits for
// the tunnels to finish.
func (p *UpstreamProxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.closedCh)
	p.stopServing()
	p.mu.Unlock()
	p.wg.Wait()
	p.transport.CloseIdleConnections()
	return nil
}

// serve starts a fresh http.Server on ln; a server cannot be reused once
// closed, and FaultRefuse closes it. p.mu must be held.
func (p *UpstreamProxy) serve(ln net.Listener) {
	srv := &http.Server{
		Handler:           p,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       60 * time.Second,
		ConnState:         p.connState,
		// Faults make the server log noise (aborted handlers, broken pipes).
		ErrorLog: log.New(io.Discard, "", 0),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	p.srv, p.serving = srv, done
}

// stopServing closes the listener, all HTTP connections and all tunnels.
// p.mu must be held.
func (p *UpstreamProxy) stopServing() {
	if p.srv == nil {
		return
	}
	_ = p.srv.Close()
	<-p.serving
	p.srv = nil
	for c := range p.tunnels {
		_ = c.Close()
	}
}

func (p *UpstreamProxy) connState(_ net.Conn, s http.ConnState) {
	switch s {
	case http.StateNew:
		p.active.Add(1)
	case http.StateClosed:
		p.active.Add(-1)
		// Hijacked connections are counted down when their tunnel ends.
	}
}

func (p *UpstreamProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set(UpstreamHeader, p.id)
	fault := p.Fault()
	switch fault {
	case FaultSlow:
		if !p.sleep(r.Context()) {
			// Returning would send an empty 200; the client must see a cut.
			panic(http.ErrAbortHandler)
		}
	case FaultHandshake407:
		p.askForAuth(w)
		return
	case FaultHandshake502:
		http.Error(w, "upstream fault: bad gateway", http.StatusBadGateway)
		return
	}
	if !p.authorized(r) {
		p.askForAuth(w)
		return
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r, fault)
		return
	}
	p.forward(w, r, fault)
}

// sleep waits the slow delay; false means the client or the proxy went away.
func (p *UpstreamProxy) sleep(ctx context.Context) bool {
	timer := time.NewTimer(time.Duration(p.slowDelay.Load()))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	case <-p.closedCh:
		return false
	}
}

func (p *UpstreamProxy) askForAuth(w http.ResponseWriter) {
	w.Header().Set("Proxy-Authenticate", `Basic realm="upstream"`)
	http.Error(w, "proxy authentication required", http.StatusProxyAuthRequired)
}

func (p *UpstreamProxy) authorized(r *http.Request) bool {
	if p.cfg.Username == "" && p.cfg.Password == "" {
		return true
	}
	scheme, encoded, ok := strings.Cut(r.Header.Get("Proxy-Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(strings.TrimSpace(encoded))
	if err != nil {
		return false
	}
	want := p.cfg.Username + ":" + p.cfg.Password
	return subtle.ConstantTimeCompare(got, []byte(want)) == 1
}

// hopHeaders are meaningful for a single connection only (RFC 9110 7.6.1)
// and must not be forwarded.
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

func (p *UpstreamProxy) forward(w http.ResponseWriter, r *http.Request, fault UpstreamFault) {
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		http.Error(w, "upstream: absolute-form http:// request required", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	if r.ContentLength == 0 {
		out.Body = nil // lets the transport retry and reuse connections freely
	}
	removeHopHeaders(out.Header)
	out.Header.Set(UpstreamHeader, p.id)
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		http.Error(w, "upstream: forwarding: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	p.requests.Add(1)

	removeHopHeaders(resp.Header)
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.Header().Set(UpstreamHeader, p.id)
	if fault == FaultDropMidResponse {
		dropMidResponse(w, resp)
	}
	w.WriteHeader(resp.StatusCode)
	if _, err := io.Copy(w, resp.Body); err != nil {
		// Make the client see the truncation instead of a short, "complete" body.
		panic(http.ErrAbortHandler)
	}
}

// dropMidResponse announces the full length, sends half of it and then
// aborts the connection, so the client sees an unexpected EOF. It never
// returns.
func dropMidResponse(w http.ResponseWriter, resp *http.Response) {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, upstreamMaxDropBody))
	announced := max(len(body), 1) // an empty body would otherwise look complete
	w.Header().Set("Content-Length", strconv.Itoa(announced))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(body[:len(body)/2])
	_ = http.NewResponseController(w).Flush()
	panic(http.ErrAbortHandler)
}

func (p *UpstreamProxy) connect(w http.ResponseWriter, r *http.Request, fault UpstreamFault) {
	ctx, cancel := context.WithTimeout(r.Context(), upstreamDialTimeout)
	target, err := p.dialTarget(ctx, "tcp", r.Host)
	cancel()
	if err != nil {
		http.Error(w, "upstream: dialing target: "+err.Error(), http.StatusBadGateway)
		return
	}
	client, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		_ = target.Close()
		http.Error(w, "upstream: hijacking: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer p.active.Add(-1) // hijacked connections left the ConnState accounting
	p.connects.Add(1)
	_ = client.SetDeadline(time.Time{}) // the server's header deadline must not cut the tunnel

	_, err = io.WriteString(client, "HTTP/1.1 200 Connection established\r\n"+UpstreamHeader+": "+p.id+"\r\n\r\n")
	if err != nil || fault == FaultDropMidResponse {
		_ = client.Close()
		_ = target.Close()
		return
	}
	// Bytes the client sent right after its CONNECT may already be buffered.
	if n := brw.Reader.Buffered(); n > 0 {
		early, _ := brw.Reader.Peek(n)
		if _, err := target.Write(early); err != nil {
			_ = client.Close()
			_ = target.Close()
			return
		}
	}
	if !p.trackTunnel(client, target) {
		return
	}
	defer p.untrackTunnel(client, target)
	pipe(client, target)
}

// trackTunnel registers a tunnel so FaultRefuse and Close can cut it. It
// closes both ends and returns false if the proxy has already stopped.
func (p *UpstreamProxy) trackTunnel(a, b net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.srv == nil {
		_ = a.Close()
		_ = b.Close()
		return false
	}
	p.tunnels[a], p.tunnels[b] = struct{}{}, struct{}{}
	p.wg.Add(1)
	return true
}

func (p *UpstreamProxy) untrackTunnel(a, b net.Conn) {
	p.mu.Lock()
	delete(p.tunnels, a)
	delete(p.tunnels, b)
	p.mu.Unlock()
	p.wg.Done()
}

// pipe copies both ways until both directions are done. A clean EOF on one
// side is passed on as a half-close so request/response protocols that rely
// on it keep working; an error cuts the whole tunnel.
func pipe(a, b net.Conn) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		copyHalf(b, a)
	}()
	copyHalf(a, b)
	<-done
	_ = a.Close()
	_ = b.Close()
}

// tunnelBufs are the copy buffers of tunnels, held only while a direction
// copies. A plain read and write through a large buffer costs less CPU on
// loopback than the splice io.Copy would pick, and a benchmark's
// simulations should take as little of the machine as they can.
var tunnelBufs = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func copyHalf(dst, src net.Conn) {
	b := tunnelBufs.Get().(*[]byte)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *b)
	tunnelBufs.Put(b)
	if err != nil {
		_ = dst.Close()
		_ = src.Close()
		return
	}
	if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = dst.Close()
}

// dialTarget dials addr from the configured source, refusing anything that
// is not a loopback IP (or "localhost") so no test can leak onto the network.
func (p *UpstreamProxy) dialTarget(ctx context.Context, network, addr string) (net.Conn, error) {
	checked, err := loopbackHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("refusing to dial: %w", err)
	}
	conn, err := p.dialer.DialContext(ctx, network, checked)
	if err != nil {
		return nil, fmt.Errorf("dialing %s: %w", checked, err)
	}
	return conn, nil
}

// errClosed reports use of a closed server.
var errClosed = errors.New("closed")
