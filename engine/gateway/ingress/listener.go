package ingress

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// LimitListener caps the connections open at once. Above the cap it
// refuses fast — a short 503 and close — instead of letting connections
// queue in the accept backlog or in memory (seed 000 §17.2).
type LimitListener struct {
	net.Listener
	max      atomic.Int64
	open     atomic.Int64
	onRefuse func()
}

// refusal is written to a connection refused for overload; best effort.
const refusal = "HTTP/1.1 503 Service Unavailable\r\nX-Proxypool-Reason: overload\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"

// refuseWriteTimeout bounds the courtesy write to a refused connection.
const refuseWriteTimeout = 100 * time.Millisecond

// NewLimitListener wraps ln; onRefuse (may be nil) is called per refusal.
func NewLimitListener(ln net.Listener, maxConns int, onRefuse func()) *LimitListener {
	l := &LimitListener{Listener: ln, onRefuse: onRefuse}
	l.SetMax(maxConns)
	return l
}

// SetMax changes the cap; open connections above a lowered cap stay.
func (l *LimitListener) SetMax(n int) { l.max.Store(int64(max(n, 1))) }

// Open is the number of connections currently held.
func (l *LimitListener) Open() int64 { return l.open.Load() }

// Accept returns the next connection under the cap.
func (l *LimitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max.Load() {
			l.open.Add(-1)
			_ = c.SetWriteDeadline(time.Now().Add(refuseWriteTimeout))
			_, _ = c.Write([]byte(refusal))
			_ = c.Close()
			if l.onRefuse != nil {
				l.onRefuse()
			}
			continue
		}
		return &limitConn{Conn: c, l: l}, nil
	}
}

// limitConn gives its slot back on the first Close.
type limitConn struct {
	net.Conn
	l    *LimitListener
	once sync.Once
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.open.Add(-1) })
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
