package ingress

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
	"github.com/proxypool/proxypool/engine/gateway/transport"
)

// ServerConfig bounds the client side of one listener.
type ServerConfig struct {
	// MaxHeaderBytes bounds a request head, request line included (431).
	MaxHeaderBytes int
	// ReadHeaderTimeout bounds reading one request head, from its first
	// byte on a kept-alive connection, from the accept on a new one.
	ReadHeaderTimeout time.Duration
	// IdleTimeout bounds the wait for the next request on a kept-alive
	// connection.
	IdleTimeout time.Duration
}

func (c *ServerConfig) defaults() {
	if c.MaxHeaderBytes <= 0 {
		c.MaxHeaderBytes = config.DefaultMaxHeaderBytes
	}
	if c.ReadHeaderTimeout <= 0 {
		c.ReadHeaderTimeout = config.DefaultReadHeaderTimeout
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = config.DefaultIdleTimeout
	}
}

// Server serves the handler on one listener: one goroutine per client
// connection, reading request heads in place and answering on a pooled
// writer, without net/http.
type Server struct {
	h      *Handler
	ln     net.Listener
	cfg    ServerConfig
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc

	draining   atomic.Bool
	acceptDone chan struct{}
	conns      connSet
}

// NewServer returns a server of h on ln (normally a *LimitListener).
func NewServer(h *Handler, ln net.Listener, cfg ServerConfig) *Server {
	cfg.defaults()
	s := &Server{h: h, ln: ln, cfg: cfg, log: h.log, acceptDone: make(chan struct{})}
	// Requests see this context: it ends when a drain gives up on them.
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s
}

// Serve accepts connections until Shutdown; it returns nil then, or the
// listener's error.
func (s *Server) Serve() error {
	defer close(s.acceptDone)
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if s.draining.Load() || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !temporary(err) {
				return err
			}
			// Out of descriptors or buffers: back off as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed; retrying", "err", err, "backoff", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		c := newConn(s, nc)
		s.conns.add(c)
		go c.serve()
	}
}

func temporary(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// drainPoll is how often Shutdown looks again, as http.Server does.
const drainPoll = 20 * time.Millisecond

// Shutdown stops accepting, closes idle connections and waits until every
// request and tunnel has finished (a connection closes after the response
// in progress), or until ctx ends: then it returns ctx's error and leaves
// the rest to Close.
func (s *Server) Shutdown(ctx context.Context) error {
	s.draining.Store(true)
	_ = s.ln.Close()
	<-s.acceptDone
	t := time.NewTicker(drainPoll)
	defer t.Stop()
	for {
		s.conns.each(func(c *conn) {
			if c.state.CompareAndSwap(stateIdle, stateClosed) {
				_ = c.nc.Close()
			}
		})
		if s.conns.count.Load() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close ends every connection now, requests and tunnels in progress
// included, and returns how many there were.
func (s *Server) Close() int {
	s.draining.Store(true)
	_ = s.ln.Close()
	s.cancel()
	n := 0
	s.conns.each(func(c *conn) {
		c.state.Store(stateClosed)
		_ = c.nc.Close()
		c.resp.Abort()
		n++
	})
	return n
}

// Connection states, for the drain.
const (
	stateActive uint32 = iota
	stateIdle          // waiting for the next request: a drain closes it
	stateClosed
)

// conn is one client connection and what its requests reuse.
type conn struct {
	srv  *Server
	h    *Handler
	nc   net.Conn // as accepted: its Close frees the listener's slots
	raw  net.Conn // what is read and written (the TCP connection)
	peer netip.Addr

	br     h1.Reader
	bw     *bufio.Writer
	req    h1.Request
	p      *Policy
	method string
	body   h1.Body
	out    []byte // outbound header block
	auth   []byte // outbound authority
	treq   transport.Request
	resp   transport.Response
	dreq   dispatch.Request
	cont   func() error // sends 100 Continue (bound once)
	stop   func()       // stops a body read for the transport (bound once)
	served int
	linger bool // close with lingerClose
	state  atomic.Uint32

	// Forwarded requests run under ctx, which ends with the server's or
	// when the client is found gone (watch.go); made on the first one.
	ctx    context.Context
	cancel context.CancelFunc
	watch  watcher

	lprev, lnext *conn
	shard        int
}

var writerPool = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, h1.BufferSize) }}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{srv: s, h: s.h, nc: nc, raw: rawConn(nc)}
	if ta, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		c.peer = ta.AddrPort().Addr()
	}
	return c
}

func (c *conn) serve() {
	defer c.finish()
	c.br.Reset(c.raw)
	c.bw = writerPool.Get().(*bufio.Writer)
	c.bw.Reset(c.raw)
	for c.next() {
		if !c.h.serve(c) || c.srv.draining.Load() {
			return
		}
	}
}

// finish closes the connection and gives its buffers back.
func (c *conn) finish() {
	c.state.Store(stateClosed)
	if c.cancel != nil {
		c.cancel()
	}
	c.releaseBuffers()
	if c.linger {
		c.lingerClose()
	}
	_ = c.nc.Close()
	c.srv.conns.remove(c)
}

// Bounds of a lingering close.
const (
	lingerTimeout = 500 * time.Millisecond
	lingerBytes   = 256 << 10
)

