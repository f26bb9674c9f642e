//go:build unix

package ingress

import "syscall"

// canWatch: the client watch peeks with recvfrom(MSG_PEEK|MSG_DONTWAIT).
const canWatch = true

// peekGone parks until the client connection is readable and reports
// whether it ended (end of stream or an error) rather than carried a
// byte; nothing is consumed. A past read deadline (the wait ended) or a
// connection closed by the server ends it with false.
func (c *conn) peekGone() bool {
	w := &c.watch
	if w.rc == nil {
		sc, ok := c.raw.(syscall.Conn)
		if !ok {
			return false
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return false
		}
		w.rc, w.peekFn = rc, c.peek
	}
	w.peeked = peekNothing
	if err := w.rc.Read(w.peekFn); err != nil {
		return false
	}
	return w.peeked == peekGone
}

// peek is the RawConn.Read callback: false asks it to park until the
// connection is readable.
func (c *conn) peek(fd uintptr) bool {
	w := &c.watch
	for {
		n, _, err := syscall.Recvfrom(int(fd), w.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN || err == syscall.EWOULDBLOCK:
			return false
		case err == nil && n > 0:
			w.peeked = peekData
		default: // 0 bytes: end of stream; or a reset
			w.peeked = peekGone
		}
		return true
	}
}
