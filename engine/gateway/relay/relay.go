package relay

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

const (
	// DefaultPipes bounds the pipes a splicing pool keeps open: each is
	// two descriptors, held only by a tunnel in the middle of a burst, so
	// 64 cover far more bursts in flight than two cores can feed.
	DefaultPipes = 64
	// DefaultPipeBytes is the capacity asked for each pipe (F_SETPIPE_SZ),
	// as Go's own splice does: 1 MiB is the default pipe-max-size.
	DefaultPipeBytes = 1 << 20
	// DefaultLargeBuffers bounds the large buffers of bulk bursts: at
	// most 64 × 256 KiB = 16 MiB, whatever the number of tunnels.
	DefaultLargeBuffers = 64
	// LargeBufferBytes is the size of a bulk burst's buffer: a direction
	// whose last read filled a small buffer is moving bulk data, and reads
	// and writes this much per system call while one is free.
	LargeBufferBytes = 256 << 10
	// smallBufferBytes is the size of every other burst's buffer (and of
	// the buffer a copy from a non-TCP source holds).
	smallBufferBytes = 32 << 10
)

// Options configure a Pool; the zero value is the default pool's.
type Options struct {
	// Splice copies bursts between two TCP connections with splice(2)
	// through pooled pipes (Linux only) instead of through buffers. On
	// loopback it measured slower than large buffers (docs/benchmarks.md),
	// so it is off unless asked for.
	Splice bool
	// Pipes bounds the open pipes (default DefaultPipes) and PipeBytes is
	// the capacity asked for each (default DefaultPipeBytes); only with
	// Splice.
	Pipes, PipeBytes int
	// LargeBuffers bounds the large buffers (default DefaultLargeBuffers;
	// negative: none, every burst uses a small buffer).
	LargeBuffers int
}

// Pool is the bounded set of pipes and large buffers shared by every
// tunnel copied through it, plus the small buffers of other bursts.
type Pool struct {
	splice    bool
	pipeBytes int
	pipes     bounded[*pipe]
	created   atomic.Uint64
	discarded atomic.Uint64
	fallbacks atomic.Uint64

	large       bounded[*[]byte]
	largeMisses atomic.Uint64
	small       sync.Pool // *[]byte of smallBufferBytes
}

// bounded is a set of at most max reusable values: those not in use wait
// in idle, live counts those that exist.
type bounded[T any] struct {
	idle chan T
	live atomic.Int64
	max  int64
}

func newBounded[T any](n int) bounded[T] {
	return bounded[T]{idle: make(chan T, n), max: int64(n)}
}

// take returns an idle value (ok), or while fewer than max exist the
// right to make one (mk: the caller makes it, and calls drop if it
// cannot); neither when all are in use.
func (b *bounded[T]) take() (v T, ok, mk bool) {
	select {
	case v := <-b.idle:
		return v, true, false
	default:
	}
	for {
		n := b.live.Load()
		if n >= b.max {
			return v, false, false
		}
		if b.live.CompareAndSwap(n, n+1) {
			return v, false, true
		}
	}
}

// put gives a value back; it never blocks, as at most max exist.
func (b *bounded[T]) put(v T) { b.idle <- v }

// drop forgets a value that was not given back (closed, discarded).
func (b *bounded[T]) drop() { b.live.Add(-1) }

// Stats are a Pool's counters.
type Stats struct {
	Live      int    // pipes open, in use or idle
	Idle      int    // pipes open and waiting in the pool
	Created   uint64 // pipes ever opened
	Discarded uint64 // pipes closed because a copy ended with data in them
	Fallbacks uint64 // bursts between TCP connections copied through a buffer: no pipe could be had

	LargeLive   int    // large buffers allocated, in use or idle
	LargeIdle   int    // large buffers waiting in the pool
	LargeMisses uint64 // bulk bursts copied through a small buffer: every large one was in use
}

// NewPool returns a pool configured by o.
func NewPool(o Options) *Pool {
	if o.Pipes == 0 {
		o.Pipes = DefaultPipes
	}
	if o.PipeBytes <= 0 {
		o.PipeBytes = DefaultPipeBytes
	}
	if !o.Splice || o.Pipes < 0 {
		o.Pipes = 0
	}
	if o.LargeBuffers == 0 {
		o.LargeBuffers = DefaultLargeBuffers
	}
	o.LargeBuffers = max(o.LargeBuffers, 0)
	p := &Pool{
		splice: o.Splice && o.Pipes > 0, pipeBytes: o.PipeBytes,
		pipes: newBounded[*pipe](o.Pipes), large: newBounded[*[]byte](o.LargeBuffers),
	}
	p.small.New = func() any { b := make([]byte, smallBufferBytes); return &b }
	return p
}

// Stats reports the pool's counters.
func (p *Pool) Stats() Stats {
	return Stats{
		Live:        int(p.pipes.live.Load()),
		Idle:        len(p.pipes.idle),
		Created:     p.created.Load(),
		Discarded:   p.discarded.Load(),
		Fallbacks:   p.fallbacks.Load(),
		LargeLive:   int(p.large.live.Load()),
		LargeIdle:   len(p.large.idle),
		LargeMisses: p.largeMisses.Load(),
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

// bufferCopy copies src to dst through one small buffer held until src
// ends: the path for connections relay cannot wait on without reading.
// The wrappers keep io.CopyBuffer from handing the copy to a ReadFrom or
// WriteTo that would allocate (or splice with pipes held) on its own.
func (p *Pool) bufferCopy(dst io.Writer, src io.Reader) (int64, error) {
	b := p.small.Get().(*[]byte)
	defer p.small.Put(b)
	return io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, *b)
}

// getLarge takes an idle large buffer or allocates one while fewer than
// the bound exist; nil when all are in use.
func (p *Pool) getLarge() *[]byte {
	b, ok, mk := p.large.take()
	if mk {
		buf := make([]byte, LargeBufferBytes)
		return &buf
	}
	if !ok {
		return nil
	}
	return b
}

// bufferBurst copies one read's worth from src (known to be readable) to
// dst through a pooled buffer: a large one when *bulk says the last read
// filled a small one, and one is free. It updates *bulk from this read and
// returns io.EOF at the end of src.
func (p *Pool) bufferBurst(dst io.Writer, src io.Reader, bulk *bool) (int64, error) {
	var b *[]byte
	large := false
	if *bulk {
		if b = p.getLarge(); b != nil {
			large = true
		} else {
			p.largeMisses.Add(1)
		}
	}
	if !large {
		b = p.small.Get().(*[]byte)
	}
	n, err := src.Read(*b)
	// A full small read means more is waiting; a large read that a small
	// buffer would have held means the bulk is over.
	*bulk = n == len(*b) || (large && n > smallBufferBytes)
	if n > 0 {
		w, werr := dst.Write((*b)[:n])
		if werr == nil && w < n {
			werr = io.ErrShortWrite
		}
		if werr != nil {
			err, n = werr, w
		}
	}
	if large {
		p.large.put(b)
	} else {
		p.small.Put(b)
	}
	return int64(n), err
}
