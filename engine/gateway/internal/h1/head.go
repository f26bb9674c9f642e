package h1

import (
	"bytes"
)

func indexLF(b []byte) int { return bytes.IndexByte(b, '\n') }

// Field is one header field line; both slices point into the head.
type Field struct {
	Name, Value []byte
}

// Kind classifies a malformed head for the answer it gets.
type Kind uint8

const (
	// KindSyntax: not HTTP/1 (400).
	KindSyntax Kind = iota + 1
	// KindFraming: a message whose length could be read two ways, or not
	// at all — request smuggling material (400; 501 for a transfer coding
	// other than chunked).
	KindFraming
	// KindTooLarge: the head is over its byte limit (431).
	KindTooLarge
	// KindVersion: an HTTP major version other than 1 (505).
	KindVersion
)

// Error is a malformed head. Status is the answer a server gives it.
type Error struct {
	Kind   Kind
	Status int
	msg    string
}

func (e *Error) Error() string { return e.msg }

func syntaxErr(msg string) *Error { return &Error{Kind: KindSyntax, Status: 400, msg: msg} }

// The errors are preallocated: a refused head costs no allocation.
var (
	ErrRequestLine   = syntaxErr("malformed request line")
	ErrStatusLine    = syntaxErr("malformed status line")
	ErrFieldLine     = syntaxErr("malformed header field line")
	ErrFieldValue    = syntaxErr("invalid character in header field value")
	ErrHost          = syntaxErr("missing or repeated Host header")
	ErrBareCR        = syntaxErr("bare CR in message head")
	ErrTooManyFields = &Error{Kind: KindTooLarge, Status: 431, msg: "too many header fields"}
	ErrTooLarge      = &Error{Kind: KindTooLarge, Status: 431, msg: "message head too large"}
	ErrVersion       = &Error{Kind: KindVersion, Status: 505, msg: "unsupported HTTP version"}
	ErrObsFold       = &Error{Kind: KindFraming, Status: 400, msg: "obsolete line folding"}
	ErrLength        = &Error{Kind: KindFraming, Status: 400, msg: "invalid or conflicting Content-Length"}
	ErrLengthAndTE   = &Error{Kind: KindFraming, Status: 400, msg: "Transfer-Encoding with Content-Length"}
	ErrTE10          = &Error{Kind: KindFraming, Status: 400, msg: "Transfer-Encoding in an HTTP/1.0 message"}
	ErrTEUnsupported = &Error{Kind: KindFraming, Status: 501, msg: "transfer coding other than a single chunked"}
	// ErrTERepeated: a response with more than one Transfer-Encoding line.
	// Combining them is legal but no sane upstream needs it, and relaying
	// one line while reading by another is how desyncs start.
	ErrTERepeated = &Error{Kind: KindFraming, Status: 502, msg: "repeated Transfer-Encoding in response"}
)

// Request is a parsed request head. Its slices point into the head.
type Request struct {
	Method, Target []byte
	// Minor is the HTTP/1 minor version: 0 or 1.
	Minor int
	// Fields holds the field lines, at most the maxFields given to
	// ParseRequest; Count is how many the head had.
	Fields []Field
	Count  int
	// ContentLength is the body length, -1 without one (or when chunked).
	ContentLength int64
	Chunked       bool
	// KeepAlive: the client lets the connection carry another request.
	KeepAlive bool
	// ExpectContinue: the client waits for 100 Continue before its body.
	ExpectContinue bool
	// Listed: Connection names other fields (to drop when forwarding).
	Listed bool
}

// HasBody reports whether a body follows the head.
func (r *Request) HasBody() bool { return r.Chunked || r.ContentLength > 0 }

// Get returns the value of the first field named name (ASCII case
// insensitive) among the kept fields.
func (r *Request) Get(name string) ([]byte, bool) { return get(r.Fields, name) }

func get(fs []Field, name string) ([]byte, bool) {
	for i := range fs {
		if EqualFold(fs[i].Name, name) {
			return fs[i].Value, true
		}
	}
	return nil, false
}

// framing accumulates what the fields of one head say about its body and
// connection.
type framing struct {
	length      int64
	lengthRaw   []byte
	te          int    // Transfer-Encoding lines
	teLast      []byte // the last TE line's value
	hosts       int
	close, keep bool
	listed      bool
	expect      bool
}

// ParseRequest parses head (as ReadHead returned it) into r, keeping at
// most maxFields field lines; further lines are still checked.
func ParseRequest(head []byte, r *Request, maxFields int) error {
	line, rest := nextLine(head)
	if line == nil {
		return ErrRequestLine
	}
	sp1 := bytes.IndexByte(line, ' ')
	sp2 := bytes.LastIndexByte(line, ' ')
	if sp1 <= 0 || sp2 <= sp1+1 {
		return ErrRequestLine
	}
	method, target, version := line[:sp1], line[sp1+1:sp2], line[sp2+1:]
	if !isToken(method) || !validTarget(target) {
		return ErrRequestLine
	}
	minor, err := parseVersion(version)
	if err != nil {
		return err
	}
	r.Method, r.Target, r.Minor = method, target, minor
	var f framing
	r.Fields, r.Count = r.Fields[:0], 0
	for {
		line, rest = nextLine(rest)
		if line == nil {
			return ErrFieldLine
		}
		if len(line) == 0 {
			break
		}
		fl, err := parseField(line, &f)
		if err != nil {
			return err
		}
		if r.Count++; r.Count <= maxFields {
			r.Fields = append(r.Fields, fl)
		}
	}
	if len(rest) != 0 {
		return ErrFieldLine
	}
	if f.te > 0 {
		switch {
		case minor == 0:
			return ErrTE10
		case f.lengthRaw != nil:
			return ErrLengthAndTE
		case f.te > 1 || !EqualFold(f.teLast, "chunked"):
			return ErrTEUnsupported
		}
	}
	if f.hosts > 1 || (f.hosts == 0 && minor == 1 && string(method) != "CONNECT") {
		return ErrHost
	}
	r.ContentLength, r.Chunked = -1, f.te > 0
	if f.lengthRaw != nil {
		r.ContentLength = f.length
	}
	r.KeepAlive = !f.close && (minor == 1 || f.keep)
	// 100 Continue is never sent to an HTTP/1.0 client (RFC 9110 §10.1.1).
	r.ExpectContinue, r.Listed = f.expect && minor == 1, f.listed
	return nil
}

// Response is a parsed response head. Its slices point into the head.
type Response struct {
	Minor  int
	Status int
	// Reason is the reason phrase (may be empty).
	Reason []byte
	Fields []Field
	// ContentLength is -1 without one; a chunked or close-delimited body
	// has none.
	ContentLength int64
	Chunked       bool
	// TE is the Transfer-Encoding value, nil without one.
	TE []byte
	// KeepAlive: the server lets the connection carry another request.
	KeepAlive bool
	Listed    bool
}

// Get returns the value of the first field named name.
func (r *Response) Get(name string) ([]byte, bool) { return get(r.Fields, name) }

// ParseResponse parses a response head, refusing more than maxFields field
// lines.
func ParseResponse(head []byte, r *Response, maxFields int) error {
	line, rest := nextLine(head)
	if len(line) < len("HTTP/1.1 200") {
		return ErrStatusLine
	}
	minor, err := parseVersion(line[:8])
	if err != nil {
		if err == ErrRequestLine {
			err = ErrStatusLine
		}
		return err
	}
	if line[8] != ' ' {
		return ErrStatusLine
	}
	code := line[9:12]
	if code[0] < '1' || code[0] > '9' || !isDigit(code[1]) || !isDigit(code[2]) {
		return ErrStatusLine
	}
	r.Minor = minor
	r.Status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	r.Reason = nil
	switch {
	case len(line) == 12:
	case line[12] == ' ':
		r.Reason = line[13:]
		if !validValue(r.Reason) {
			return ErrStatusLine
		}
	default:
		return ErrStatusLine
	}
	var f framing
	r.Fields = r.Fields[:0]
	for {
		line, rest = nextLine(rest)
		if line == nil {
			return ErrFieldLine
		}
		if len(line) == 0 {
			break
		}
		fl, err := parseField(line, &f)
		if err != nil {
			return err
		}
		if len(r.Fields) == maxFields {
			return ErrTooManyFields
		}
		r.Fields = append(r.Fields, fl)
	}
	if len(rest) != 0 {
		return ErrFieldLine
	}
	r.ContentLength, r.Chunked, r.TE = -1, false, nil
	if f.te > 1 {
		return ErrTERepeated
	}
	if f.te > 0 {
		// RFC 9112 §6.3: chunked last means chunked framing, whatever
		// Content-Length says; any other coding is read until close.
		r.TE = f.teLast
		r.Chunked = lastToken(f.teLast, "chunked")
	} else if f.lengthRaw != nil {
		r.ContentLength = f.length
	}
	r.KeepAlive = !f.close && (minor == 1 || f.keep)
	r.Listed = f.listed
	return nil
}

