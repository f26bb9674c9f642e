package transport

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// Tunnel is an established CONNECT tunnel through an upstream proxy.
type Tunnel struct {
	// Conn is the raw connection to the upstream proxy (a *net.TCPConn),
	// so that copying can splice.
	Conn net.Conn
	// Buffered holds bytes the upstream sent right after its 2xx that were
	// read with the reply; they must reach the client before Conn's data.
	Buffered []byte
}

// handshakeState is what reading a CONNECT reply needs, pooled.
type handshakeState struct {
	br   h1.Reader
	resp h1.Response
}

var handshakePool = sync.Pool{New: func() any { return new(handshakeState) }}

// Connect dials target and asks it to CONNECT to authority (host:port).
func (t *Transport) Connect(ctx context.Context, target *snapshot.Target, authority string) (*Tunnel, error) {
	if target.Scheme != proxy.SchemeHTTP {
		return nil, &Error{Phase: worker.PhaseDial, Err: ErrUnsupportedScheme}
	}
	conn, err := t.dial(ctx, target.Addr)
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

	wb := writeBufPool.Get().(*[]byte)
	defer writeBufPool.Put(wb)
	buf := append((*wb)[:0], "CONNECT "...)
	buf = append(buf, authority...)
	buf = append(buf, " HTTP/1.1\r\nHost: "...)
	buf = append(buf, authority...)
	if target.ProxyAuthorization != "" {
		buf = append(buf, "\r\nProxy-Authorization: "...)
		buf = append(buf, target.ProxyAuthorization...)
	}
	buf = append(buf, "\r\n\r\n"...)
	*wb = buf
	if _, err := conn.Write(buf); err != nil {
		return nil, fmt.Errorf("writing CONNECT: %w", err)
	}

	hs := handshakePool.Get().(*handshakeState)
	defer handshakePool.Put(hs)
	br, resp := &hs.br, &hs.resp
	br.Reset(conn)
	defer br.Release()
	// The limit bounds what a hostile proxy can make us buffer for its
	// reply; the tunnel itself is read from conn directly afterwards.
	for i := 0; ; i++ {
		head, err := br.ReadHead(int(t.opts.MaxResponseHeaderBytes), false)
		if err != nil {
			return nil, fmt.Errorf("reading CONNECT reply: %w", err)
		}
		if err := h1.ParseResponse(head, resp, MaxResponseFields); err != nil {
			return nil, fmt.Errorf("reading CONNECT reply: %w", err)
		}
		if resp.Status >= 200 || resp.Status == 101 || i == max1xx {
			break
		}
	}
	if resp.Status < 200 || resp.Status > 299 {
		return nil, &StatusError{Code: resp.Status}
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
		tun.Buffered = append([]byte(nil), br.Bytes()...)
	}
	return tun, nil
}
