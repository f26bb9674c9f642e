package h1

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"testing"
)

// chunks returns at most n bytes per Read.
type chunks struct {
	data []byte
	n    int
}

func (c *chunks) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(len(p), c.n)], c.data)
	c.data = c.data[k:]
	return k, nil
}

func TestReadHead(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		limit int
		head  string
		err   error
	}{
		{"crlf", "GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", 100, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", nil},
		{"bare lf", "GET / HTTP/1.1\nHost: a\n\nrest", 100, "GET / HTTP/1.1\nHost: a\n\n", nil},
		{"leading empty lines skipped", "\r\n\r\nGET / HTTP/1.1\r\n\r\n", 100, "GET / HTTP/1.1\r\n\r\n", nil},
		{"exactly at the limit", "GET / HTTP/1.1\r\n\r\n", 18, "GET / HTTP/1.1\r\n\r\n", nil},
		{"one past the limit", "GET / HTTP/1.1\r\n\r\n", 17, "", ErrHeadTooLarge},
		{"never ends", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 10000), 8 << 10, "", ErrHeadTooLarge},
		{"larger than the pooled buffer", "GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 6000) + "\r\n\r\n", 8 << 10,
			"GET / HTTP/1.1\r\nX: " + strings.Repeat("a", 6000) + "\r\n\r\n", nil},
		{"clean end", "", 100, "", io.EOF},
		{"end inside a head", "GET / HTTP/1.1\r\n", 100, "", io.ErrUnexpectedEOF},
	}
	for _, tc := range tests {
		for _, step := range []int{1, 3, 4096} {
			t.Run(tc.name+"/"+strconv.Itoa(step), func(t *testing.T) {
				var r Reader
				r.Reset(&chunks{data: []byte(tc.in), n: step})
				defer r.Release()
				head, err := r.ReadHead(tc.limit, true)
				if !errors.Is(err, tc.err) || string(head) != tc.head {
					t.Fatalf("got %q %v, want %q %v", head, err, tc.head, tc.err)
				}
				if err == nil {
					rest, _ := io.ReadAll(&r)
					if want := strings.TrimPrefix(tc.in, "\r\n\r\n")[len(tc.head):]; string(rest) != want {
						t.Fatalf("rest %q, want %q", rest, want)
					}
				}
			})
		}
	}
}

func TestParseRequest(t *testing.T) {
	var r Request
	head := "POST http://a/x?y HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close, X-Hop\r\nExpect: 100-continue\r\nX-A:  v  \r\n\r\n"
	if err := ParseRequest([]byte(head), &r, 10); err != nil {
		t.Fatal(err)
	}
	if string(r.Method) != "POST" || string(r.Target) != "http://a/x?y" || r.Minor != 1 || r.ContentLength != 5 ||
		r.Chunked || r.KeepAlive || !r.ExpectContinue || !r.Listed || r.Count != 5 {
		t.Fatalf("parsed %+v", r)
	}
	var r10 Request
	if err := ParseRequest([]byte("POST http://a/ HTTP/1.0\r\nContent-Length: 1\r\nExpect: 100-continue\r\n\r\n"), &r10, 10); err != nil {
		t.Fatal(err)
	}
	if r10.ExpectContinue {
		t.Fatal("an HTTP/1.0 client must never be sent 100 Continue")
	}
	if v, ok := r.Get("x-a"); !ok || string(v) != "v" {
		t.Fatalf("X-A = %q %v", v, ok)
	}
	if !ListedBy(r.Fields, []byte("x-hop")) || ListedBy(r.Fields, []byte("x-a")) {
		t.Fatal("Connection tokens misread")
	}
	for _, tc := range []struct {
		head string
		keep bool
	}{
		{"GET http://a/ HTTP/1.0\r\n\r\n", false},
		{"GET http://a/ HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", true},
		{"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", true},
	} {
		if err := ParseRequest([]byte(tc.head), &r, 10); err != nil || r.KeepAlive != tc.keep {
			t.Fatalf("%q: keep-alive %v %v", tc.head, r.KeepAlive, err)
		}
	}
	for head, want := range map[string]*Error{
		"GET http://a/ HTTP/2.0\r\n\r\n":                                                        ErrVersion,
		"GET  http://a/ HTTP/1.1\r\nHost: a\r\n\r\n":                                            ErrRequestLine,
		"GET http://a/\x01 HTTP/1.1\r\nHost: a\r\n\r\n":                                         ErrRequestLine,
		"G@T http://a/ HTTP/1.1\r\nHost: a\r\n\r\n":                                             ErrRequestLine,
		"GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: 1\x00\r\n\r\n":                               ErrFieldValue,
		"GET http://a/ HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n":                                  ErrFieldLine,
		"GET http://a/ HTTP/1.1\r\nHost: a\r\n: empty name\r\n\r\n":                             ErrFieldLine,
		"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 1 \r\nContent-Length: 2\r\n\r\n": ErrLength,
		"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n":     ErrTEUnsupported,
	} {
		if err := ParseRequest([]byte(head), &r, 10); err != want {
			t.Errorf("%q: %v, want %v", head, err, want)
		}
	}
	// More fields than kept: all are checked and counted.
	if err := ParseRequest([]byte("GET http://a/ HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\n\r\n"), &r, 2); err != nil || r.Count != 3 || len(r.Fields) != 2 {
		t.Fatalf("count %d kept %d %v", r.Count, len(r.Fields), err)
	}
}

