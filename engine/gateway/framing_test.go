package gateway_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

const limitsConfig = `
listeners:
  gateway: 127.0.0.1:0
shutdownTimeout: 300ms
security:
  allowLoopbackDestinations: true
gateway:
  limits:
    dialTimeout: 2s
    responseHeaderTimeout: 2s
    maxHeaderBytes: 2048
    maxHeaderCount: 20
    readHeaderTimeout: 300ms
    idleTimeout: 300ms
`

// TestMalformedRequests writes raw bytes and checks what the client gets
// back — every refusal carries the gateway's reason — and that nothing
// reaches an upstream or the target.
func TestMalformedRequests(t *testing.T) {
	h := start(t, limitsConfig)
	tg := gwtest.Target(t)
	ups := gwtest.Upstreams(t, 1, upUser, upPass)
	h.apply(t, snapshotOf(1, ups...))
	u := tg.URL()
	post := func(hdrs, body string) string {
		return "POST " + u + "/p HTTP/1.1\r\nHost: " + tg.Addr() + "\r\n" + hdrs + "\r\n" + body
	}
	manyHeaders := ""
	for i := range 25 {
		manyHeaders += fmt.Sprintf("X-H%d: v\r\n", i)
	}
	tests := []struct {
		name   string
		req    string
		status int
		reason string // our reason header
	}{
		{"two different Content-Length", post("Content-Length: 3\r\nContent-Length: 4\r\n", "abcd"), 400, "bad-framing"},
		{"Content-Length list", post("Content-Length: 3, 4\r\n", "abcd"), 400, "bad-framing"},
		{"signed Content-Length", post("Content-Length: +3\r\n", "abc"), 400, "bad-framing"},
		{"negative Content-Length", post("Content-Length: -1\r\n", "abc"), 400, "bad-framing"},
		{"overflowing Content-Length", post("Content-Length: 99999999999999999999999\r\n", "abc"), 400, "bad-framing"},
		{"Transfer-Encoding gzip, chunked", post("Transfer-Encoding: gzip, chunked\r\n", "3\r\nabc\r\n0\r\n\r\n"), 501, "bad-framing"},
		{"Transfer-Encoding identity", post("Transfer-Encoding: identity\r\n", ""), 501, "bad-framing"},
		{"Transfer-Encoding chunked twice", post("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "3\r\nabc\r\n0\r\n\r\n"), 501, "bad-framing"},
		{"Transfer-Encoding and Content-Length", post("Transfer-Encoding: chunked\r\nContent-Length: 3\r\n", "3\r\nabc\r\n0\r\n\r\n"), 400, "bad-framing"},
		{"obs-folded header", "GET " + u + "/f HTTP/1.1\r\nHost: x\r\nX-A: one\r\n two\r\n\r\n", 400, "bad-framing"},
		{"obs-folded header with tab", "GET " + u + "/f HTTP/1.1\r\nHost: x\r\nX-A: one\r\n\ttwo\r\n\r\n", 400, "bad-framing"},
		{"CONNECT without port", "CONNECT " + "example.com HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"CONNECT port out of range", "CONNECT example.com:70000 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"CONNECT port zero", "CONNECT example.com:0 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"CONNECT empty port", "CONNECT example.com: HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"CONNECT nested brackets", "CONNECT [[::1]]:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"CONNECT unbracketed IPv6", "CONNECT ::1:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400, "bad-target"},
		{"header bytes over the limit", "GET " + u + "/big HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n", 431, "headers-too-large"},
		{"header count over the limit", "GET " + u + "/many HTTP/1.1\r\nHost: x\r\n" + manyHeaders + "\r\n", 431, "too-many-headers"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.raw(t, tc.req)
			if resp.StatusCode != tc.status || resp.Header.Get("X-Proxypool-Reason") != tc.reason {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"), tc.status, tc.reason)
			}
		})
	}
	if n := requests(ups); n != 0 {
		t.Fatalf("upstream carried %d malformed requests", n)
	}
	if n := tg.Count(); n != 0 {
		t.Fatalf("target saw %d malformed requests", n)
	}
	// A well-formed request on the same gateway goes through.
	if resp, _ := do(t, h.client(""), http.MethodGet, u+"/ok", nil); resp.StatusCode != 200 {
		t.Fatalf("clean request: %d", resp.StatusCode)
	}
}

// A smuggled request pipelined behind a folded one never runs.
func TestFramingViolationPoisonsConnection(t *testing.T) {
	h := start(t, limitsConfig)
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET %s/a HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n 2\r\n\r\nGET %s/smuggled HTTP/1.1\r\nHost: x\r\n\r\n", tg.URL(), tg.URL())
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || !resp.Close {
		t.Fatalf("got %d close=%v", resp.StatusCode, resp.Close)
	}
	if tg.Count() != 0 {
		t.Fatal("the pipelined request reached the target")
	}
}

// waitClosed reads until the server closes conn; it fails if the server
// keeps it open past a generous deadline.
func waitClosed(t *testing.T, conn net.Conn) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("server kept the connection open")
	}
}

func TestSlowClientsTimedOut(t *testing.T) {
	h := start(t, limitsConfig)
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	t.Run("slowloris headers hit readHeaderTimeout", func(t *testing.T) {
		conn, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s/slow HTTP/1.1\r\nHost: x\r\nX-A: ", tg.URL())
		waitClosed(t, conn)
	})
	t.Run("idle keep-alive connection hits idleTimeout", func(t *testing.T) {
		conn, err := net.Dial("tcp", h.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET %s/idle HTTP/1.1\r\nHost: x\r\n\r\n", tg.URL())
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("status %d close %v", resp.StatusCode, resp.Close)
		}
		waitClosed(t, conn)
	})
	if h.metric(t, "proxypool_gateway_client_connections_active") != 0 {
		gwtest.Eventually(t, "connections closed", func() bool {
			return h.metric(t, "proxypool_gateway_client_connections_active") == 0
		})
	}
}
