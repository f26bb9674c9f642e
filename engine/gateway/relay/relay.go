package relay

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

const (
	// DefaultPipes bounds the pipes the default pool keeps open: each is
	// two descriptors, held only by a tunnel in the middle of a burst, so
	// 64 cover far more bursts in flight than two cores can feed.
	DefaultPipes = 64
	// DefaultPipeBytes is the capacity asked for each pipe (F_SETPIPE_SZ),
	// as Go's own splice does: 1 MiB is the default pipe-max-size.
	DefaultPipeBytes = 1 << 20
	// bufferBytes is the size of a fallback copy buffer.
	bufferBytes = 32 << 10
)

var defaultPool = NewPool(DefaultPipes, DefaultPipeBytes)

// Copy copies both ways between client and upstream with the default pool;
// see Pool.Copy.
func Copy(client, upstream io.ReadWriteCloser) (up, down int64, err error) {
	return defaultPool.Copy(client, upstream)
}

// DefaultStats reports the default pool's counters.
func DefaultStats() Stats { return defaultPool.Stats() }

// Pool is a bounded set of pipes shared by every tunnel copied through it,
// plus the buffers of the fallback copy.
type Pool struct {
	max, pipeBytes int
	idle           chan *pipe   // open pipes not in use; capacity max
	live           atomic.Int64 // open pipes, in use or idle
	created        atomic.Uint64
	discarded      atomic.Uint64
	fallbacks      atomic.Uint64
	bufs           sync.Pool // *[]byte of bufferBytes
}

// Stats are a Pool's counters.
type Stats struct {
	Live      int    // pipes open, in use or idle
	Idle      int    // pipes open and waiting in the pool
	Created   uint64 // pipes ever opened
	Discarded uint64 // pipes closed because a copy ended with data in them
	Fallbacks uint64 // bursts between TCP connections copied through a buffer: no pipe could be had
}

// NewPool returns a pool of at most pipes pipes of pipeBytes each (values
// below 1 mean none: every copy goes through buffers).
func NewPool(pipes, pipeBytes int) *Pool {
	pipes = max(pipes, 0)
	p := &Pool{max: pipes, pipeBytes: pipeBytes, idle: make(chan *pipe, pipes)}
	p.bufs.New = func() any { b := make([]byte, bufferBytes); return &b }
	return p
}

// Stats reports the pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		Live:      int(p.live.Load()),
		Idle:      len(p.idle),
		Created:   p.created.Load(),
		Discarded: p.discarded.Load(),
		Fallbacks: p.fallbacks.Load(),
	}
}

// Copy copies client → upstream and upstream → client until both
// directions have ended, and returns the bytes written each way. A clean
// EOF on one direction is passed on as a half-close of its destination
// (both are closed if that is not possible); an error in either direction
// closes both connections, so the other cannot hang, and is returned (the
// first one). Close of either connection from another goroutine ends the
// copy. Copy does not close the connections after clean EOFs both ways:
// the caller still owns them.
func (p *Pool) Copy(client, upstream io.ReadWriteCloser) (up, down int64, err error) {
	var first firstError
	upDone := make(chan int64, 1)
	go func() {
		n, err := p.copyOne(upstream, client)
		first.set(err, "copying client to upstream")
		finish(err, upstream, client)
		upDone <- n
	}()
	down, err = p.copyOne(client, upstream)
	first.set(err, "copying upstream to client")
	finish(err, client, upstream)
	return <-upDone, down, first.get()
}

// finish ends one direction: half-close dst after a clean EOF, or close
// both after an error so the other direction cannot hang.
func finish(err error, dst, src io.Closer) {
	if err == nil {
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			return
		}
	}
	_ = dst.Close()
	_ = src.Close()
}

// firstError keeps the first direction's error; it is set before that
// direction closes anything, so the other direction's resulting "use of
// closed connection" never wins.
type firstError struct {
	mu  sync.Mutex
	err error
}

func (f *firstError) set(err error, what string) {
	if err == nil {
		return
	}
	f.mu.Lock()
	if f.err == nil {
		f.err = fmt.Errorf("%s: %w", what, err)
	}
	f.mu.Unlock()
}

func (f *firstError) get() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// bufferCopy copies src to dst through one pooled buffer held until src
// ends: the path for connections relay cannot wait on without reading.
// The wrappers keep io.CopyBuffer from handing the copy to a ReadFrom or
// WriteTo that would allocate (or splice with pipes held) on its own.
func (p *Pool) bufferCopy(dst io.Writer, src io.Reader) (int64, error) {
	b := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(b)
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *b)
}

// bufferBurst copies one read's worth from src (known to be readable) to
// dst through a pooled buffer. It returns io.EOF at the end of src.
func (p *Pool) bufferBurst(dst io.Writer, src io.Reader) (int64, error) {
	b := p.bufs.Get().(*[]byte)
	defer p.bufs.Put(b)
	n, err := src.Read(*b)
	if n > 0 {
		w, werr := dst.Write((*b)[:n])
		if werr == nil && w < n {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			return int64(w), werr
		}
	}
	return int64(n), err
}
