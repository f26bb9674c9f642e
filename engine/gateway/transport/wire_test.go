package transport_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/transport"
)

// wireProxy is a scripted upstream proxy: it reads request heads in a
// loop and writes reply(head) for each (the head includes the request
// line); it closes the connection after a reply when closeAfter is set,
// and counts connections and heads.
type wireProxy struct {
	target              *snapshot.Target
	conns, reqs, closed atomic.Int64
	heads               chan string
}

func newWireProxy(t *testing.T, closeAfter bool, reply func(head string, br *bufio.Reader) string) *wireProxy {
	t.Helper()
	w := &wireProxy{heads: make(chan string, 64)}
	host, port := gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		defer func() { c.Close(); w.closed.Add(1) }()
		w.conns.Add(1)
		br := bufio.NewReader(c)
		for {
			var head strings.Builder
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					return
				}
				head.WriteString(line)
				if line == "\r\n" {
					break
				}
			}
			w.reqs.Add(1)
			select {
			case w.heads <- head.String():
			default:
			}
			if _, err := io.WriteString(c, reply(head.String(), br)); err != nil || closeAfter {
				return
			}
		}
	}))
	w.target = target(t, gwtest.MakeProxy("u", host, port, "", "", time.Now()))
	return w
}

func fixed(reply string) func(string, *bufio.Reader) string {
	return func(string, *bufio.Reader) string { return reply }
}

func request(method string, body io.Reader, header string) *transport.Request {
	return &transport.Request{Method: method, Authority: []byte("example.com"), URI: []byte("/"),
		Header: []byte("Host: example.com\r\n" + header), Body: body,
		Idempotent: body == nil && (method == "GET" || method == "HEAD")}
}

// exchange sends req through p and returns the response's status and
// whole body (the response is closed).
func exchange(tr *transport.Transport, p *wireProxy, req *transport.Request) (*transport.Response, string, error) {
	resp := &transport.Response{}
	if err := tr.RoundTrip(context.Background(), req, p.target, resp); err != nil {
		return nil, "", err
	}
	b, err := io.ReadAll(&resp.Body)
	resp.Close()
	return resp, string(b), err
}

