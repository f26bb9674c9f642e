package ingress

import (
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"github.com/proxypool/proxypool/engine/gateway/internal/h1"
)

// parseHead parses a request head made of the request line and fields.
func parseHead(t testing.TB, line string, fields ...string) *h1.Request {
	t.Helper()
	head := line + "\r\n"
	for _, f := range fields {
		head += f + "\r\n"
	}
	var r h1.Request
	if err := h1.ParseRequest([]byte(head+"\r\n"), &r, 100); err != nil {
		t.Fatalf("parsing %q: %v", head, err)
	}
	return &r
}

// fieldNames parses a block of field lines into name → value.
func fieldNames(t testing.TB, block []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSuffix(string(block), "\r\n"), "\r\n") {
		name, value, ok := strings.Cut(line, ": ")
		if !ok {
			t.Fatalf("malformed line %q in %q", line, block)
		}
		if _, dup := got[name]; dup {
			t.Fatalf("%s twice in %q", name, block)
		}
		got[name] = value
	}
	return got
}

func TestOutboundHeaders(t *testing.T) {
	r := parseHead(t, "POST http://Example.COM/p HTTP/1.1",
		"Host: elsewhere.example",
		"Accept: */*",
		"Connection: keep-alive, X-Secret-Hop",
		"connection: x-other-hop",
		"X-Secret-Hop: 1",
		"X-Other-Hop: 1",
		"Proxy-Authorization: Basic Zm9vOmJhcg==",
		"Proxy-Connection: keep-alive",
		"Keep-Alive: timeout=5",
		"Te: trailers",
		"Trailer: X-T",
		"Upgrade: websocket",
		"Proxy-Authenticate: Basic",
		"X-Keep: yes",
		"X-Proxypool-Api-Key: k",
		"X-Session: s1",
		"Content-Length: 3",
		"Content-Length: 3",
	)
	got := fieldNames(t, appendOutbound(nil, r, []byte("example.com"), "X-Session"))
	want := map[string]string{"Host": "example.com", "Accept": "*/*", "X-Keep": "yes", "Content-Length": "3"}
	if len(got) != len(want) {
		t.Fatalf("kept %v", got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// A chunked body is announced once, as chunked; no length.
	r = parseHead(t, "POST http://a/ HTTP/1.1", "Host: a", "Transfer-Encoding: chunked")
	if got := fieldNames(t, appendOutbound(nil, r, []byte("a"), "")); got["Transfer-Encoding"] != "chunked" || len(got) != 2 {
		t.Fatalf("chunked request forwarded with %v", got)
	}
}

func TestResponseFields(t *testing.T) {
	head := "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: X-Hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n" +
		"Proxy-Authenticate: Basic\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nX-Keep: yes\r\n\r\n"
	var r h1.Response
	if err := h1.ParseResponse([]byte(head), &r, 100); err != nil {
		t.Fatal(err)
	}
	got := fieldNames(t, appendResponseFields(nil, &r, !r.Chunked))
	if len(got) != 2 || got["Content-Type"] != "text/plain" || got["X-Keep"] != "yes" {
		t.Fatalf("forwarded %v (chunked framing overrides the length)", got)
	}
}

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		in       string
		def      uint16
		host     string
		port     uint16
		wantFail bool
	}{
		{in: "Example.COM.:443", host: "example.com", port: 443},
		{in: "example.com", def: 80, host: "example.com", port: 80},
		{in: "example.com", wantFail: true},
		{in: "[::1]:8080", host: "::1", port: 8080},
		{in: "[::FFFF:127.0.0.1]:80", host: "::ffff:127.0.0.1", port: 80},
		{in: "[::1]", def: 80, host: "::1", port: 80},
		{in: "::1", def: 80, wantFail: true},
		{in: "[fe80::1%eth0]:80", wantFail: true},
		{in: "[[::1]]:443", wantFail: true},
		{in: "[::1]]:443", wantFail: true},
		{in: "example.com:", wantFail: true},
		{in: "example.com:0", wantFail: true},
		{in: "example.com:65536", wantFail: true},
		{in: "example.com:+80", wantFail: true},
		{in: "exa mple.com:80", wantFail: true},
		{in: "a..b:80", wantFail: true},
		{in: ":80", wantFail: true},
		{in: "", def: 80, wantFail: true},
		{in: strings.Repeat("a", 254) + ":80", wantFail: true},
		{in: "under_score.example:80", host: "under_score.example", port: 80},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			host, port, err := ParseAuthority(tc.in, tc.def)
			if tc.wantFail {
				if err == nil {
					t.Fatalf("accepted as %q %d", host, port)
				}
				return
			}
			if err != nil || host != tc.host || port != tc.port {
				t.Fatalf("got %q %d %v, want %q %d", host, port, err, tc.host, tc.port)
			}
		})
	}
}

