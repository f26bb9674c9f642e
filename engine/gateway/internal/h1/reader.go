package h1

import (
	"errors"
	"io"
	"sync"
)

// BufferSize is the pooled read buffer of one connection. A head larger
// than this grows the buffer once, up to the head limit, for that
// connection only.
const BufferSize = 4 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// ErrHeadTooLarge: a message head did not end within its limit.
var ErrHeadTooLarge = errors.New("message head too large")

// Reader buffers one connection's input so that a message head is always
// contiguous and can be parsed in place (no copy, no allocation). Bytes it
// returns stay valid only until the next call that reads from the source.
type Reader struct {
	src  io.Reader
	bp   *[]byte // the pooled buffer, nil when buf was grown
	buf  []byte
	r, w int
	err  error
}

// Reset starts reading src, taking a pooled buffer if r has none.
func (b *Reader) Reset(src io.Reader) {
	b.src, b.r, b.w, b.err = src, 0, 0, nil
	if b.buf == nil {
		b.bp = bufPool.Get().(*[]byte)
		b.buf = *b.bp
	}
}

// Release returns the buffer to the pool; buffered bytes are dropped.
func (b *Reader) Release() {
	if b.bp != nil {
		bufPool.Put(b.bp)
	}
	b.bp, b.buf, b.r, b.w, b.src, b.err = nil, nil, 0, 0, nil, nil
}

// Buffered is the number of bytes read from the source and not consumed.
func (b *Reader) Buffered() int { return b.w - b.r }

// Bytes returns the buffered bytes without consuming them.
func (b *Reader) Bytes() []byte { return b.buf[b.r:b.w] }

// Discard consumes n buffered bytes (n <= Buffered()).
func (b *Reader) Discard(n int) {
	b.r += n
	if b.r == b.w {
		b.r, b.w = 0, 0
	}
}

// takeErr returns the pending read error once (a timeout is not fatal to
// the connection: the caller may read again).
func (b *Reader) takeErr() error {
	err := b.err
	b.err = nil
	return err
}

// Fill reads once from the source into free buffer space; it returns an
// error only when no byte arrived.
func (b *Reader) Fill() error {
	if b.err != nil {
		return b.takeErr()
	}
	if b.w == len(b.buf) {
		if b.r == 0 {
			return ErrHeadTooLarge // only ReadHead fills a full buffer, and it grows first
		}
		copy(b.buf, b.buf[b.r:b.w])
		b.w -= b.r
		b.r = 0
	}
	for range 100 {
		n, err := b.src.Read(b.buf[b.w:])
		b.w += n
		if err != nil {
			b.err = err
		}
		if n > 0 {
			return nil
		}
		if err != nil {
			return b.takeErr()
		}
	}
	return io.ErrNoProgress
}

// Read reads buffered bytes first; a large read of an empty buffer goes
// straight to the source.
func (b *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if b.r == b.w {
		if b.err != nil {
			return 0, b.takeErr()
		}
		if len(p) >= len(b.buf) {
			return b.src.Read(p)
		}
		b.r, b.w = 0, 0
		if err := b.Fill(); err != nil {
			return 0, err
		}
	}
	n := copy(p, b.buf[b.r:b.w])
	b.Discard(n)
	return n, nil
}

// ReadHead reads up to and including the empty line that ends a message
// head and returns it; the head is consumed. Empty lines before a request
// line are skipped (skipEmpty) and count against limit, the most bytes
// the head may take. It returns io.EOF when the source ended before any
// byte of a head, io.ErrUnexpectedEOF inside one, ErrHeadTooLarge past
// limit.
func (b *Reader) ReadHead(limit int, skipEmpty bool) ([]byte, error) {
	scanned, skipped := 0, 0
	for {
		if skipEmpty && scanned == 0 {
			for b.r < b.w && (b.buf[b.r] == '\r' || b.buf[b.r] == '\n') {
				b.r++
				skipped++
			}
		}
		data := b.buf[b.r:b.w]
		if end := headEnd(data, scanned); end > 0 {
			if end+skipped > limit {
				return nil, ErrHeadTooLarge
			}
			b.Discard(end)
			return data[:end], nil
		}
		if len(data)+skipped >= limit {
			return nil, ErrHeadTooLarge
		}
		scanned = max(len(data)-2, 0)
		if b.r == 0 && b.w == len(b.buf) {
			b.grow(limit)
		}
		if err := b.Fill(); err != nil {
			if errors.Is(err, io.EOF) {
				if len(data) == 0 && skipped == 0 {
					return nil, io.EOF
				}
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
}

// HeadBuffered reports whether a whole head is already buffered (after
// the empty lines a request may start with), so that ReadHead will not
// read from the source.
func (b *Reader) HeadBuffered() bool {
	data := b.buf[b.r:b.w]
	for len(data) > 0 && (data[0] == '\r' || data[0] == '\n') {
		data = data[1:]
	}
	return headEnd(data, 0) > 0
}

// grow replaces a full buffer by one that can hold a head of limit bytes.
func (b *Reader) grow(limit int) {
	nb := make([]byte, max(limit, 2*len(b.buf)))
	b.w = copy(nb, b.buf[b.r:b.w])
	b.r = 0
	if b.bp != nil {
		bufPool.Put(b.bp)
		b.bp = nil
	}
	b.buf = nb
}

// headEnd returns the length of the head in b (through its empty line),
// -1 while it is incomplete. Search starts at from.
func headEnd(b []byte, from int) int {
	i := from
	for {
		j := indexLF(b[i:])
		if j < 0 {
			return -1
		}
		i += j + 1
		if i < len(b) && b[i] == '\n' {
			return i + 1
		}
		if i+1 < len(b) && b[i] == '\r' && b[i+1] == '\n' {
			return i + 2
		}
	}
}
