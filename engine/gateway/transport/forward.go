package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// Request is one plain-HTTP request to forward. Its byte slices are only
// read during RoundTrip.
type Request struct {
	Method string
	// Authority is the target's normalised host[:port] (port 80 left out):
	// the absolute-form request line through a proxy.
	Authority []byte
	// URI is the origin-form path and query, never empty.
	URI []byte
	// Header holds the field lines to send, each ending in CRLF: Host and
	// the body's framing (Content-Length or Transfer-Encoding: chunked)
	// included, Proxy-Authorization not (the target proxy's is added).
	Header []byte
	// Body is the request body in its wire framing (chunked bodies
	// verbatim), nil when there is none. It is read by a goroutine of the
	// exchange, which has ended when RoundTrip returns.
	Body io.Reader
	// Idempotent requests without a body are sent again, on a fresh
	// connection, when a kept-alive one turns out to have been closed by
	// the upstream before answering.
	Idempotent bool
	// Decode asks for a chunked response body to be decoded (a client
	// that cannot take chunked framing).
	Decode bool
	// Continue, when set, is called before the body is sent: once the
	// upstream answered 100 Continue or stayed silent for
	// ExpectContinueTimeout. The client side sends its own 100 then.
	Continue func() error
	// StopBody, when set, makes a Body read that is waiting on the client
	// return an error; it is called from another goroutine when the
	// upstream answered, or failed, before the body was sent whole.
	// Without it the exchange ends only once a pending Body read returns.
	StopBody func()
}

// Response is the upstream's answer; its head fields point into the
// connection's buffer and are valid until the first Body read. Close must
// be called once the caller is done with it.
type Response struct {
	h1.Response
	Body h1.Body
	// BodyUnsent: the upstream answered before the request body was sent
	// whole — before Continue was called, or while the body was going out,
	// which then stopped. What the client had not sent yet is unread, and
	// the upstream connection is not kept.
	BodyUnsent bool

	t    *Transport
	pc   *pconn
	live atomic.Pointer[pconn] // for Abort from another goroutine
	keep bool
}

// HasBody reports whether a body follows the response head.
func (r *Response) HasBody() bool { return !r.Body.Done() }

// Close ends the exchange: the connection is kept for another request
// when the response was read to its end and both sides allow it, and
// closed otherwise.
func (r *Response) Close() {
	pc := r.pc
	if pc == nil {
		return
	}
	r.pc = nil
	r.live.Store(nil)
	if r.keep && r.Body.Done() && pc.br.Buffered() == 0 {
		r.t.put(pc)
		return
	}
	pc.close()
}

// Abort closes the upstream connection of an exchange in progress; it may
// be called from another goroutine (forced shutdown).
func (r *Response) Abort() {
	if pc := r.live.Load(); pc != nil {
		_ = pc.conn.Close()
	}
}

var writeBufPool = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}

// copyBufPool holds the buffers that stream request bodies upstream.
var copyBufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// RoundTrip sends req (hop-by-hop headers already removed) through target
// and reads the response head into resp. It returns nil only when a final
// response arrived and the upstream proxy did not refuse us (407); every
// other error is an *Error with its phase, or a *BodyError.
func (t *Transport) RoundTrip(ctx context.Context, req *Request, target *snapshot.Target, resp *Response) error {
	if target.Scheme != proxy.SchemeHTTP {
		return &Error{Phase: worker.PhaseDial, Err: ErrUnsupportedScheme}
	}
	k := poolKey{addr: target.Addr, auth: target.ProxyAuthorization}
	err := t.roundTrip(ctx, req, k, resp, func(ctx context.Context) (net.Conn, error) {
		return t.dial(ctx, target.Addr)
	})
	if err != nil {
		return err
	}
	if resp.Status == 407 {
		// The upstream refused our credentials: that is the proxy's
		// failure, never something to show the client.
		resp.discard()
		return &Error{Phase: worker.PhaseProxyHandshake, Err: &StatusError{Code: 407}}
	}
	return nil
}

// DirectRoundTrip sends req to its target without an upstream proxy,
// dialling only addrs (the destination guard's checked addresses for the
// request's host). Errors are *Error with PhaseDial or
// PhaseResponseHeaders, or a *BodyError.
func (t *Transport) DirectRoundTrip(ctx context.Context, req *Request, addrs []netip.AddrPort, resp *Response) error {
	k := poolKey{addr: string(req.Authority), direct: true}
	return t.roundTrip(ctx, req, k, resp, func(ctx context.Context) (net.Conn, error) {
		return t.dialChecked(ctx, addrs)
	})
}

// discard reads a little of an unwanted body so that the connection can
// be kept, then closes the response.
func (r *Response) discard() {
	var buf [512]byte
	for range 8 {
		if _, err := r.Body.Read(buf[:]); err != nil {
			break
		}
	}
	r.Close()
}

