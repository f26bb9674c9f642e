package gateway_test

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/testenv"
)

func withLimits(extra string) string {
	return baseConfig + extra
}

// oneSlot is a snapshot of one proxy that takes one request at a time.
func oneSlot(version uint64, up *testenv.UpstreamProxy, mut ...func(*worker.Snapshot)) *worker.Snapshot {
	ws := gwtest.Snapshot(version, time.Now(), func() proxy.Proxy {
		p := gwtest.ProxyOf(up, "vendor", upUser, upPass, time.Now())
		p.MaxConcurrency = 1
		return p
	}())
	for _, m := range mut {
		m(ws)
	}
	return ws
}

// secondConnRefused holds one tunnel open through h and checks that a
// second connection is answered with status and reason, then closed.
func secondConnRefused(t *testing.T, h *harness, echo, status, reason string) {
	t.Helper()
	c1, _ := connect(t, h.addr, echo, "")
	defer c1.Close()
	c2, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	got, _ := io.ReadAll(c2)
	if !strings.HasPrefix(string(got), status) || !strings.Contains(string(got), reason) {
		t.Fatalf("second connection got %q", got)
	}
}

func TestAdmissionLimits(t *testing.T) {
	tg := gwtest.Target(t)
	echo := gwtest.NewEchoServer(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	t.Run("connections per listener", func(t *testing.T) {
		h := start(t, withLimits("    maxConns: 1\n"))
		h.apply(t, snapshotOf(1, up))
		secondConnRefused(t, h, echo, "HTTP/1.1 503", "overload")
	})
	t.Run("connections per client", func(t *testing.T) {
		h := start(t, withLimits("    maxConnsPerClient: 1\n"))
		h.apply(t, snapshotOf(1, up))
		secondConnRefused(t, h, echo, "HTTP/1.1 429", "too-many-connections")
		if h.metric(t, "proxypool_gateway_rejections_total", "reason", "too-many-connections") != 1 {
			t.Fatal("refusal not counted")
		}
	})
	t.Run("requests per second per client", func(t *testing.T) {
		h := start(t, withLimits("    requestsPerSecondPerClient: 0.01\n"))
		h.apply(t, snapshotOf(1, up))
		if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/1", nil); resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		before := requests([]*testenv.UpstreamProxy{up})
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/2", nil)
		if resp.StatusCode != 429 || resp.Header.Get("X-Proxypool-Reason") != "rate-limited" {
			t.Fatalf("second: %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
		if requests([]*testenv.UpstreamProxy{up}) != before {
			t.Fatal("a rate-limited request reached the upstream")
		}
	})
	t.Run("per routing in flight", func(t *testing.T) {
		yaml := withLimits("") + "routings:\n  - name: default\n    upstreams: [vendor]\n    maxInFlight: 1\n" +
			"upstreams:\n  - name: vendor\n    provider: {plugin: p}\n"
		h := start(t, yaml)
		h.apply(t, snapshotOf(1, up))
		c1, _ := connect(t, h.addr, echo, "")
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil)
		if resp.StatusCode != 503 || resp.Header.Get("X-Proxypool-Reason") != "routing-limit" {
			t.Fatalf("over the routing limit: %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
		c1.Close()
		h.idle(t)
		if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil); resp.StatusCode != 200 {
			t.Fatalf("after the tunnel closed: %d", resp.StatusCode)
		}
	})
	t.Run("per proxy concurrency", func(t *testing.T) {
		h := start(t, "")
		h.apply(t, oneSlot(1, up))
		c1, _ := connect(t, h.addr, echo, "")
		defer c1.Close()
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil)
		if resp.StatusCode != 503 || resp.Header.Get("X-Proxypool-Reason") != "no-proxy" {
			t.Fatalf("proxy full: %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
	})
}

func TestOnUnavailable(t *testing.T) {
	tg := gwtest.Target(t)
	echo := gwtest.NewEchoServer(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	wait := func(ws *worker.Snapshot) { ws.Routings[0].OnUnavailable = routing.Wait }
	t.Run("wait gets the slot a release frees", func(t *testing.T) {
		h := start(t, withLimits("")+"routings:\n  - name: default\n    upstreams: [vendor]\n    onUnavailable: wait\n    waitTimeout: 1m\n"+
			"upstreams:\n  - name: vendor\n    provider: {plugin: p}\n")
		h.apply(t, oneSlot(1, up, wait))
		c1, _ := connect(t, h.addr, echo, "")
		got := make(chan int, 1)
		go func() {
			resp, err := h.client("").Get(tg.URL() + "/waited")
			if err != nil {
				got <- 0
				return
			}
			resp.Body.Close()
			got <- resp.StatusCode
		}()
		gwtest.Eventually(t, "request parked", func() bool {
			return h.metric(t, "proxypool_gateway_dispatch_failures_total", "reason", "busy") >= 1
		})
		c1.Close()
		if code := <-got; code != 200 {
			t.Fatalf("parked request: %d", code)
		}
		if h.metric(t, "proxypool_gateway_dispatch_waits_total", "result", "acquired") != 1 {
			t.Fatal("wait not counted")
		}
	})
	t.Run("wait gives up at waitTimeout", func(t *testing.T) {
		h := start(t, withLimits("")+"routings:\n  - name: default\n    upstreams: [vendor]\n    onUnavailable: wait\n    waitTimeout: 100ms\n"+
			"upstreams:\n  - name: vendor\n    provider: {plugin: p}\n")
		h.apply(t, oneSlot(1, up, wait))
		c1, _ := connect(t, h.addr, echo, "")
		defer c1.Close()
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil)
		if resp.StatusCode != 503 || resp.Header.Get("X-Proxypool-Reason") != "no-proxy" {
			t.Fatalf("after the wait: %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
		}
	})
	t.Run("direct without proxies", func(t *testing.T) {
		h := start(t, "")
		h.apply(t, directSnapshot(1))
		resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+"/d", nil)
		if resp.StatusCode != 200 || received(t, body).UpstreamProxy != "" {
			t.Fatalf("direct: %d %q", resp.StatusCode, body)
		}
		conn, br := connect(t, h.addr, echo, "")
		io.WriteString(conn, "direct")
		conn.(*net.TCPConn).CloseWrite()
		if got, _ := io.ReadAll(br); string(got) != "direct" {
			t.Fatalf("direct tunnel echoed %q", got)
		}
		if h.metric(t, "proxypool_gateway_direct_requests_total") != 2 {
			t.Fatal("direct requests not counted")
		}
	})
	t.Run("reject is the default", func(t *testing.T) {
		h := start(t, "")
		h.apply(t, gwtest.Snapshot(1, time.Now()))
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/r", nil)
		if resp.StatusCode != 503 {
			t.Fatalf("reject: %d", resp.StatusCode)
		}
	})
}
