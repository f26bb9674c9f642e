package ingress

import (
	"bytes"
	"sync/atomic"
)

// framer follows the HTTP/1 framing of what a client sends on one
// connection, as it is read, to catch the two malformed inputs net/http
// accepts silently but a proxy must refuse (request smuggling vectors):
// obs-folded header lines (which net/http joins into one value) and a
// request carrying both Transfer-Encoding and Content-Length (net/http
// drops the length). Header bytes are scanned one by one; bodies are
// skipped by length or chunk framing. It records the first header block
// that broke a rule; the handler refuses that request and every later one
// on the connection. After a CONNECT, or when the stream is past
// understanding (net/http will refuse it anyway), it stops scanning.
type framer struct {
	state     uint8
	first     bool // the current line is the request line
	started   bool // the current block's request line has begun
	connect   bool
	clSeen    bool
	te        bool
	chunked   bool
	ext       bool // in a chunk extension
	cl        int64
	remaining int64
	lineLen   int
	line      [48]byte // lower-cased start of the current line
	blocks    int64
	// bad is the 1-based index of the first offending header block, 0
	// while none. The handler reads it from another goroutine.
	bad atomic.Int64
	// served counts the handler's requests on this connection.
	served atomic.Int64
}

const (
	stHeader uint8 = iota
	stBody
	stChunkSize
	stChunkData
	stChunkCRLF
	stTrailer
	stOff
)

func (f *framer) newBlock() {
	f.state, f.first, f.started = stHeader, true, false
	f.connect, f.clSeen, f.te, f.chunked, f.cl, f.lineLen = false, false, false, false, 0, 0
}

func (f *framer) fail() {
	f.bad.CompareAndSwap(0, f.blocks)
	f.state = stOff
}

func (f *framer) scan(p []byte) {
	if f.blocks == 0 && !f.started && f.state == stHeader {
		f.first = true
	}
	for len(p) > 0 {
		switch f.state {
		case stOff:
			return
		case stBody, stChunkData:
			n := int64(len(p))
			if n > f.remaining {
				n = f.remaining
			}
			f.remaining -= n
			p = p[n:]
			if f.remaining == 0 {
				if f.state == stBody {
					f.newBlock()
				} else {
					f.state = stChunkCRLF
				}
			}
		case stChunkCRLF:
			i := bytes.IndexByte(p, '\n')
			if i < 0 {
				return
			}
			p = p[i+1:]
			f.state, f.remaining, f.ext = stChunkSize, 0, false
		case stChunkSize:
			b := p[0]
			p = p[1:]
			switch {
			case b == '\n':
				if f.remaining == 0 {
					f.state, f.lineLen = stTrailer, 0
				} else {
					f.state = stChunkData
				}
			case b == '\r' || f.ext:
			case b == ';' || b == ' ' || b == '\t':
				f.ext = true
			default:
				v := unhex(b)
				if v < 0 || f.remaining > 1<<40 {
					f.state = stOff // net/http refuses the body
					return
				}
				f.remaining = f.remaining<<4 | int64(v)
			}
		case stTrailer:
			b := p[0]
			p = p[1:]
			switch b {
			case '\n':
				if f.lineLen == 0 {
					f.newBlock()
				} else {
					f.lineLen = 0
				}
			case '\r':
			default:
				f.lineLen++
			}
		case stHeader:
			b := p[0]
			p = p[1:]
			f.header(b)
		}
	}
}

func (f *framer) header(b byte) {
	switch b {
	case '\r':
		return
	case '\n':
		f.endLine()
		return
	}
	if !f.started {
		f.started = true
		f.blocks++
	}
	if f.lineLen == 0 && !f.first && (b == ' ' || b == '\t') {
		f.fail() // obs-fold: a continuation line
		return
	}
	if f.lineLen < len(f.line) {
		if b >= 'A' && b <= 'Z' {
			b += 'a' - 'A'
		}
		f.line[f.lineLen] = b
	}
	f.lineLen++
}

func (f *framer) endLine() {
	if f.lineLen == 0 {
		if !f.started {
			return // empty lines before a request line are allowed
		}
		f.endBlock()
		return
	}
	l := f.line[:min(f.lineLen, len(f.line))]
	f.lineLen = 0
	if f.first {
		f.first = false
		f.connect = bytes.HasPrefix(l, []byte("connect "))
		return
	}
	if v, ok := bytes.CutPrefix(l, []byte("content-length:")); ok {
		f.clSeen = true
		f.cl = parseLength(v)
	} else if v, ok := bytes.CutPrefix(l, []byte("transfer-encoding:")); ok {
		f.te = true
		f.chunked = bytes.Contains(v, []byte("chunked"))
	}
}

func (f *framer) endBlock() {
	switch {
	case f.te && f.clSeen:
		f.fail()
	case f.connect:
		f.state = stOff // tunnel bytes follow
	case f.te && f.chunked:
		f.state, f.remaining, f.ext = stChunkSize, 0, false
	case f.te:
		f.state = stOff // net/http answers 501 and closes
	case f.cl > 0:
		f.state, f.remaining = stBody, f.cl
	case f.cl < 0:
		f.state = stOff // net/http refuses the length
	default:
		f.newBlock()
	}
}

// parseLength reads the digits of a Content-Length value; -1 when it is
// not a plain non-negative number net/http would accept.
func parseLength(v []byte) int64 {
	v = bytes.TrimSpace(v)
	if len(v) == 0 || len(v) > 18 {
		return -1
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int64(c-'0')
	}
	return n
}

func unhex(b byte) int {
	switch {
	case b >= '0' && b <= '9':
		return int(b - '0')
	case b >= 'a' && b <= 'f':
		return int(b-'a') + 10
	case b >= 'A' && b <= 'F':
		return int(b-'A') + 10
	}
	return -1
}

// nextRequest is called once per request the handler serves on the
// connection; it reports whether that request's header block (or an
// earlier one) broke framing.
func (f *framer) nextRequest() (bad bool) {
	k := f.served.Add(1)
	b := f.bad.Load()
	return b != 0 && k >= b
}