func TestParseResponse(t *testing.T) {
	var r Response
	for _, tc := range []struct {
		head    string
		status  int
		length  int64
		chunked bool
		keep    bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", 200, 3, false, true},
		{"HTTP/1.1 204\r\n\r\n", 204, -1, false, true},
		{"HTTP/1.0 200 OK\r\n\r\n", 200, -1, false, false},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 9\r\n\r\n", 200, -1, true, true},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 200, -1, false, true},
		{"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", 200, 0, false, false},
	} {
		if err := ParseResponse([]byte(tc.head), &r, 10); err != nil || r.Status != tc.status || r.ContentLength != tc.length ||
			r.Chunked != tc.chunked || r.KeepAlive != tc.keep {
			t.Errorf("%q: %+v %v", tc.head, r, err)
		}
	}
	for _, head := range []string{"HTTP/1.1 20 OK\r\n\r\n", "HTTP/1.1 200OK\r\n\r\n", "ICY 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "HTTP/1.1 200 OK\r\n X: folded\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"} {
		if err := ParseResponse([]byte(head), &r, 10); err == nil {
			t.Errorf("%q accepted", head)
		}
	}
	if err := ParseResponse([]byte("HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\n\r\n"), &r, 1); err != ErrTooManyFields {
		t.Fatalf("field bound: %v", err)
	}
}

// readBody reads a whole body of the framing given from in, split in
// reads of step bytes.
func readBody(in string, step int, chunked, decode bool) (string, string, error) {
	var r Reader
	r.Reset(&chunks{data: []byte(in), n: step})
	defer r.Release()
	var b Body
	if chunked {
		b.ResetChunked(&r, decode)
	} else {
		b.ResetUntilClose(&r)
	}
	out, err := io.ReadAll(&b)
	rest, _ := io.ReadAll(&r)
	return string(out), string(rest), err
}

func TestChunkedBody(t *testing.T) {
	body := "4;ext=\"v\"\r\nWiki\r\n5 \r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nTrailer: t\r\n\r\n"
	for _, step := range []int{1, 2, 1000} {
		got, rest, err := readBody(body+"NEXT", step, true, false)
		if err != nil || got != body || rest != "NEXT" {
			t.Fatalf("verbatim step %d: %q rest %q %v", step, got, rest, err)
		}
		got, rest, err = readBody(body+"NEXT", step, true, true)
		if err != nil || got != "Wikipedia in\r\n\r\nchunks." || rest != "NEXT" {
			t.Fatalf("decoded step %d: %q rest %q %v", step, got, rest, err)
		}
	}
	for _, bad := range []string{"x\r\n", "1\nx\r\n0\r\n\r\n", "1\r\nxy\r\n", "\r\n", ";ext\r\n", "1\r\nx\r\n0\r\n\r\r\n",
		"10000000000000000\r\n", "0\r\n X: fold\r\n\r\n", "1;\x01\r\nx\r\n0\r\n\r\n",
		// Trailer lines are field lines: a token, then a colon.
		"0\r\nNo-Colon\r\n\r\n", "0\r\nBad Name: x\r\n\r\n", "0\r\nName : x\r\n\r\n",
		"0\r\n: x\r\n\r\n", "0\r\nN\x01me: x\r\n\r\n", "0\r\n(x): y\r\n\r\n"} {
		if _, _, err := readBody(bad, 3, true, false); !errors.Is(err, ErrBadChunk) {
			t.Errorf("%q: %v, want ErrBadChunk", bad, err)
		}
	}
	for _, good := range []string{"0\r\nX-Sum:abc\r\n\r\n", "0\r\nA: 1\r\nb-2: \r\n\r\n", "0\r\n!#$%&'*+-.^_`|~: v\r\n\r\n"} {
		if got, _, err := readBody(good, 2, true, false); err != nil || got != good {
			t.Errorf("%q: %q, %v", good, got, err)
		}
	}
	if _, _, err := readBody("5\r\nab", 3, true, false); !errors.Is(err, ErrTruncated) {
		t.Errorf("truncated: %v", err)
	}
}

