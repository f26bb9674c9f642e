//go:build unix

package transport

import (
	"net"
	"syscall"
)

// alive probes an idle connection without blocking and without consuming
// anything: a pending EOF, reset or unexpected byte means the upstream is
// done with it. (A read under an expired deadline would not even reach
// the socket, hence the raw peek.)
func alive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ok = false
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		ok = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true
	})
	return err == nil && ok
}
