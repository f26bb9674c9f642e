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

	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
)

// A client that leaves while its request waits — for response headers or
// for a proxy — is noticed: its connection is closed and released at once,
// the upstream exchange aborted and the proxy not blamed. The bounds of
// the waits are an hour, so only the watch can end them within the test.

const patientConfig = `
listeners:
  gateway: 127.0.0.1:0
shutdownTimeout: 300ms
security:
  allowLoopbackDestinations: true
gateway:
  limits:
    dialTimeout: 2s
    responseHeaderTimeout: 1h
`

// holding is an upstream proxy that answers a head whose path contains
// "/hold" only when release is closed (or never), then closes, and every
// other one at once; the body is the request target. It reports every
// head it reads and every connection that ends.
type holding struct {
	heads   chan string
	closed  chan struct{}
	release chan struct{}
}

func holdingUpstream(t *testing.T, h *harness) *holding {
	t.Helper()
	u := &holding{heads: make(chan string, 16), closed: make(chan struct{}, 16), release: make(chan struct{})}
	host, port := gwtest.SplitAddr(t, gwtest.Serve(t, func(c net.Conn) {
		defer func() { u.closed <- struct{}{} }()
		defer c.Close()
		br := bufio.NewReader(c)
		for {
			head, err := readHead(br)
			if err != nil {
				return
			}
			u.heads <- head
			path := strings.Fields(head)[1]
			hold := strings.Contains(path, "/hold")
			if hold {
				select {
				case <-u.release:
				case <-readEOF(br): // br is the watch's from here on
					return
				}
			}
			reply := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(path), path)
			if _, err := io.WriteString(c, reply); err != nil || hold {
				return
			}
		}
	}))
	h.apply(t, gwtest.Snapshot(1, time.Now(), gwtest.MakeProxy("vendor", host, port, "", "", time.Now())))
	return u
}

// readEOF is closed when br's connection ends.
func readEOF(br *bufio.Reader) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		_, _ = br.ReadByte()
	}()
	return ch
}

func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	panic("unreachable")
}

func (h *harness) activeConns(t *testing.T) float64 {
	return h.metric(t, "proxypool_gateway_client_connections_active")
}

// noProxyBlamed checks that no upstream failure was counted or reported.
func noProxyBlamed(t *testing.T, h *harness) {
	t.Helper()
	h.idle(t)
	if n := h.metric(t, "proxypool_gateway_upstream_failures_total"); n != 0 {
		t.Fatalf("upstream failures counted: %v", n)
	}
	for _, o := range h.sink.outcomes() {
		if !o.Success {
			t.Fatalf("failure outcome reported: %+v", o)
		}
	}
}

func TestClientLeavesAwaitingResponseHeaders(t *testing.T) {
	h := start(t, patientConfig)
	up := holdingUpstream(t, h)
	c, _ := h.dial(t)
	if _, err := io.WriteString(c, "GET http://127.0.0.1:9/hold HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	receive(t, up.heads, "the request upstream")
	if n := h.activeConns(t); n != 1 {
		t.Fatalf("client connections active = %v", n)
	}
	c.Close()
	gwtest.Eventually(t, "client connection released", func() bool { return h.activeConns(t) == 0 })
	receive(t, up.closed, "the upstream connection closed by the gateway")
	noProxyBlamed(t, h)
	if n := h.metric(t, "proxypool_gateway_requests_total", "method_class", "get_head", "result", "canceled"); n != 1 {
		t.Fatalf("requests_total canceled = %v", n)
	}

	// The proxy serves the next request, whose success is the only
	// outcome reported: none came before it.
	c2, br := h.dial(t)
	if _, err := io.WriteString(c2, "GET http://127.0.0.1:9/next HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if resp, body := readAll(t, br, "GET"); resp.StatusCode != 200 || body != "http://127.0.0.1:9/next" {
		t.Fatalf("next request: %d %q", resp.StatusCode, body)
	}
	gwtest.Eventually(t, "success reported", func() bool { return len(h.sink.outcomes()) > 0 })
	if got := h.sink.outcomes(); len(got) != 1 || !got[0].Success {
		t.Fatalf("outcomes %+v, want one success", got)
	}
}

func TestClientLeavesWhileParked(t *testing.T) {
	tg := gwtest.Target(t)
	echo := gwtest.NewEchoServer(t)
	for _, tc := range []struct{ name, head, class string }{
		{"GET", "GET %s/parked HTTP/1.1\r\nHost: x\r\n\r\n", "get_head"},
		// A body that arrived whole: nothing else is on the connection.
		{"POST", "POST %s/parked HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody", "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
			h := start(t, patientConfig+"routings:\n  - name: default\n    upstreams: [vendor]\n    onUnavailable: wait\n    waitTimeout: 1h\n"+
				"upstreams:\n  - name: vendor\n    provider: {plugin: p}\n")
			h.apply(t, oneSlot(1, up, func(ws *worker.Snapshot) { ws.Routings[0].OnUnavailable = routing.Wait }))
			tunnel, _ := connect(t, h.addr, echo, "")
			c, _ := h.dial(t)
			if _, err := fmt.Fprintf(c, tc.head, tg.URL()); err != nil {
				t.Fatal(err)
			}
			gwtest.Eventually(t, "request parked", func() bool {
				return h.metric(t, "proxypool_gateway_dispatch_failures_total", "reason", "busy") >= 1
			})
			c.Close()
			gwtest.Eventually(t, "client connection released", func() bool { return h.activeConns(t) == 1 })
			gwtest.Eventually(t, "wait canceled", func() bool {
				return h.metric(t, "proxypool_gateway_dispatch_waits_total", "result", "canceled") == 1
			})
			gwtest.Eventually(t, "request counted", func() bool {
				return h.metric(t, "proxypool_gateway_requests_total", "method_class", tc.class, "result", "canceled") == 1
			})
			tunnel.Close()
			noProxyBlamed(t, h)
			if up.Requests() != 0 {
				t.Fatalf("the upstream saw %d requests", up.Requests())
			}
			// The slot is free again, not held by the request that left.
			if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/after", nil); resp.StatusCode != 200 {
				t.Fatalf("next request: %d", resp.StatusCode)
			}
		})
	}
}

func TestPipelinedBehindSlowRequest(t *testing.T) {
	h := start(t, patientConfig)
	up := holdingUpstream(t, h)
	c, br := h.dial(t)
	if _, err := io.WriteString(c, "GET http://127.0.0.1:9/hold HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	receive(t, up.heads, "the first request upstream")
	// The upstream is slow: the second request arrives while the first
	// has waited longer than the watch's grace (half a second).
	<-time.After(time.Second)
	if _, err := io.WriteString(c, "GET http://127.0.0.1:9/second HTTP/1.1\r\nHost: 127.0.0.1:9\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	close(up.release)
	for _, want := range []string{"http://127.0.0.1:9/hold", "http://127.0.0.1:9/second"} {
		resp, body := readAll(t, br, "GET")
		if resp.StatusCode != 200 || body != want || resp.Close {
			t.Fatalf("got %d %q close=%v, want 200 %q", resp.StatusCode, body, resp.Close, want)
		}
	}
	gwtest.Eventually(t, "both requests counted", func() bool {
		return h.metric(t, "proxypool_gateway_requests_total", "method_class", "get_head", "result", "ok") == 2
	})
}