func TestResponseFraming(t *testing.T) {
	chunked := "4;x=y\r\nWiki\r\n5\r\npedia\r\n0\r\nT: v\r\n\r\n"
	tests := []struct {
		name   string
		method string
		decode bool
		reply  string
		body   string
		kept   bool // the connection went back to the idle pool
	}{
		{"content length", "GET", false, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", true},
		{"chunked passed through verbatim", "GET", false, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, chunked, true},
		{"chunked decoded", "GET", true, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked, "Wikipedia", true},
		{"HEAD has no body", "HEAD", false, "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n", "", true},
		{"204", "GET", false, "HTTP/1.1 204 No Content\r\n\r\n", "", true},
		{"304 with a length", "GET", false, "HTTP/1.1 304 Not Modified\r\nContent-Length: 50\r\n\r\n", "", true},
		{"interim responses skipped", "GET", false, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx", "x", true},
		{"upstream says close", "GET", false, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nx", "x", false},
		{"HTTP/1.0 upstream", "GET", false, "HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", "x", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newWireProxy(t, false, fixed(tc.reply))
			tr := transport.New(transport.Options{})
			defer tr.Close()
			req := request(tc.method, nil, "")
			req.Decode = tc.decode
			_, body, err := exchange(tr, p, req)
			if err != nil || body != tc.body {
				t.Fatalf("body %q %v, want %q", body, err, tc.body)
			}
			if kept := tr.IdleConns() == 1; kept != tc.kept {
				t.Fatalf("connection kept = %v, want %v", kept, tc.kept)
			}
		})
	}
	t.Run("close delimited", func(t *testing.T) {
		p := newWireProxy(t, true, fixed("HTTP/1.1 200 OK\r\n\r\nuntil the end"))
		tr := transport.New(transport.Options{})
		defer tr.Close()
		if _, body, err := exchange(tr, p, request("GET", nil, "")); err != nil || body != "until the end" {
			t.Fatalf("body %q %v", body, err)
		}
		if tr.IdleConns() != 0 {
			t.Fatal("a close-delimited connection was kept")
		}
	})
	t.Run("truncated length", func(t *testing.T) {
		p := newWireProxy(t, true, fixed("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"))
		tr := transport.New(transport.Options{})
		defer tr.Close()
		if _, _, err := exchange(tr, p, request("GET", nil, "")); err == nil {
			t.Fatal("a short body read as complete")
		}
	})
}

func TestResponseHeadFailures(t *testing.T) {
	tests := []struct {
		name  string
		reply string
	}{
		{"oversized head", "HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("a", 128<<10) + "\r\n\r\n"},
		{"unasked protocol switch", "HTTP/1.1 101 Switching Protocols\r\n\r\n"},
		{"not HTTP", "SSH-2.0-OpenSSH\r\n\r\n"},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nxx"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newWireProxy(t, false, fixed(tc.reply))
			tr := transport.New(transport.Options{})
			defer tr.Close()
			_, _, err := exchange(tr, p, request("GET", nil, ""))
			if transport.PhaseOf(err) != worker.PhaseResponseHeaders {
				t.Fatalf("err = %v, want phase response_headers", err)
			}
		})
	}
}

func TestIdlePoolBounds(t *testing.T) {
	p := newWireProxy(t, false, fixed("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	tr := transport.New(transport.Options{MaxIdleConnsPerProxy: 2})
	defer tr.Close()
	// Three responses held at once need three connections.
	var held []*transport.Response
	for range 3 {
		resp := &transport.Response{}
		if err := tr.RoundTrip(context.Background(), request("GET", nil, ""), p.target, resp); err != nil {
			t.Fatal(err)
		}
		held = append(held, resp)
	}
	for _, resp := range held {
		_, _ = io.ReadAll(&resp.Body)
		resp.Close()
	}
	if n := tr.IdleConns(); n != 2 {
		t.Fatalf("%d idle connections kept, want the bound 2", n)
	}
	// The kept ones are reused: no new connection for two more requests.
	for range 2 {
		if _, _, err := exchange(tr, p, request("GET", nil, "")); err != nil {
			t.Fatal(err)
		}
	}
	if n := p.conns.Load(); n != 3 {
		t.Fatalf("%d connections opened, want 3", n)
	}
	tr.CloseIdleConnections()
	if n := tr.IdleConns(); n != 0 {
		t.Fatalf("%d idle after CloseIdleConnections", n)
	}
}

// An upstream that closes a kept-alive connection while it is idle: the
// next request must not fail because of it.
func TestStalePooledConnection(t *testing.T) {
	reply := func(head string, br *bufio.Reader) string {
		if strings.HasPrefix(head, "POST") {
			_, _ = io.CopyN(io.Discard, br, 4)
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	}
	t.Run("idempotent request sent again on a fresh connection", func(t *testing.T) {
		defer transport.SetStaleProbeAfter(time.Hour)() // no probe: the request meets the closed connection
		p := newWireProxy(t, true, reply)
		tr := transport.New(transport.Options{})
		defer tr.Close()
		for i := range 3 {
			if _, body, err := exchange(tr, p, request("GET", nil, "")); err != nil || body != "ok" {
				t.Fatalf("request %d: %q %v", i, body, err)
			}
		}
		if n := p.reqs.Load(); n != 3 {
			t.Fatalf("upstream answered %d requests for 3", n)
		}
	})
	t.Run("a request with a body is never replayed", func(t *testing.T) {
		defer transport.SetStaleProbeAfter(time.Hour)()
		p := newWireProxy(t, true, reply)
		tr := transport.New(transport.Options{})
		defer tr.Close()
		if _, _, err := exchange(tr, p, request("GET", nil, "")); err != nil {
			t.Fatal(err)
		}
		gwtest.Eventually(t, "upstream closed the idle connection", func() bool { return p.closed.Load() == 1 })
		_, _, err := exchange(tr, p, request("POST", strings.NewReader("body"), "Content-Length: 4\r\n"))
		if transport.PhaseOf(err) != worker.PhaseResponseHeaders {
			t.Fatalf("POST into a closed connection: %v", err)
		}
		if n := p.conns.Load(); n != 1 {
			t.Fatalf("the POST was sent again on a new connection (%d connections)", n)
		}
	})
	t.Run("probed before use after idling", func(t *testing.T) {
		defer transport.SetStaleProbeAfter(0)()
		p := newWireProxy(t, true, reply)
		tr := transport.New(transport.Options{})
		defer tr.Close()
		if _, _, err := exchange(tr, p, request("GET", nil, "")); err != nil {
			t.Fatal(err)
		}
		// Over loopback the close has reached us once the upstream's Close
		// returned.
		gwtest.Eventually(t, "upstream closed the idle connection", func() bool { return p.closed.Load() == 1 })
		if _, body, err := exchange(tr, p, request("POST", strings.NewReader("body"), "Content-Length: 4\r\n")); err != nil || body != "ok" {
			t.Fatalf("POST after the probe: %q %v", body, err)
		}
	})
}

func TestExpectContinue(t *testing.T) {
	var continued atomic.Int64
	t.Run("100 then body then final", func(t *testing.T) {
		got := make(chan string, 1)
		host, port := gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
			defer c.Close()
			br := bufio.NewReader(c)
			for {
				line, err := br.ReadString('\n')
				if err != nil || line == "\r\n" {
					break
				}
			}
			_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
			b := make([]byte, 4)
			_, _ = io.ReadFull(br, b)
			got <- string(b)
			_, _ = io.WriteString(c, "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
		}))
		tr := transport.New(transport.Options{})
		defer tr.Close()
		req := request("POST", strings.NewReader("body"), "Content-Length: 4\r\nExpect: 100-continue\r\n")
		req.Continue = func() error { continued.Add(1); return nil }
		resp := &transport.Response{}
		if err := tr.RoundTrip(context.Background(), req, target(t, gwtest.MakeProxy("u", host, port, "", "", time.Now())), resp); err != nil {
			t.Fatal(err)
		}
		resp.Close()
		if resp.Status != 201 || resp.BodyUnsent || continued.Load() != 1 || <-got != "body" {
			t.Fatalf("status %d unsent %v continued %d", resp.Status, resp.BodyUnsent, continued.Load())
		}
	})
	t.Run("final answer before the body", func(t *testing.T) {
		p := newWireProxy(t, false, fixed("HTTP/1.1 417 Expectation Failed\r\nContent-Length: 0\r\n\r\n"))
		tr := transport.New(transport.Options{})
		defer tr.Close()
		continued.Store(0)
		body := strings.NewReader("body")
		req := request("POST", body, "Content-Length: 4\r\nExpect: 100-continue\r\n")
		req.Continue = func() error { continued.Add(1); return nil }
		resp, _, err := exchange(tr, p, req)
		if err != nil || resp.Status != 417 || !resp.BodyUnsent || continued.Load() != 0 || body.Len() != 4 {
			t.Fatalf("status %v unsent %v continued %d unread %d %v", resp, resp != nil && resp.BodyUnsent, continued.Load(), body.Len(), err)
		}
		if tr.IdleConns() != 0 {
			t.Fatal("a connection whose request was left incomplete was kept")
		}
	})
}

func TestClientBodyFailure(t *testing.T) {
	// The upstream answers once it has the part of the body that exists:
	// the body breaks while the answer is on its way, and that stays the
	// client's failure. (An answer before any body byte went out would
	// be an early answer, relayed.)
	p := newWireProxy(t, false, func(_ string, br *bufio.Reader) string {
		_, _ = io.CopyN(io.Discard, br, 2)
		return "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
	})
	tr := transport.New(transport.Options{})
	defer tr.Close()
	broken := io.MultiReader(strings.NewReader("ab"), errReader{})
	_, _, err := exchange(tr, p, request("POST", broken, "Content-Length: 4\r\n"))
	var be *transport.BodyError
	if !errors.As(err, &be) || transport.PhaseOf(err) != worker.PhaseNone {
		t.Fatalf("err = %v, want a BodyError blaming no proxy", err)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }
