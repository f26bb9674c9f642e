package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// These tests speak raw HTTP/1 to the gateway's own client side and to a
// scripted upstream proxy, to pin what the forwarding path does on the
// wire.

// scripted is an upstream proxy that answers every request head with
// reply(head, br), keeping the connection unless closeAfter; it counts
// connections and records every head it reads.
type scripted struct {
	conns atomic.Int64
	heads chan string
}

func scriptedUpstream(t *testing.T, h *harness, closeAfter bool, reply func(head string, br *bufio.Reader) string) *scripted {
	t.Helper()
	s := &scripted{heads: make(chan string, 64)}
	host, port := gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		defer c.Close()
		s.conns.Add(1)
		br := bufio.NewReader(c)
		for {
			head, err := readHead(br)
			if err != nil {
				return
			}
			s.heads <- head
			if _, err := io.WriteString(c, reply(head, br)); err != nil || closeAfter {
				return
			}
		}
	}))
	ws := gwtest.Snapshot(1, time.Now(), gwtest.MakeProxy("vendor", host, port, "", "", time.Now()))
	h.apply(t, ws)
	return s
}

func readHead(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", err
		}
		b.WriteString(line)
		if line == "\r\n" {
			return b.String(), nil
		}
	}
}

func always(reply string) func(string, *bufio.Reader) string {
	return func(string, *bufio.Reader) string { return reply }
}

// dial opens a raw client connection to the gateway.
func (h *harness) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return c, bufio.NewReader(c)
}

// readAll reads one response (whole body) for method from br.
func readAll(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("body: %v", err)
	}
	return resp, string(b)
}

// closedByGateway reports whether the gateway closed c (EOF, nothing more).
func closedByGateway(br *bufio.Reader) bool {
	_, err := br.ReadByte()
	return err == io.EOF
}

func TestPipelinedRequests(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 2, upUser, upPass)...))
	c, br := h.dial(t)
	var reqs strings.Builder
	for i := range 3 {
		fmt.Fprintf(&reqs, "GET %s/p%d HTTP/1.1\r\nHost: x\r\n\r\n", tg.URL(), i)
	}
	if _, err := io.WriteString(c, reqs.String()); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		resp, body := readAll(t, br, "GET")
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("response %d: %d close=%v", i, resp.StatusCode, resp.Close)
		}
		if rec := received(t, body); rec.Path != fmt.Sprintf("/p%d", i) {
			t.Fatalf("response %d answers %s: out of order", i, rec.Path)
		}
	}
	h.idle(t)
}

func TestHTTP10Clients(t *testing.T) {
	h := start(t, "")
	chunked := "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n"
	sized := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	up := scriptedUpstream(t, h, false, func(head string, _ *bufio.Reader) string {
		if strings.Contains(head, "/chunked") {
			return chunked
		}
		return sized
	})
	t.Run("closed after the response by default", func(t *testing.T) {
		c, br := h.dial(t)
		io.WriteString(c, "GET http://127.0.0.1:9/a HTTP/1.0\r\n\r\n")
		resp, body := readAll(t, br, "GET")
		if resp.ProtoMinor != 0 || body != "ok" || !closedByGateway(br) {
			t.Fatalf("HTTP/%d.%d %q", resp.ProtoMajor, resp.ProtoMinor, body)
		}
		// Upstream it went as HTTP/1.1 with a Host header.
		if head := <-up.heads; !strings.HasPrefix(head, "GET http://127.0.0.1:9/a HTTP/1.1\r\n") || !strings.Contains(head, "Host: 127.0.0.1:9\r\n") {
			t.Fatalf("upstream head %q", head)
		}
	})
	t.Run("kept alive when asked", func(t *testing.T) {
		c, br := h.dial(t)
		for range 2 {
			io.WriteString(c, "GET http://127.0.0.1:9/a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
			resp, body := readAll(t, br, "GET")
			if body != "ok" || resp.Header.Get("Connection") != "keep-alive" {
				t.Fatalf("%q Connection %q", body, resp.Header.Get("Connection"))
			}
			<-up.heads
		}
	})
	t.Run("chunked response decoded", func(t *testing.T) {
		c, br := h.dial(t)
		io.WriteString(c, "GET http://127.0.0.1:9/chunked HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
		resp, body := readAll(t, br, "GET")
		if body != "Wikipedia" || len(resp.TransferEncoding) != 0 || !closedByGateway(br) {
			t.Fatalf("%q te %v", body, resp.TransferEncoding)
		}
		<-up.heads
	})
}

func TestConnectionClose(t *testing.T) {
	h := start(t, "")
	t.Run("asked by the client", func(t *testing.T) {
		scriptedUpstream(t, h, false, always("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
		c, br := h.dial(t)
		io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nConnection: close\r\n\r\n")
		resp, _ := readAll(t, br, "GET")
		if !resp.Close || !closedByGateway(br) {
			t.Fatalf("close=%v: the gateway kept the connection", resp.Close)
		}
	})
	t.Run("asked by the upstream", func(t *testing.T) {
		h := start(t, "")
		up := scriptedUpstream(t, h, false, always("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"))
		c, br := h.dial(t)
		for range 3 {
			io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n")
			// The upstream's close is its connection's business: the
			// client's stays open.
			if resp, body := readAll(t, br, "GET"); resp.Close || body != "ok" {
				t.Fatalf("close=%v %q", resp.Close, body)
			}
		}
		if n := up.conns.Load(); n != 3 {
			t.Fatalf("%d upstream connections for 3 requests answered with close", n)
		}
	})
}

// A kept-alive upstream connection closed while idle costs the client
// nothing and the proxy no failure.
func TestStaleUpstreamConnection(t *testing.T) {
	h := start(t, "")
	up := scriptedUpstream(t, h, true, always("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"))
	for i := range 4 {
		if resp, body := do(t, h.client(""), http.MethodGet, "http://127.0.0.1:9/", nil); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, body)
		}
	}
	if n := up.conns.Load(); n != 4 {
		t.Fatalf("%d upstream connections for 4 requests", n)
	}
	if f := h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", "response_headers"); f != 0 {
		t.Fatalf("%v failures blamed on the proxy", f)
	}
}

func TestOversizedHeads(t *testing.T) {
	h := start(t, limitsConfig)
	scriptedUpstream(t, h, false, always("HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("a", 128<<10)+"\r\n\r\n"))
	t.Run("request", func(t *testing.T) {
		c, br := h.dial(t)
		io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 4096)+"\r\n\r\n")
		resp, _ := readAll(t, br, "GET")
		if resp.StatusCode != 431 || resp.Header.Get("X-Proxypool-Reason") != "headers-too-large" || !closedByGateway(br) {
			t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
	})
	t.Run("response", func(t *testing.T) {
		c, br := h.dial(t)
		io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, _ := readAll(t, br, "GET")
		if resp.StatusCode != 502 || resp.Header.Get("X-Proxypool-Reason") != "upstream-response-headers" {
			t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
	})
}

func TestExpectContinueThroughGateway(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	c, br := h.dial(t)
	fmt.Fprintf(c, "POST %s/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nExpect: 100-continue\r\n\r\n", tg.URL())
	// Nothing is sent before the 100.
	line, err := br.ReadString('\n')
	if err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("first line %q %v", line, err)
	}
	if blank, _ := br.ReadString('\n'); blank != "\r\n" {
		t.Fatalf("after the 100: %q", blank)
	}
	io.WriteString(c, "payload")
	resp, body := readAll(t, br, "POST")
	if resp.StatusCode != 200 || !strings.Contains(body, "payload") {
		t.Fatalf("%d %q", resp.StatusCode, body)
	}
	h.idle(t)
}

func TestExpectContinueRefusedUpstream(t *testing.T) {
	h := start(t, "")
	scriptedUpstream(t, h, false, always("HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\n\r\n"))
	c, br := h.dial(t)
	io.WriteString(c, "POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n")
	resp, _ := readAll(t, br, "POST")
	// The body was never asked for: the connection cannot carry on.
	if resp.StatusCode != 413 || !resp.Close || !closedByGateway(br) {
		t.Fatalf("%d close=%v", resp.StatusCode, resp.Close)
	}
	h.idle(t)
}

func TestCloseDelimitedResponse(t *testing.T) {
	h := start(t, "")
	scriptedUpstream(t, h, true, always("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the upstream closes"))
	c, br := h.dial(t)
	io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, body := readAll(t, br, "GET")
	if body != "until the upstream closes" || !resp.Close || !closedByGateway(br) {
		t.Fatalf("%q close=%v", body, resp.Close)
	}
	h.idle(t)
}

func TestHEADAndBodylessResponses(t *testing.T) {
	h := start(t, "")
	up := scriptedUpstream(t, h, false, func(head string, _ *bufio.Reader) string {
		switch {
		case strings.HasPrefix(head, "HEAD"):
			return "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
		case strings.Contains(head, "/304"):
			return "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n"
		}
		return "HTTP/1.1 204 No Content\r\n\r\n"
	})
	c, br := h.dial(t)
	for _, tc := range []struct{ method, path string }{{"HEAD", "/"}, {"GET", "/304"}, {"GET", "/204"}, {"HEAD", "/"}} {
		fmt.Fprintf(c, "%s http://127.0.0.1:9%s HTTP/1.1\r\nHost: x\r\n\r\n", tc.method, tc.path)
		resp, body := readAll(t, br, tc.method)
		if body != "" || resp.Close {
			t.Fatalf("%s %s: %d %q close=%v", tc.method, tc.path, resp.StatusCode, body, resp.Close)
		}
		if tc.method == "HEAD" && resp.ContentLength != 1000 {
			t.Fatalf("HEAD lost its Content-Length: %d", resp.ContentLength)
		}
	}
	if n := up.conns.Load(); n != 1 {
		t.Fatalf("%d upstream connections: a bodyless response was waited on", n)
	}
}

func TestChunkedPassedThroughVerbatim(t *testing.T) {
	h := start(t, "")
	const reqBody = "3;note=x\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"
	const respBody = "5;ext\r\nhello\r\n0\r\n\r\n"
	got := make(chan string, 1)
	scriptedUpstream(t, h, false, func(head string, br *bufio.Reader) string {
		b := make([]byte, len(reqBody))
		_, _ = io.ReadFull(br, b)
		got <- head + string(b)
		return "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + respBody
	})
	c, br := h.dial(t)
	io.WriteString(c, "POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"+reqBody)
	upstream := <-got
	if !strings.HasSuffix(upstream, "Transfer-Encoding: chunked\r\n\r\n"+reqBody) {
		t.Fatalf("upstream received %q", upstream)
	}
	head, err := readHead(br)
	if err != nil || !strings.Contains(head, "Transfer-Encoding: chunked\r\n") {
		t.Fatalf("response head %q %v", head, err)
	}
	b := make([]byte, len(respBody))
	if _, err := io.ReadFull(br, b); err != nil || string(b) != respBody {
		t.Fatalf("response body %q %v", b, err)
	}
}

func TestMalformedChunkedBodyRefused(t *testing.T) {
	h := start(t, "")
	up := scriptedUpstream(t, h, false, func(head string, br *bufio.Reader) string {
		_, _ = io.Copy(io.Discard, br)
		return ""
	})
	c, br := h.dial(t)
	io.WriteString(c, "POST http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n")
	resp, _ := readAll(t, br, "POST")
	if resp.StatusCode != 400 || resp.Header.Get("X-Proxypool-Reason") != "bad-framing" || !closedByGateway(br) {
		t.Fatalf("%d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	<-up.heads
	h.idle(t)
	if f := h.metric(t, "proxypool_gateway_upstream_failures_total", "phase", "response_headers"); f != 0 {
		t.Fatal("the client's broken body was blamed on the proxy")
	}
}

// A drain closes idle kept-alive connections at once, lets a request in
// flight finish (telling its client the connection closes) and returns
// once nothing is left.
func TestDrainLetsRequestsFinish(t *testing.T) {
	h := start(t, strings.Replace(baseConfig, "shutdownTimeout: 300ms", "shutdownTimeout: 1m", 1))
	release := make(chan struct{})
	scriptedUpstream(t, h, false, func(head string, _ *bufio.Reader) string {
		if strings.Contains(head, "/slow") {
			<-release
		}
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	})
	idle, idleBr := h.dial(t)
	io.WriteString(idle, "GET http://127.0.0.1:9/fast HTTP/1.1\r\nHost: x\r\n\r\n")
	if resp, _ := readAll(t, idleBr, "GET"); resp.Close {
		t.Fatal("first response closed the connection")
	}
	busy, busyBr := h.dial(t)
	io.WriteString(busy, "GET http://127.0.0.1:9/slow HTTP/1.1\r\nHost: x\r\n\r\n")
	gwtest.Eventually(t, "slow request in flight", func() bool { return len(h.g.Runtime()) == 1 })
	h.stop()
	if !closedByGateway(idleBr) {
		t.Fatal("idle connection not closed by the drain")
	}
	select {
	case err := <-h.served:
		t.Fatalf("serve returned with a request in flight: %v", err)
	default:
	}
	close(release)
	resp, body := readAll(t, busyBr, "GET")
	if body != "ok" || !resp.Close || !closedByGateway(busyBr) {
		t.Fatalf("%q close=%v", body, resp.Close)
	}
	if err := <-h.served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	h.served <- nil // for the cleanup
}

// An upstream whose Connection header names Content-Length must not make
// the gateway drop the framing of a response it keeps alive: the client
// would read until close and merge the next response into this body.
func TestConnectionListedContentLengthKeepsFraming(t *testing.T) {
	h := start(t, "")
	scriptedUpstream(t, h, false, always("HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 5\r\n\r\nhello"))
	c, br := h.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	for i := range 2 {
		if _, err := io.WriteString(c, "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, body := readAll(t, br, "GET")
		if resp.ContentLength != 5 || body != "hello" || resp.Close {
			t.Fatalf("response %d: length %d, body %q, close %v", i, resp.ContentLength, body, resp.Close)
		}
	}
}