// FuzzParseRequest checks the request-head parser against net/http's:
// whenever both accept a head they must agree on method, target and — the
// request smuggling question — on how the body is framed.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n",
		"POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
		"GET http://a/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
		"CONNECT a:443 HTTP/1.1\r\n\r\n",
		"GET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, head string) {
		var r Request
		err := ParseRequest([]byte(head), &r, 64)
		if err != nil {
			return
		}
		if !isToken(r.Method) || r.Count < len(r.Fields) || (r.Chunked && r.ContentLength >= 0) || r.ContentLength < -1 {
			t.Fatalf("%q parsed inconsistently: %+v", head, r)
		}
		hr, herr := http.ReadRequest(bufio.NewReader(strings.NewReader(head)))
		if herr != nil {
			return // net/http is stricter here (URL syntax, Host value)
		}
		if hr.Method != string(r.Method) || hr.RequestURI != string(r.Target) {
			t.Fatalf("%q: net/http %s %s, ours %s %s", head, hr.Method, hr.RequestURI, r.Method, r.Target)
		}
		chunked := len(hr.TransferEncoding) > 0
		if r.Method != nil && string(r.Method) != "CONNECT" && (chunked != r.Chunked || (!chunked && hr.ContentLength != max(r.ContentLength, 0))) {
			t.Fatalf("%q: framing differs: net/http chunked=%v length=%d, ours chunked=%v length=%d",
				head, chunked, hr.ContentLength, r.Chunked, r.ContentLength)
		}
		if hr.Close == r.KeepAlive {
			t.Fatalf("%q: net/http close=%v, ours keep-alive=%v", head, hr.Close, r.KeepAlive)
		}
	})
}

// FuzzParseResponse checks the response-head parser against net/http's
// on the body framing of every head both accept.
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 4\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, head string) {
		var r Response
		if err := ParseResponse([]byte(head), &r, 64); err != nil {
			return
		}
		if r.Status < 100 || r.Status > 999 || (r.Chunked && r.ContentLength >= 0) || r.ContentLength < -1 {
			t.Fatalf("%q parsed inconsistently: %+v", head, r)
		}
		if r.Status < 200 || r.Status == 204 || r.Status == 304 {
			return // no body whatever the fields say (the transport's rule)
		}
		hr, err := http.ReadResponse(bufio.NewReader(strings.NewReader(head)), &http.Request{Method: http.MethodGet})
		if err != nil || hr.StatusCode != r.Status {
			return // net/http refuses more (or less) here
		}
		chunked := len(hr.TransferEncoding) > 0 && hr.TransferEncoding[len(hr.TransferEncoding)-1] == "chunked"
		if chunked != r.Chunked {
			t.Fatalf("%q: net/http chunked=%v, ours %v", head, chunked, r.Chunked)
		}
		if !chunked && r.ContentLength >= 0 && hr.ContentLength != r.ContentLength {
			t.Fatalf("%q: net/http length %d, ours %d", head, hr.ContentLength, r.ContentLength)
		}
	})
}

// FuzzChunkedBody: decoding agrees with net/http's chunked reader, the
// verbatim form is exactly the bytes of the body, and read boundaries do
// not matter.
func FuzzChunkedBody(f *testing.F) {
	f.Add("4\r\nWiki\r\n0\r\n\r\n", 1)
	f.Add("3;a=b\r\nabc\r\n0\r\nX: y\r\n\r\nrest", 2)
	f.Fuzz(func(t *testing.T, in string, step int) {
		if step <= 0 || step > 32 {
			step = 1
		}
		raw, rest, err := readBody(in, step, true, false)
		if err != nil {
			return
		}
		if raw+rest != in {
			t.Fatalf("%q: verbatim %q + rest %q", in, raw, rest)
		}
		if whole, _, werr := readBody(in, len(in)+1, true, false); werr != nil || whole != raw {
			t.Fatalf("%q: read boundaries matter: %q vs %q (%v)", in, whole, raw, werr)
		}
		dec, _, err := readBody(in, step, true, true)
		if err != nil {
			t.Fatalf("%q: verbatim read but decode failed: %v", in, err)
		}
		want, herr := io.ReadAll(httputil.NewChunkedReader(strings.NewReader(raw)))
		if herr == nil && !bytes.Equal(want, []byte(dec)) {
			t.Fatalf("%q: decoded %q, net/http %q", in, dec, want)
		}
	})
}