func (t *Transport) roundTrip(ctx context.Context, req *Request, k poolKey, resp *Response, dial func(context.Context) (net.Conn, error)) error {
	hp := t.pools.get(k)
	fresh := false
	for {
		var pc *pconn
		if !fresh {
			pc = t.take(hp, time.Now())
		}
		if pc == nil {
			c, err := dial(ctx)
			if err != nil {
				what := "dialing upstream proxy: %w"
				if k.direct {
					what = "dialing destination: %w"
				}
				return &Error{Phase: worker.PhaseDial, Err: fmt.Errorf(what, err)}
			}
			pc = &pconn{conn: c, hp: hp}
		}
		pc.hp = hp
		resp.live.Store(pc)
		retry, err := t.exchange(pc, req, k, resp)
		if err == nil {
			resp.t, resp.pc = t, pc
			return nil
		}
		resp.live.Store(nil)
		pc.close()
		if retry && pc.reused {
			// A kept-alive connection the upstream had closed: nothing
			// of this request can have been acted upon.
			fresh = true
			continue
		}
		var be *BodyError
		if errors.As(err, &be) {
			return err
		}
		return &Error{Phase: worker.PhaseResponseHeaders, Err: fmt.Errorf("awaiting response headers: %w", err)}
	}
}

// exchange writes req on pc and reads the response head. retry reports a
// failure that happened before anything could have been processed.
func (t *Transport) exchange(pc *pconn, req *Request, k poolKey, resp *Response) (retry bool, err error) {
	pc.br.Reset(pc.conn)
	wb := writeBufPool.Get().(*[]byte)
	b := append((*wb)[:0], req.Method...)
	b = append(b, ' ')
	if !k.direct {
		b = append(b, "http://"...)
		b = append(b, req.Authority...)
	}
	b = append(b, req.URI...)
	b = append(b, " HTTP/1.1\r\n"...)
	b = append(b, req.Header...)
	if k.auth != "" {
		b = append(b, "Proxy-Authorization: "...)
		b = append(b, k.auth...)
		b = append(b, "\r\n"...)
	}
	b = append(b, "\r\n"...)
	_, err = pc.conn.Write(b)
	if cap(b) <= 64<<10 {
		*wb = b
		writeBufPool.Put(wb)
	}
	if err != nil {
		// The head did not get out whole: no upstream can act on it.
		return true, fmt.Errorf("writing request: %w", err)
	}
	resp.BodyUnsent = false
	if req.Body != nil {
		if err := t.sendBody(pc, req, resp); err != nil {
			return false, err
		}
	} else {
		_ = pc.conn.SetReadDeadline(time.Now().Add(t.opts.ResponseHeaderTimeout))
		if err := t.readHead(pc, resp, false); err != nil {
			return req.Idempotent && staleErr(err, pc), err
		}
	}
	t.frame(pc, req, resp)
	if n := resp.ContentLength; !resp.Body.Done() && (resp.Chunked || n < 0 || n > int64(pc.br.Buffered())) {
		// The body will be read from the connection: no deadline. (One
		// already buffered needs no clearing; the next exchange sets its
		// own before it reads.)
		_ = pc.conn.SetReadDeadline(time.Time{})
	}
	return false, nil
}

// awaitContinue waits briefly for the upstream's verdict on a request
// whose client expects 100 Continue. final reports that a final response
// came instead: the body is not sent and the connection not kept.
func (t *Transport) awaitContinue(pc *pconn, req *Request, resp *Response) (final bool, err error) {
	_ = pc.conn.SetReadDeadline(time.Now().Add(ExpectContinueTimeout))
	err = t.readHead(pc, resp, true)
	switch {
	case err == errContinue:
		return false, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false, nil // silent upstream: send the body anyway
	case err != nil:
		return false, err
	}
	resp.BodyUnsent = true
	return true, nil
}

// errContinue is readHead's signal that a 100 Continue arrived.
var errContinue = errors.New("100 continue")

// readHead reads response heads until a final one, skipping interim ones;
// awaiting a 100 Continue it returns errContinue at one.
func (t *Transport) readHead(pc *pconn, resp *Response, awaiting bool) error {
	for range max1xx {
		head, err := pc.br.ReadHead(int(t.opts.MaxResponseHeaderBytes), false)
		if err != nil {
			return err
		}
		if err := h1.ParseResponse(head, &resp.Response, MaxResponseFields); err != nil {
			return err
		}
		switch {
		case resp.Status == 101:
			return errSwitching
		case resp.Status == 100 && awaiting:
			return errContinue
		case resp.Status < 200:
			continue
		}
		return nil
	}
	return errTooMany1xx
}

var (
	errSwitching  = errors.New("upstream switched protocols unasked")
	errTooMany1xx = errors.New("too many interim responses")
)

// staleErr: the connection ended before any byte of a response.
func staleErr(err error, pc *pconn) bool {
	return pc.br.Buffered() == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET))
}

