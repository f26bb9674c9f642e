package ingress

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// LimitListener caps the connections open at once, in total and per client
// address. Above a cap it refuses fast — a short canned response and close
// — instead of letting connections queue in the accept backlog or in memory
// (seed 000 §17.2). An accepted connection gives its slots back on its
// first Close.
type LimitListener struct {
	net.Listener
	max       atomic.Int64
	perClient atomic.Int64
	open      atomic.Int64
	exempt    atomic.Pointer[[]netip.Prefix]
	events    ListenerEvents

	mu      sync.Mutex
	clients map[netip.Addr]int64
}

// Canned refusals, best effort.
const (
	refusalOverload = "HTTP/1.1 503 Service Unavailable\r\n" + ReasonHeader + ": " + ReasonOverload + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
	refusalPerIP    = "HTTP/1.1 429 Too Many Requests\r\n" + ReasonHeader + ": " + ReasonTooManyConns + "\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)

// refuseWriteTimeout bounds the courtesy write to a refused connection.
const refuseWriteTimeout = 100 * time.Millisecond

// ListenerEvents observes a LimitListener (metrics); *Handler implements
// it.
type ListenerEvents interface {
	// Accepted: a connection was admitted; Closed: an admitted one ended.
	Accepted()
	Closed()
	// Refused: a connection was refused with reason ReasonOverload or
	// ReasonTooManyConns.
	Refused(reason string)
}

// NewLimitListener wraps ln; events may be nil.
func NewLimitListener(ln net.Listener, maxConns int, events ListenerEvents) *LimitListener {
	l := &LimitListener{Listener: ln, events: events, clients: make(map[netip.Addr]int64)}
	l.SetMax(maxConns)
	return l
}

// SetMax changes the cap; open connections above a lowered cap stay.
func (l *LimitListener) SetMax(n int) { l.max.Store(int64(max(n, 1))) }

// SetPerClient caps the connections of one client address (0: no cap).
// Peers inside exempt (the trusted proxies, which carry many clients) are
// only subject to the total cap.
func (l *LimitListener) SetPerClient(n int, exempt []netip.Prefix) {
	l.perClient.Store(int64(max(n, 0)))
	cp := append([]netip.Prefix(nil), exempt...)
	l.exempt.Store(&cp)
}

// Open is the number of connections currently held.
func (l *LimitListener) Open() int64 { return l.open.Load() }

// Accept returns the next connection under the caps.
func (l *LimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max.Load() {
			l.open.Add(-1)
			l.refuse(c, refusalOverload, ReasonOverload)
			continue
		}
		ip, counted := l.takeClient(c)
		if !counted && ip.IsValid() {
			l.open.Add(-1)
			l.refuse(c, refusalPerIP, ReasonTooManyConns)
			continue
		}
		lc := &limitConn{Conn: c, l: l}
		if counted {
			lc.ip = ip
		}
		if l.events != nil {
			l.events.Accepted()
		}
		return lc, nil
	}
}

func (l *LimitListener) refuse(c net.Conn, msg, reason string) {
	// Counted before the client can see the answer.
	if l.events != nil {
		l.events.Refused(reason)
	}
	_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
	_, _ = c.Write([]byte(msg))
	_ = c.Close()
}

// takeClient counts c against its address's cap. It returns the address
// and true when counted; the address and false when over the cap; an
// invalid address and false when no per-client cap applies.
func (l *LimitListener) takeClient(c net.Conn) (netip.Addr, bool) {
	limit := l.perClient.Load()
	if limit <= 0 {
		return netip.Addr{}, false
	}
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip := ta.AddrPort().Addr().Unmap()
	if ex := l.exempt.Load(); ex != nil {
		for _, p := range *ex {
			if p.Contains(ip) {
				return netip.Addr{}, false
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	// The map holds only addresses with open connections, so it is
	// bounded by the total cap.
	if l.clients[ip] >= limit {
		return ip, false
	}
	l.clients[ip]++
	return ip, true
}

func (l *LimitListener) dropClient(ip netip.Addr) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.clients[ip] - 1; n > 0 {
		l.clients[ip] = n
	} else {
		delete(l.clients, ip)
	}
}

// limitConn gives its slots back on the first Close.
type limitConn struct {
	net.Conn
	l    *LimitListener
	ip   netip.Addr // valid when counted per client
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Add(-1)
		if c.ip.IsValid() {
			c.l.dropClient(c.ip)
		}
		if c.l.events != nil {
			c.l.events.Closed()
		}
	})
	return err
}

// NetConn exposes the wrapped connection so that a tunnel copies between
// raw TCP connections (splice) rather than through this wrapper.
func (c *limitConn) NetConn() net.Conn { return c.Conn }

// rawConn unwraps our own listener wrapper, and only it: a TLS connection
// also has NetConn, and unwrapping that would bypass the encryption.
func rawConn(c net.Conn) net.Conn {
	if lc, ok := c.(*limitConn); ok {
		return lc.Conn
	}
	return c
}

var _ net.Listener = (*LimitListener)(nil)