// lingerClose ends a connection closed on the client while it may still
// be sending (a refused head, an unread body): closing with unread input
// would reset the connection and could destroy the answer before the
// client read it. So: send FIN, then drain what the client still sends
// until it closes too, at most lingerBytes or lingerTimeout (net/http
// sleeps half a second instead).
func (c *conn) lingerClose() {
	tc, ok := c.raw.(*net.TCPConn)
	if !ok || tc.CloseWrite() != nil {
		return
	}
	_ = tc.SetReadDeadline(time.Now().Add(lingerTimeout))
	var buf [512]byte
	for n := 0; n < lingerBytes; {
		k, err := tc.Read(buf[:])
		n += k
		if err != nil {
			return
		}
	}
}

func (c *conn) releaseBuffers() {
	c.br.Release()
	if c.bw != nil {
		c.bw.Reset(nil)
		writerPool.Put(c.bw)
		c.bw = nil
	}
}

// next reads the next request head; false ends the connection (after
// answering a malformed head).
func (c *conn) next() bool {
	if c.served > 0 && c.br.Buffered() == 0 && !c.idle() {
		return false
	}
	c.served++
	if c.served == 1 || !c.br.HeadBuffered() {
		// (A head that arrived whole needs no deadline: it is not read
		// from the connection.)
		_ = c.raw.SetReadDeadline(time.Now().Add(c.srv.cfg.ReadHeaderTimeout))
	}
	head, err := c.br.ReadHead(c.srv.cfg.MaxHeaderBytes, true)
	if err != nil {
		if errors.Is(err, h1.ErrHeadTooLarge) {
			c.h.refuseHead(c, h1.ErrTooLarge)
		}
		return false // the client left or timed out: close quietly
	}
	c.p = c.h.policy.Load()
	if err := h1.ParseRequest(head, &c.req, c.p.MaxHeaderCount); err != nil {
		var he *h1.Error
		if errors.As(err, &he) {
			c.h.refuseHead(c, he)
		}
		return false
	}
	c.method = methodString(c.req.Method)
	switch {
	case c.method == "CONNECT":
		c.body.ResetNone() // what follows is the tunnel's
	case c.req.Chunked:
		c.body.ResetChunked(&c.br, false)
	default:
		c.body.ResetLength(&c.br, c.req.ContentLength)
	}
	if !c.body.Done() {
		_ = c.raw.SetReadDeadline(time.Time{})
	}
	return true
}

// idle waits for the first byte of the next request under the idle
// timeout, as a connection a drain may close.
func (c *conn) idle() bool {
	c.state.Store(stateIdle)
	if c.srv.draining.Load() {
		return false
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(c.srv.cfg.IdleTimeout))
	err := c.br.Fill()
	if !c.state.CompareAndSwap(stateIdle, stateActive) {
		return false // closed by a drain
	}
	return err == nil
}

// keepAlive reports whether the connection can carry another request
// once the current response is written: the client allows it, its body
// (if any) was read to the end, and no drain is under way.
func (c *conn) keepAlive() bool {
	return c.req.KeepAlive && c.body.Done() && !c.srv.draining.Load()
}

// context returns the context of the connection's forwarded requests.
func (c *conn) context() context.Context {
	if c.ctx == nil {
		c.ctx, c.cancel = context.WithCancel(c.srv.ctx)
	}
	return c.ctx
}

// sendContinue answers a client waiting for 100 Continue.
func (c *conn) sendContinue() error {
	_, _ = c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
	return c.bw.Flush()
}

// stopBody wakes a read of the request body blocked on the client. The
// transport calls it, from another goroutine than the one reading the
// body, when the upstream answered or failed before the body was sent
// whole; the rest of the body stays unread, so the connection closes
// after the response (keepAlive).
func (c *conn) stopBody() {
	_ = c.raw.SetReadDeadline(time.Unix(1, 0))
}

// methodString returns the method without allocating for the usual ones.
func methodString(m []byte) string {
	switch string(m) {
	case "GET":
		return "GET"
	case "HEAD":
		return "HEAD"
	case "POST":
		return "POST"
	case "PUT":
		return "PUT"
	case "DELETE":
		return "DELETE"
	case "OPTIONS":
		return "OPTIONS"
	case "PATCH":
		return "PATCH"
	case "CONNECT":
		return "CONNECT"
	case "TRACE":
		return "TRACE"
	}
	return string(m)
}

const connShards = 16

// connSet tracks open connections for the drain, in sharded intrusive
// lists: adding and removing one costs a shard lock, no allocation.
type connSet struct {
	next   atomic.Uint32
	count  atomic.Int64
	shards [connShards]struct {
		mu   sync.Mutex
		head *conn
		_    [48]byte
	}
}

func (s *connSet) add(c *conn) {
	c.shard = int(s.next.Add(1) % connShards)
	sh := &s.shards[c.shard]
	sh.mu.Lock()
	c.lnext = sh.head
	if sh.head != nil {
		sh.head.lprev = c
	}
	sh.head = c
	sh.mu.Unlock()
	s.count.Add(1)
}

func (s *connSet) remove(c *conn) {
	sh := &s.shards[c.shard]
	sh.mu.Lock()
	if c.lprev != nil {
		c.lprev.lnext = c.lnext
	} else {
		sh.head = c.lnext
	}
	if c.lnext != nil {
		c.lnext.lprev = c.lprev
	}
	c.lprev, c.lnext = nil, nil
	sh.mu.Unlock()
	s.count.Add(-1)
}

func (s *connSet) each(f func(*conn)) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for c := sh.head; c != nil; c = c.lnext {
			f(c)
		}
		sh.mu.Unlock()
	}
}