// frame sets up the response body by its framing (RFC 9112 §6.3).
func (t *Transport) frame(pc *pconn, req *Request, resp *Response) {
	resp.keep = resp.KeepAlive && !resp.BodyUnsent
	switch {
	case req.Method == "HEAD" || resp.Status == 204 || resp.Status == 304:
		resp.Body.ResetNone()
	case resp.Chunked:
		resp.Body.ResetChunked(&pc.br, req.Decode)
	case resp.ContentLength >= 0:
		resp.Body.ResetLength(&pc.br, resp.ContentLength)
	default:
		resp.Body.ResetUntilClose(&pc.br)
		resp.keep = false
	}
}

// aLongTimeAgo is a deadline in the past: it wakes a blocked read or write.
var aLongTimeAgo = time.Unix(1, 0)

// errStopped: the body writer was stopped because the exchange ended.
var errStopped = errors.New("request body stopped")

// sendBody sends the request body (after the upstream's 100 Continue when
// the client expects one) and reads the response head meanwhile, as
// net/http's write and read loops do: an upstream may answer before it
// has read the whole body (an early 413, a streamed response). The body
// then stops there and the answer is returned as the response, with
// BodyUnsent set. The writer is a goroutine of this exchange only: it has
// ended, one way or another, when sendBody returns.
func (t *Transport) sendBody(pc *pconn, req *Request, resp *Response) error {
	if req.Continue != nil {
		final, err := t.awaitContinue(pc, req, resp)
		if err != nil || final {
			return err
		}
		if err := req.Continue(); err != nil {
			return &BodyError{Err: err}
		}
	}
	// No read deadline while the body goes out: the writer sets
	// ResponseHeaderTimeout once it is done, so that the timeout counts
	// from the end of the request, as net/http counts it.
	_ = pc.conn.SetReadDeadline(time.Time{})
	if pc.wdone == nil {
		pc.wdone = make(chan error, 1)
	}
	pc.stopping.Store(false)
	go pc.writeBody(req.Body, t.opts.ResponseHeaderTimeout)
	herr := t.readHead(pc, resp, false)
	werr := pc.endBody(req)
	var be *BodyError
	switch {
	case werr == nil:
		return herr
	case errors.As(werr, &be):
		// The client broke or left its body: that ends the request
		// whatever the upstream said, and blames no proxy.
		return werr
	case herr == nil:
		// A final answer before the body was out: relay it. The upstream
		// saw part of a request, so its connection is not kept; the
		// client side must not keep its own if body bytes remain unread.
		resp.BodyUnsent = true
		return nil
	case werr == errStopped:
		return herr
	}
	return werr
}

// writeBody is the body writer of one exchange. Before it reports its end
// on wdone it sets the read deadline the reader then needs, so that the
// reader owns the connection's deadlines once it has the report.
func (pc *pconn) writeBody(body io.Reader, headerTimeout time.Duration) {
	err := copyBody(pc.conn, body, headerTimeout, &pc.stopping)
	var be *BodyError
	switch {
	case err == nil:
		// The request is out whole: its answer is due within the timeout.
		_ = pc.conn.SetReadDeadline(time.Now().Add(headerTimeout))
	case pc.stopping.Load() && (!errors.As(err, &be) || errors.Is(err, os.ErrDeadlineExceeded)):
		// Stopped by endBody (a past deadline on either side), not a
		// body the client broke on its own meanwhile.
		err = errStopped
	case errors.As(err, &be):
		// The client broke its body: no answer can come. Wake the reader.
		_ = pc.conn.SetReadDeadline(aLongTimeAgo)
	default:
		// The upstream stopped taking the body. It may have answered
		// first (an early 413, then close): the reader still gets that,
		// within the timeout.
		_ = pc.conn.SetReadDeadline(time.Now().Add(headerTimeout))
	}
	pc.wdone <- err
}

// endBody waits for the body writer to end, stopping it first if it is
// still at work: its upstream write fails at once, a read of the client's
// body through req.StopBody.
func (pc *pconn) endBody(req *Request) error {
	select {
	case err := <-pc.wdone:
		return err
	default:
	}
	pc.stopping.Store(true)
	_ = pc.conn.SetWriteDeadline(aLongTimeAgo)
	if req.StopBody != nil {
		req.StopBody()
	}
	err := <-pc.wdone
	_ = pc.conn.SetWriteDeadline(time.Time{})
	return err
}

// copyBody streams a request body upstream; read failures are the
// client's (BodyError), write failures the upstream's.
//
// An upstream that takes nothing for stall (responseHeaderTimeout) fails
// the write: it neither reads the body nor answers. Each write gets a new
// deadline; stopping is checked after setting it, so a stop (endBody sets
// stopping, then a past deadline) is never overwritten by a fresh one.
func copyBody(dst net.Conn, body io.Reader, stall time.Duration, stopping *atomic.Bool) error {
	bp := copyBufPool.Get().(*[]byte)
	defer copyBufPool.Put(bp)
	defer func() { _ = dst.SetWriteDeadline(time.Time{}) }()
	buf := *bp
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(stall))
			if stopping.Load() {
				return fmt.Errorf("writing request body: %w", os.ErrDeadlineExceeded)
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return fmt.Errorf("writing request body: %w", err)
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return &BodyError{Err: rerr}
		}
	}
}