func FuzzParseAuthority(f *testing.F) {
	for _, s := range []string{"example.com:443", "[::1]:80", "a.b.", "x:y:z", "[]:1", "%00:1", "0x7f.1:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		host, port, err := ParseAuthority(in, 80)
		if err != nil {
			return
		}
		if host == "" || port == 0 || strings.HasSuffix(host, ".") || host != strings.ToLower(host) {
			t.Fatalf("%q -> %q %d", in, host, port)
		}
		// The normalised form is a fixed point.
		h2, p2, err := ParseAuthority(joinAuthority(host, port), 0)
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("%q -> %q %d does not round-trip: %q %d %v", in, host, port, h2, p2, err)
		}
	})
}

func TestParseBasic(t *testing.T) {
	tests := []struct {
		h          string
		user, pass string
		ok         bool
	}{
		{"Basic YWxpY2U6czNjcmV0", "alice", "s3cret", true},
		{"basic YWxpY2U6czNjcmV0", "alice", "s3cret", true},
		{"Basic YWxpY2U6", "alice", "", true},
		{"Basic YWxpY2U6YTpi", "alice", "a:b", true},
		{"Basic OnBhc3M=", "", "", false}, // empty user
		{"Basic YWxpY2U=", "", "", false}, // no colon
		{"Basic !!!", "", "", false},
		{"Bearer abc", "", "", false},
		{"Basic", "", "", false},
		{"", "", "", false},
		{"Basic " + strings.Repeat("A", 2000), "", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.h, func(t *testing.T) {
			u, p, ok := ParseBasic(tc.h)
			if ok != tc.ok || u != tc.user || p != tc.pass {
				t.Fatalf("got %q %q %v", u, p, ok)
			}
		})
	}
}

func FuzzParseBasic(f *testing.F) {
	f.Add("Basic YWxpY2U6czNjcmV0")
	f.Add("basic Og==")
	f.Fuzz(func(t *testing.T, h string) {
		u, p, ok := ParseBasic(h)
		if !ok {
			return
		}
		if u == "" || strings.Contains(u, ":") {
			t.Fatalf("%q -> user %q", h, u)
		}
		// Differential oracle: net/http's own Basic parser on the same
		// credentials (it reads Authorization; the scheme is the same).
		r := &http.Request{Header: http.Header{"Authorization": {h}}}
		u2, p2, ok2 := r.BasicAuth()
		if ok2 && (u2 != u || p2 != p) {
			t.Fatalf("%q: ours %q/%q, net/http %q/%q", h, u, p, u2, p2)
		}
	})
}

func TestLimitListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := make(chan struct{}, 4)
	l := NewLimitListener(ln, 1, refuseEvents(refused))
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	c1, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	s1 := <-accepted
	if _, ok := rawConn(s1).(*net.TCPConn); !ok {
		t.Fatalf("raw conn is %T, want *net.TCPConn (splice)", rawConn(s1))
	}
	// Above the cap: refused with a 503 and closed.
	c2, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got, _ := io.ReadAll(c2)
	if !strings.HasPrefix(string(got), "HTTP/1.1 503") || !strings.Contains(string(got), "overload") {
		t.Fatalf("refused connection got %q", got)
	}
	<-refused
	// Closing the first frees the slot.
	s1.Close()
	s1.Close() // a second close must not free a second slot
	if n := l.Open(); n != 0 {
		t.Fatalf("open = %d after close", n)
	}
	c3, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	s3 := <-accepted
	s3.Close()
}

type refuseEvents chan struct{}

func (r refuseEvents) Accepted()      {}
func (r refuseEvents) Closed()        {}
func (r refuseEvents) Refused(string) { r <- struct{}{} }

func TestLimitListenerPerClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewLimitListener(ln, 100, nil)
	l.SetPerClient(2, nil)
	defer l.Close()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	dial()
	dial()
	s1, s2 := <-accepted, <-accepted
	third := dial()
	got, _ := io.ReadAll(third)
	if !strings.HasPrefix(string(got), "HTTP/1.1 429") || !strings.Contains(string(got), ReasonTooManyConns) {
		t.Fatalf("third connection from one address got %q", got)
	}
	s1.Close()
	dial()
	<-accepted
	s2.Close()
	// Exempt peers (trusted proxies) are only under the total cap.
	l.SetPerClient(1, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	dial()
	dial()
	<-accepted
	<-accepted
}

