package h1

import (
	"errors"
	"io"
)

// Body framing modes.
const (
	bodyNone = iota
	bodyLength
	bodyChunked
	bodyUntilClose
)

// Chunked-body states (RFC 9112 §7.1), strict: CRLF only, no bare LF.
const (
	csSize uint8 = iota
	csSizeWS
	csExt
	csSizeLF
	csData
	csDataCR
	csDataLF
	csTrailerStart
	csTrailerName
	csTrailer
	csTrailerLF
	csEndLF
	csDone
)

// Bounds of chunk framing.
const (
	maxChunkLine    = 4 << 10  // chunk-size line with extensions
	maxTrailerBytes = 16 << 10 // the whole trailer section
	maxChunkSize    = 1 << 60
)

// Errors of a body that breaks its framing. ErrBadChunk is request
// smuggling material on the client side.
var (
	ErrBadChunk  = errors.New("malformed chunked body")
	ErrTruncated = errors.New("body ended early")
)

// Body reads one message body from a Reader by its framing and stops
// exactly at its end. A chunked body is returned verbatim — sizes,
// extensions and trailers as received — unless Decode is set, when only
// the data is returned. Bytes returned count in N.
type Body struct {
	src    *Reader
	mode   uint8
	state  uint8
	decode bool
	digits int
	line   int   // bytes of the current chunk-size line or of trailers
	left   int64 // length mode: bytes left; chunked: data left in chunk
	done   bool
	err    error
	// N counts the bytes returned by Read.
	N int64
}

// Reset frames a body of length n (n <= 0: none).
func (b *Body) ResetLength(src *Reader, n int64) {
	*b = Body{src: src, mode: bodyLength, left: n, done: n <= 0}
}

// ResetChunked frames a chunked body; decode returns only its data.
func (b *Body) ResetChunked(src *Reader, decode bool) {
	*b = Body{src: src, mode: bodyChunked, decode: decode}
}

// ResetUntilClose frames a body that ends when the connection does.
func (b *Body) ResetUntilClose(src *Reader) {
	*b = Body{src: src, mode: bodyUntilClose}
}

// ResetNone frames an absent body.
func (b *Body) ResetNone() { *b = Body{mode: bodyNone, done: true} }

// Done reports whether the whole body was read.
func (b *Body) Done() bool { return b.done }

// Buffered reports how many bytes Read can return without reading the
// connection (an upper bound for chunked bodies).
func (b *Body) Buffered() int {
	if b.done {
		return 0
	}
	n := b.src.Buffered()
	if b.mode == bodyLength && int64(n) > b.left {
		return int(b.left)
	}
	return n
}

// Read returns body bytes; io.EOF once the body is complete. A connection
// that ends early gives ErrTruncated; broken chunk framing ErrBadChunk.
func (b *Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.done {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var err error
	switch b.mode {
	case bodyLength:
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, err = b.src.Read(p)
		b.left -= int64(n)
		if b.left == 0 {
			b.done = true
		} else if err != nil {
			err = truncated(err)
		}
	case bodyUntilClose:
		n, err = b.src.Read(p)
		if errors.Is(err, io.EOF) {
			b.done, err = true, nil
		}
	case bodyChunked:
		n, err = b.readChunked(p)
	}
	b.N += int64(n)
	if err != nil {
		b.err = err
		if n > 0 {
			return n, nil
		}
		return 0, err
	}
	if n == 0 && b.done {
		return 0, io.EOF
	}
	return n, nil
}

func truncated(err error) error {
	if errors.Is(err, io.EOF) {
		return ErrTruncated
	}
	return err
}

func (b *Body) readChunked(p []byte) (int, error) {
	n := 0
	for n < len(p) && b.state != csDone {
		if b.src.Buffered() == 0 {
			if n > 0 {
				return n, nil // never block with bytes in hand
			}
			if err := b.src.Fill(); err != nil {
				return 0, truncated(err)
			}
		}
		avail := b.src.Bytes()
		if b.state == csData {
			k := min(int64(len(avail)), b.left, int64(len(p)-n))
			copy(p[n:], avail[:k])
			n += int(k)
			b.src.Discard(int(k))
			if b.left -= k; b.left == 0 {
				b.state = csDataCR
			}
			continue
		}
		// Framing bytes, one at a time (a few per chunk).
		i := 0
		for i < len(avail) && n < len(p) && b.state != csData && b.state != csDone {
			c := avail[i]
			i++
			if !b.step(c) {
				b.src.Discard(i)
				return n, ErrBadChunk
			}
			if !b.decode {
				p[n] = c
				n++
			}
		}
		b.src.Discard(i)
	}
	if b.state == csDone {
		b.done = true
	}
	return n, nil
}

// step advances the chunked state machine by one framing byte.
func (b *Body) step(c byte) bool {
	switch b.state {
	case csSize:
		if v := unhex(c); v >= 0 {
			if b.left > maxChunkSize>>4 {
				return false
			}
			b.left = b.left<<4 | int64(v)
			b.digits++
			b.line++
			return true
		}
		if b.digits == 0 {
			return false
		}
		return b.afterSize(c)
	case csSizeWS:
		return b.afterSize(c)
	case csExt:
		if b.line++; b.line > maxChunkLine {
			return false
		}
		switch {
		case c == '\r':
			b.state = csSizeLF
		case (c < ' ' && c != '\t') || c == 0x7f:
			return false
		}
		return true
	case csSizeLF:
		if c != '\n' {
			return false
		}
		if b.left == 0 {
			b.state, b.line = csTrailerStart, 0
		} else {
			b.state = csData
		}
		return true
	case csDataCR:
		b.state = csDataLF
		return c == '\r'
	case csDataLF:
		b.state, b.digits, b.line, b.left = csSize, 0, 0, 0
		return c == '\n'
	case csTrailerStart:
		switch c {
		case '\r':
			b.state = csEndLF
			return true
		}
		if !tokenTable[c] {
			return false // a field line starts with its name
		}
		b.state = csTrailerName
		b.line++
		return true
	case csTrailerName:
		if b.line++; b.line > maxTrailerBytes {
			return false
		}
		switch {
		case c == ':':
			b.state = csTrailer
			return true
		case tokenTable[c]:
			return true
		}
		return false // no space before the colon, no line without one
	case csTrailer:
		if b.line++; b.line > maxTrailerBytes {
			return false
		}
		switch {
		case c == '\r':
			b.state = csTrailerLF
		case (c < ' ' && c != '\t') || c == 0x7f:
			return false
		}
		return true
	case csTrailerLF:
		b.state = csTrailerStart
		return c == '\n'
	case csEndLF:
		b.state = csDone
		return c == '\n'
	}
	return false
}

// afterSize handles the byte after a chunk size's digits.
func (b *Body) afterSize(c byte) bool {
	if b.line++; b.line > maxChunkLine {
		return false
	}
	switch c {
	case ' ', '\t':
		b.state = csSizeWS
	case ';':
		b.state = csExt
	case '\r':
		b.state = csSizeLF
	default:
		return false
	}
	return true
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