// nextLine splits off one line without its CRLF (or bare LF); nil when b
// holds no complete line.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, b
	}
	line, rest = b[:i], b[i+1:]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, rest
}

func parseVersion(v []byte) (int, error) {
	if len(v) != 8 || string(v[:5]) != "HTTP/" || v[6] != '.' || !isDigit(v[5]) || !isDigit(v[7]) {
		return 0, ErrRequestLine
	}
	if v[5] != '1' {
		return 0, ErrVersion
	}
	if v[7] > '1' {
		return 0, ErrVersion
	}
	return int(v[7] - '0'), nil
}

// parseField splits a field line and records what it says about framing.
func parseField(line []byte, f *framing) (Field, error) {
	if line[0] == ' ' || line[0] == '\t' {
		return Field{}, ErrObsFold
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 || !isToken(line[:colon]) {
		return Field{}, ErrFieldLine
	}
	name, value := line[:colon], trimOWS(line[colon+1:])
	if !validValue(value) {
		if bytes.IndexByte(value, '\r') >= 0 {
			return Field{}, ErrBareCR
		}
		return Field{}, ErrFieldValue
	}
	switch len(name) {
	case len("Host"):
		if EqualFold(name, "host") {
			f.hosts++
		}
	case len("Expect"):
		if EqualFold(name, "expect") && EqualFold(value, "100-continue") {
			f.expect = true
		}
	case len("Connection"):
		if EqualFold(name, "connection") {
			connectionTokens(value, f)
		}
	case len("Content-Length"):
		if EqualFold(name, "content-length") {
			if f.lengthRaw != nil && !bytes.Equal(f.lengthRaw, value) {
				return Field{}, ErrLength
			}
			n, ok := parseLength(value)
			if !ok {
				return Field{}, ErrLength
			}
			f.length, f.lengthRaw = n, value
		}
	case len("Transfer-Encoding"):
		if EqualFold(name, "transfer-encoding") {
			f.te++
			f.teLast = value
		}
	}
	return Field{Name: name, Value: value}, nil
}

func connectionTokens(v []byte, f *framing) {
	for len(v) > 0 {
		var tok []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			tok, v = trimOWS(v[:i]), v[i+1:]
		} else {
			tok, v = trimOWS(v), nil
		}
		switch {
		case len(tok) == 0:
		case EqualFold(tok, "close"):
			f.close = true
		case EqualFold(tok, "keep-alive"):
			f.keep = true
		default:
			f.listed = true
		}
	}
}

// ListedBy reports whether name is one of the tokens of the Connection
// fields among fs (the fields a hop-by-hop filter must also drop).
func ListedBy(fs []Field, name []byte) bool {
	for i := range fs {
		if !EqualFold(fs[i].Name, "connection") {
			continue
		}
		v := fs[i].Value
		for len(v) > 0 {
			var tok []byte
			if j := bytes.IndexByte(v, ','); j >= 0 {
				tok, v = trimOWS(v[:j]), v[j+1:]
			} else {
				tok, v = trimOWS(v), nil
			}
			if len(tok) == len(name) && equalFoldBytes(tok, name) {
				return true
			}
		}
	}
	return false
}

// lastToken reports whether the last comma-separated token of v is tok.
func lastToken(v []byte, tok string) bool {
	if i := bytes.LastIndexByte(v, ','); i >= 0 {
		v = v[i+1:]
	}
	return EqualFold(trimOWS(v), tok)
}

// parseLength reads a Content-Length value: digits only, no sign, no
// list, no overflow.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if !isDigit(c) {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// tchar of RFC 9110 §5.6.2.
var tokenTable = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
		t[c-'a'+'A'] = true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenTable[c] {
			return false
		}
	}
	return true
}

// validValue: no control character but HTAB (RFC 9110 §5.5).
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget: visible ASCII only (no space, no control, no byte ≥ 0x80).
func validTarget(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// EqualFold compares b with s, ASCII case-insensitively.
func EqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := 0; i < len(b); i++ {
		if lower(b[i]) != lower(s[i]) {
			return false
		}
	}
	return true
}

func equalFoldBytes(a, b []byte) bool {
	for i := range a {
		if lower(a[i]) != lower(b[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