func TestCredentials(t *testing.T) {
	basic := func(up string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(up)) }
	tests := []struct {
		name    string
		header  http.Header
		user    string
		pass    string
		apiKey  string
		bearer  string
		session string
	}{
		{"none", http.Header{}, "", "", "", "", ""},
		{"basic", http.Header{"Proxy-Authorization": {basic("alice:pw")}}, "alice", "pw", "pw", "pw", ""},
		{"session convention", http.Header{"Proxy-Authorization": {basic("alice-session-42:pw")}}, "alice", "pw", "pw", "pw", "42"},
		{"last marker wins", http.Header{"Proxy-Authorization": {basic("a-session-b-session-c:pw")}}, "a-session-b", "pw", "pw", "pw", "c"},
		{"empty session is a plain name", http.Header{"Proxy-Authorization": {basic("alice-session-:pw")}}, "alice-session-", "pw", "pw", "pw", ""},
		{"bearer", http.Header{"Proxy-Authorization": {"Bearer tok"}}, "", "", "", "tok", ""},
		{"api key header", http.Header{APIKeyHeader: {"k1"}}, "", "", "k1", "", ""},
		{"api key header beats basic password", http.Header{APIKeyHeader: {"k1"}, "Proxy-Authorization": {basic("u:pw")}}, "u", "pw", "k1", "pw", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &h1.Request{}
			for k, vv := range tc.header {
				for _, v := range vv {
					r.Fields = append(r.Fields, h1.Field{Name: []byte(k), Value: []byte(v)})
				}
			}
			c, session := credentials(r, netip.MustParseAddr("192.0.2.1"))
			if c.Username != tc.user || c.Password != tc.pass || c.APIKey != tc.apiKey || c.Bearer != tc.bearer || session != tc.session {
				t.Fatalf("got %+v session %q", c, session)
			}
		})
	}
}

// stepReader returns at most step bytes per Read.
type stepReader struct {
	data []byte
	step int
}

func (s *stepReader) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), s.step)], s.data)
	s.data = s.data[n:]
	return n, nil
}

// verdict reads stream as a client connection is read — heads parsed in
// place, bodies consumed by their framing — and returns the 1-based index
// of the first request refused, 0 when none is (a CONNECT ends the
// requests: tunnel bytes follow).
func verdict(stream string, step int) int64 {
	var br h1.Reader
	br.Reset(&stepReader{data: []byte(stream), step: step})
	defer br.Release()
	var req h1.Request
	var body h1.Body
	for i := int64(1); ; i++ {
		head, err := br.ReadHead(64<<10, true)
		if err != nil {
			return 0 // the stream ended
		}
		if err := h1.ParseRequest(head, &req, 100); err != nil {
			return i
		}
		if string(req.Method) == "CONNECT" {
			return 0
		}
		if req.Chunked {
			body.ResetChunked(&br, false)
		} else {
			body.ResetLength(&br, req.ContentLength)
		}
		if _, err := io.Copy(io.Discard, &body); err != nil {
			if errors.Is(err, h1.ErrBadChunk) {
				return i
			}
			return 0
		}
	}
}

func TestRequestFraming(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		// bad is the 1-based request index first refused, 0 for none.
		bad int64
	}{
		{"clean pipeline", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nGET http://a/2 HTTP/1.1\r\nHost: a\r\n\r\n", 0},
		{"obs-fold", "GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: one\r\n two\r\n\r\n", 1},
		{"obs-fold tab", "GET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: one\r\n\ttwo\r\n\r\n", 1},
		{"fold in second request", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n 2\r\n\r\n", 2},
		{"te and cl", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1},
		{"body with fold-like bytes skipped", "POST http://a/ HTTP/1.1\r\nHost: a\r\nContent-Length: 6\r\n\r\n\r\n x\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 0},
		{"chunked body skipped", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n4;ext=1\r\n\r\n x\r\n0\r\nTrailer: t\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n", 0},
		{"fold after chunked body", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", 2},
		{"connect stops reading", "CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n\r\n tunnel bytes", 0},
		{"leading empty lines", "\r\n\r\nGET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 0},
		{"bad chunk size", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nx\r\n0\r\n\r\n", 1},
		{"bare LF in chunk framing", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\nx\r\n0\r\n\r\n", 1},
		{"chunk data longer than its size", "POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n0\r\n\r\n", 1},
		{"bad chunk in second request", "GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\nPOST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", 2},
		{"Transfer-Encoding in HTTP/1.0", "POST http://a/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 1},
		{"space before colon", "GET http://a/ HTTP/1.1\r\nHost : a\r\n\r\n", 1},
		{"two Host headers", "GET http://a/ HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 1},
		{"bare CR in a value", "GET http://a/ HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n", 1},
		{"HTTP/1.0 without Host", "GET http://a/ HTTP/1.0\r\n\r\n", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Byte by byte and all at once must agree.
			for _, step := range []int{1, 7, len(tc.stream)} {
				if got := verdict(tc.stream, step); got != tc.bad {
					t.Fatalf("step %d: bad = %d, want %d", step, got, tc.bad)
				}
			}
		})
	}
}

// FuzzRequestFraming: the verdict must not depend on how reads split the
// stream, and reading must never panic.
func FuzzRequestFraming(f *testing.F) {
	f.Add("GET http://a/ HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n", 3)
	f.Add("POST http://a/ HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", 5)
	f.Add("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nxxGET / HTTP/1.1\r\n\r\n", 1)
	f.Fuzz(func(t *testing.T, stream string, step int) {
		if step <= 0 || step > 64 {
			step = 1
		}
		if whole, split := verdict(stream, len(stream)+1), verdict(stream, step); whole != split {
			t.Fatalf("verdict depends on read boundaries: %d vs %d", whole, split)
		}
	})
}
