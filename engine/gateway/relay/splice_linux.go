package relay

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

const spliceFlags = unix.SPLICE_F_NONBLOCK | unix.SPLICE_F_MOVE

// pipe is one pipe pair of the pool.
type pipe struct {
	r, w int // read and write ends, both non-blocking
	size int // capacity granted by F_SETPIPE_SZ
	data int // bytes spliced in and not yet out
}

func newPipe(want int) (*pipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	size, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, want)
	if err != nil {
		// Past pipe-max-size or the user's pipe budget the default
		// capacity still works, with more system calls.
		size, err = unix.FcntlInt(uintptr(fds[0]), unix.F_GETPIPE_SZ, 0)
	}
	if err != nil {
		_ = unix.Close(fds[0])
		_ = unix.Close(fds[1])
		return nil, os.NewSyscallError("fcntl", err)
	}
	return &pipe{r: fds[0], w: fds[1], size: size}, nil
}

// get takes an idle pipe or opens one while fewer than max are open; nil
// when the pool is exhausted (or a pipe cannot be opened).
func (p *Pool) get() *pipe {
	pp, ok, mk := p.pipes.take()
	switch {
	case ok:
		return pp
	case !mk:
		return nil
	}
	pp, err := newPipe(p.pipeBytes)
	if err != nil {
		p.pipes.drop()
		return nil
	}
	p.created.Add(1)
	return pp
}

// put returns an empty pipe to the pool and closes one that still holds
// data: those bytes belong to a copy that failed and must never reach
// another tunnel.
func (p *Pool) put(pp *pipe) {
	if pp.data != 0 {
		_ = unix.Close(pp.r)
		_ = unix.Close(pp.w)
		p.pipes.drop()
		p.discarded.Add(1)
		return
	}
	p.pipes.put(pp)
}

// copyOne copies src to dst until src ends. A TCP src is waited on with
// nothing held and each burst copied through a pooled buffer, or by splice
// when the pool splices, dst is a TCP connection and a pipe is free; any
// other src through a buffer held for the whole copy.
func (p *Pool) copyOne(dst io.Writer, src io.Reader) (int64, error) {
	s, ok := src.(*net.TCPConn)
	if !ok {
		return p.bufferCopy(dst, src)
	}
	f := &flow{pool: p, dst: dst, src: s}
	var err error
	if f.srcRC, err = s.SyscallConn(); err != nil {
		return 0, err
	}
	if d, ok := dst.(*net.TCPConn); ok && p.splice {
		if f.dstRC, err = d.SyscallConn(); err != nil {
			return 0, err
		}
	}
	f.awaitFn, f.drainFn = f.await, f.drain
	return f.run()
}

// flow is one direction of a tunnel whose source is a TCP connection.
// The callbacks run inside RawConn.Read/Write, which keep the descriptor
// valid however the connection is closed meanwhile; they are bound once
// so that a burst allocates nothing.
type flow struct {
	pool             *Pool
	dst              io.Writer
	src              *net.TCPConn
	srcRC, dstRC     syscall.RawConn // dstRC nil: no splicing (the pool does not, or dst is no socket)
	awaitFn, drainFn func(uintptr) bool
	pp               *pipe // held from a wake-up until src has nothing more
	bulk             bool  // the last buffered read filled its buffer
	n                int   // bytes the last callback saw or moved
	errno            error // the last callback's failure
	peekByte         [1]byte
}

// run waits for src, copies what it has (through a pipe, or a buffer when
// there is none to be had), and again, until src ends or fails.
func (f *flow) run() (written int64, err error) {
	defer func() {
		if f.pp != nil {
			f.pool.put(f.pp) // closes it if it still holds data
		}
	}()
	for {
		f.n, f.errno = 0, nil
		if err := f.srcRC.Read(f.awaitFn); err != nil {
			return written, err
		}
		if f.pp == nil { // src is readable and there is no pipe
			switch {
			case f.errno != nil:
				return written, os.NewSyscallError("recvfrom", f.errno)
			case f.n == 0:
				return written, nil // EOF
			}
			if f.dstRC != nil {
				f.pool.fallbacks.Add(1)
			}
			n, err := f.pool.bufferBurst(f.dst, f.src, &f.bulk)
			written += n
			if err == io.EOF {
				return written, nil
			}
			if err != nil {
				return written, err
			}
			continue
		}
		switch {
		case f.errno != nil:
			return written, os.NewSyscallError("splice", f.errno)
		case f.n == 0:
			return written, nil // EOF
		}
		f.pp.data = f.n
		f.n, f.errno = 0, nil
		err := f.dstRC.Write(f.drainFn)
		written += int64(f.n)
		if err != nil {
			return written, err
		}
		if f.errno != nil {
			return written, os.NewSyscallError("splice", f.errno)
		}
		// The pipe is empty and kept: the next await splices straight
		// away and gives it back only if src has nothing more.
	}
}

// await is the RawConn.Read callback that waits for src and takes in what
// it has. With a pipe (kept from the last burst, or taken now) it splices
// src into it; when src is empty it gives the pipe back before asking to
// park, so an idle tunnel holds none. Without a pipe (none free, or no
// splicing to dst) it only looks, so the burst is copied through a
// buffer after the wait and not during it. The first call always tries:
// RawConn.Read clears the poller's readiness before it, so data that
// arrived earlier would never wake a wait that skipped the try.
func (f *flow) await(fd uintptr) bool {
	if f.pp == nil && f.dstRC != nil {
		f.pp = f.pool.get()
	}
	if f.pp == nil {
		return f.peek(fd)
	}
	for {
		n, err := unix.Splice(int(fd), nil, f.pp.w, nil, f.pp.size, spliceFlags)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN: // the pipe is empty: src has nothing
			f.pool.put(f.pp)
			f.pp = nil
			return false
		}
		f.n, f.errno = int(n), err
		return true
	}
}

// peek reports whether src is readable (data, EOF or an error) without
// consuming anything; false asks RawConn.Read to park.
func (f *flow) peek(fd uintptr) bool {
	for {
		n, _, e := unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&f.peekByte[0])), 1,
			unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case 0:
			f.n = int(n)
		default:
			f.errno = e
		}
		return true
	}
}

// drain splices everything in the pipe out to dst, asking RawConn.Write
// to wait for room whenever dst is full.
func (f *flow) drain(fd uintptr) bool {
	for f.pp.data > 0 {
		n, err := unix.Splice(f.pp.r, nil, int(fd), nil, f.pp.data, spliceFlags)
		if n > 0 {
			f.pp.data -= int(n)
			f.n += int(n)
			continue
		}
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		case nil:
			err = io.ErrNoProgress // the pipe is ours: it cannot run dry early
		}
		f.errno = err
		return true
	}
	return true
}
