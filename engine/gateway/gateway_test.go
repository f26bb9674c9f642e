package gateway_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/netguard"
	"github.com/proxypool/proxypool/testenv"
)

// sink collects reported outcomes.
type sink struct {
	mu  sync.Mutex
	got []worker.Outcome
}

func (s *sink) ReportOutcomes(b []worker.Outcome) {
	s.mu.Lock()
	s.got = append(s.got, b...)
	s.mu.Unlock()
}

func (s *sink) outcomes() []worker.Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]worker.Outcome(nil), s.got...)
}

type harness struct {
	g      *gateway.Gateway
	addr   string
	prom   *prometheus.Registry
	sink   *sink
	stop   context.CancelFunc
	served chan error
}

const baseConfig = `
listeners:
  gateway: 127.0.0.1:0
shutdownTimeout: 300ms
security:
  allowLoopbackDestinations: true
gateway:
  limits:
    dialTimeout: 2s
    responseHeaderTimeout: 2s
`

// Proxy credentials every simulated upstream demands.
const upUser, upPass = "vendor-user", "vendor-pass"

// start serves a gateway built from yaml (baseConfig when empty) on a
// loopback listener.
func start(t *testing.T, yaml string) *harness {
	return startWith(t, yaml, nil)
}

func startWith(t *testing.T, yaml string, resolver netguard.Resolver) *harness {
	t.Helper()
	if yaml == "" {
		yaml = baseConfig
	}
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{prom: prometheus.NewRegistry(), sink: &sink{}, served: make(chan error, 1)}
	h.g, err = gateway.New(gateway.Options{Config: cfg, Registry: h.prom, Outcomes: h.sink,
		OutcomeFlushInterval: 10 * time.Millisecond, Resolver: resolver})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.served <- h.g.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-h.served; err != nil {
			t.Errorf("serve: %v", err)
		}
		h.g.Close()
	})
	return h
}

func (h *harness) apply(t *testing.T, ws *worker.Snapshot) {
	t.Helper()
	if err := h.g.Apply(context.Background(), ws); err != nil {
		t.Fatal(err)
	}
}

// client returns an HTTP client using the gateway as its proxy, with
// credentials when userinfo is set ("user:pass").
func (h *harness) client(userinfo string) *http.Client {
	u := &url.URL{Scheme: "http", Host: h.addr}
	if userinfo != "" {
		user, pass, _ := strings.Cut(userinfo, ":")
		u.User = url.UserPassword(user, pass)
	}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), DisableKeepAlives: true}, Timeout: 10 * time.Second}
}

// idle waits until no proxy has a count: every request released.
func (h *harness) idle(t *testing.T) {
	t.Helper()
	gwtest.Eventually(t, "runtime counts back to zero", func() bool { return len(h.g.Runtime()) == 0 })
}

func (h *harness) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	return gwtest.Metric(t, h.prom, name, labels...)
}

// raw writes a request on a fresh connection and reads one response.
func (h *harness) raw(t *testing.T, req string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: strings.SplitN(req, " ", 2)[0]})
	if err != nil {
		t.Fatalf("reading response to %q: %v", firstLine(req), err)
	}
	if resp.Request.Method != http.MethodConnect {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	resp.Body.Close()
	return resp
}

func firstLine(s string) string { l, _, _ := strings.Cut(s, "\r\n"); return l }

func do(t *testing.T, c *http.Client, method, url string, body io.Reader, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// received decodes the testenv target's description of the request.
func received(t *testing.T, body string) testenv.Received {
	t.Helper()
	var r testenv.Received
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("target answer %q: %v", body, err)
	}
	return r
}

func snapshotOf(version uint64, ups ...*testenv.UpstreamProxy) *worker.Snapshot {
	now := time.Now()
	var ps []proxy.Proxy
	for _, u := range ups {
		ps = append(ps, gwtest.ProxyOf(u, "vendor", upUser, upPass, now))
	}
	return gwtest.Snapshot(version, now, ps...)
}

func requests(ups []*testenv.UpstreamProxy) (n int64) {
	for _, u := range ups {
		n += u.Requests() + u.Connects()
	}
	return n
}

func TestGETThroughUpstreamProxy(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	ups := gwtest.Upstreams(t, 3, upUser, upPass)
	h.apply(t, snapshotOf(1, ups...))
	names := map[string]bool{}
	for _, u := range ups {
		names[u.ID()] = true
	}
	for i := range 6 {
		path := fmt.Sprintf("/page%d", i)
		resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+path, nil)
		// The upstreams demand credentials: a 200 proves the gateway sent
		// each proxy's own.
		if resp.StatusCode != 200 {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if rec := received(t, body); rec.Path != path || !names[rec.UpstreamProxy] {
			t.Fatalf("target saw %+v", rec)
		}
		h.idle(t)
	}
	gwtest.Eventually(t, "success outcomes", func() bool {
		n := 0
		for _, o := range h.sink.outcomes() {
			if o.Success && o.Routing == "default" && o.Upstream == "vendor" {
				n++
			}
		}
		return n == 6
	})
	if got := h.metric(t, "proxypool_gateway_requests_total", "method_class", "get_head", "result", "ok"); got != 6 {
		t.Fatalf("requests_total ok = %v", got)
	}
	if h.metric(t, "proxypool_gateway_bytes_total", "direction", "downstream") == 0 {
		t.Fatal("bytes_total not counted")
	}
	if h.metric(t, "proxypool_gateway_upstream_connect_duration_seconds") != 6 {
		t.Fatal("upstream connect time not observed")
	}
}

// Upstream connections are kept alive and reused: sequential requests
// through one proxy use one connection.
func TestUpstreamKeepAlive(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	h.apply(t, snapshotOf(1, up))
	for range 5 {
		if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/k", nil); resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		// The client has the whole response a moment before the gateway
		// is done with the exchange and pools the upstream connection.
		h.idle(t)
	}
	if n := up.ActiveConns(); n != 1 {
		t.Fatalf("upstream holds %d connections after 5 sequential requests, want 1", n)
	}
}

func writeSecret(t *testing.T, value string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func authConfig(t *testing.T) string {
	return baseConfig + `  auth:
    mode: usernamePassword
    users:
      - username: client
        password: file:` + writeSecret(t, "client-pass") + "\n"
}

// directRouting makes the catch-all routing go direct when it has no
// proxy, so the target sees exactly what the gateway sends.
func directSnapshot(version uint64) *worker.Snapshot {
	ws := gwtest.Snapshot(version, time.Now())
	ws.Routings[0].OnUnavailable = routing.Direct
	ws.Routings[0].StickyHeader = "X-Session"
	return ws
}

func TestHopByHopAndProxyCredentialsNeverForwarded(t *testing.T) {
	h := start(t, authConfig(t))
	tg := gwtest.Target(t)
	h.apply(t, directSnapshot(1))
	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	clientAuth := "Basic " + base64Of("client:client-pass")
	fmt.Fprintf(conn, "GET %s/h HTTP/1.1\r\nHost: %s\r\n"+
		"Proxy-Authorization: %s\r\n"+
		"Proxy-Connection: keep-alive\r\n"+
		"Connection: keep-alive, X-Hop-Secret\r\n"+
		"X-Hop-Secret: 1\r\n"+
		"Keep-Alive: timeout=300\r\n"+
		"TE: trailers\r\n"+
		"Trailer: X-T\r\n"+
		"Upgrade: websocket\r\n"+
		"X-Proxypool-Api-Key: gateway-only\r\n"+
		"X-Session: s1\r\n"+
		"X-End-To-End: kept\r\n\r\n", tg.URL(), tg.Addr(), clientAuth)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d (%s)", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	rec := received(t, string(body))
	for _, name := range []string{"Proxy-Authorization", "Proxy-Connection", "X-Hop-Secret", "Keep-Alive", "Te", "Trailer",
		"Upgrade", "X-Proxypool-Api-Key", "X-Session", "User-Agent"} {
		if v, ok := rec.Headers[name]; ok {
			t.Errorf("target received %s: %q", name, v)
		}
	}
	if c := rec.Headers["Connection"]; strings.Contains(strings.ToLower(c), "x-hop") {
		t.Errorf("target received Connection %q", c)
	}
	if rec.Headers["X-End-To-End"] != "kept" {
		t.Fatal("end-to-end header lost")
	}
}

func base64Of(s string) string {
	return strings.TrimSpace(string(mustBase64(s)))
}

// connect opens a CONNECT tunnel through the gateway; first is written in
// the same segment as the CONNECT request (pipelined).
func connect(t *testing.T, gw, authority, first string, hdr ...string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, br, resp := tryConnect(t, gw, authority, first, hdr...)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT status %d reason %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	return conn, br
}

func tryConnect(t *testing.T, gw, authority, first string, hdr ...string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	conn, err := net.Dial("tcp", gw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	extra := ""
	for i := 0; i+1 < len(hdr); i += 2 {
		extra += hdr[i] + ": " + hdr[i+1] + "\r\n"
	}
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n%s", authority, authority, extra, first)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	return conn, br, resp
}

func TestCONNECTTunnel(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 3, upUser, upPass)...))

	t.Run("http inside the tunnel", func(t *testing.T) {
		conn, br := connect(t, h.addr, tg.Addr(), "")
		fmt.Fprintf(conn, "GET /inside HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rec := received(t, string(body)); rec.Path != "/inside" {
			t.Fatalf("tunnelled request %+v", rec)
		}
		if n := h.metric(t, "proxypool_gateway_connect_tunnels_active"); n != 1 {
			t.Fatalf("tunnels active = %v during the tunnel", n)
		}
		// The target closed: the close travels back to the client.
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("after close: %v", err)
		}
		conn.Close()
		h.idle(t)
	})
	t.Run("half-close and pipelined bytes", func(t *testing.T) {
		echo := gwtest.NewEchoServer(t)
		conn, br := connect(t, h.addr, echo, "early-")
		payload := strings.Repeat("0123456789", 10000)
		go func() {
			_, _ = io.WriteString(conn, payload)
			_ = conn.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(br)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != "early-"+payload {
			t.Fatalf("echoed %d bytes, want %d", len(got), len("early-")+len(payload))
		}
		conn.Close()
		h.idle(t)
		if up := h.metric(t, "proxypool_gateway_bytes_total", "direction", "upstream"); up < float64(len(payload)) {
			t.Fatalf("bytes upstream = %v", up)
		}
	})
	if n := h.metric(t, "proxypool_gateway_connect_tunnels_active"); n != 0 {
		t.Fatalf("tunnels active = %v after close", n)
	}
}

func TestRefusals(t *testing.T) {
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	tests := []struct {
		name   string
		yaml   string
		ws     *worker.Snapshot
		raw    string // a raw request instead of a GET through the client
		status int
		reason string
	}{
		{name: "no snapshot yet", status: 503, reason: "stale"},
		{name: "no proxies", ws: gwtest.Snapshot(1, time.Now()), status: 503, reason: "no-proxy"},
		{name: "snapshot past valid until", ws: func() *worker.Snapshot {
			ws := snapshotOf(1, up)
			ws.ValidUntil = time.Now().Add(-time.Second)
			return ws
		}(), status: 503, reason: "stale"},
		{name: "no route", ws: func() *worker.Snapshot {
			ws := snapshotOf(1, up)
			ws.Routings = []routing.Rule{{Name: "only", Hosts: []string{"only.example"}, Upstreams: []string{"vendor"}, MaxAttempts: 2}}
			return ws
		}(), status: 503, reason: "no-route"},
		{name: "loopback destination refused", yaml: strings.Replace(baseConfig, "allowLoopbackDestinations: true", "allowLoopbackDestinations: false", 1),
			ws: snapshotOf(1, up), status: 403, reason: "denied-destination"},
		{name: "client outside allowCIDRs", yaml: baseConfig + "  access:\n    allowCIDRs: [10.0.0.0/8]\n",
			ws: snapshotOf(1, up), status: 403, reason: "access-denied"},
		{name: "origin-form request", ws: snapshotOf(1, up), raw: "GET /relative HTTP/1.1\r\nHost: example.com\r\n\r\n", status: 400, reason: "bad-target"},
		{name: "https absolute-form", ws: snapshotOf(1, up), raw: "GET https://example.com/ HTTP/1.1\r\nHost: example.com\r\n\r\n", status: 400, reason: "bad-target"},
		{name: "CONNECT without port", ws: snapshotOf(1, up), raw: "CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n", status: 400, reason: "bad-target"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.yaml)
			if tc.ws != nil {
				h.apply(t, tc.ws)
			}
			var resp *http.Response
			if tc.raw == "" {
				resp, _ = do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil)
			} else {
				resp = h.raw(t, tc.raw)
			}
			if resp.StatusCode != tc.status || resp.Header.Get("X-Proxypool-Reason") != tc.reason {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"), tc.status, tc.reason)
			}
			if h.metric(t, "proxypool_gateway_rejections_total", "reason", tc.reason) != 1 {
				t.Fatal("rejection not counted")
			}
			h.idle(t)
		})
	}
	if n := tg.Count(); n != 0 {
		t.Fatalf("target saw %d refused requests", n)
	}
	if n := up.Requests() + up.Connects(); n != 0 {
		t.Fatalf("upstream carried %d refused requests", n)
	}
}

func TestSnapshotSwap(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	ups := gwtest.Upstreams(t, 2, upUser, upPass)
	via := func() string {
		resp, body := do(t, h.client(""), http.MethodGet, tg.URL()+"/s", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return received(t, body).UpstreamProxy
	}
	h.apply(t, snapshotOf(1, ups[0]))
	if v := via(); v != ups[0].ID() {
		t.Fatalf("v1 went via %q", v)
	}
	h.apply(t, snapshotOf(2, ups[1]))
	for range 3 {
		if v := via(); v != ups[1].ID() {
			t.Fatalf("v2 went via %q", v)
		}
	}
	var ve *gateway.VersionError
	if err := h.g.Apply(context.Background(), snapshotOf(2, ups[0])); !errors.As(err, &ve) {
		t.Fatalf("same version: %v", err)
	}
	if err := h.g.Apply(context.Background(), snapshotOf(1, ups[0])); !errors.As(err, &ve) {
		t.Fatalf("older version: %v", err)
	}
	if v := via(); v != ups[1].ID() {
		t.Fatalf("refused snapshot took effect: via %q", v)
	}
	if got := h.metric(t, "proxypool_gateway_snapshot_version"); got != 2 {
		t.Fatalf("snapshot_version = %v", got)
	}
	if h.metric(t, "proxypool_gateway_snapshot_apply_duration_seconds") != 2 {
		t.Fatal("apply duration not observed")
	}
	h.idle(t)
}

// valid_until passing stops new traffic with 503 stale while an open
// tunnel carries on; a proxy removed while in use reports draining until
// its tunnel closes.
func TestStaleAndDrainingWhileTunnelsRun(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	up := gwtest.Upstreams(t, 1, upUser, upPass)[0]
	h.apply(t, snapshotOf(1, up))
	echo := gwtest.NewEchoServer(t)
	conn, br := connect(t, h.addr, echo, "")
	// v2 drops the proxy and is already past its valid_until.
	ws := gwtest.Snapshot(2, time.Now())
	ws.ValidUntil = time.Now().Add(-time.Second)
	h.apply(t, ws)
	resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/x", nil)
	if resp.StatusCode != 503 || resp.Header.Get("X-Proxypool-Reason") != "stale" {
		t.Fatalf("new request: %d %q, want 503 stale", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	rt := h.g.Runtime()
	if len(rt) != 1 || rt[0].Active != 1 || !rt[0].Draining {
		t.Fatalf("runtime = %+v, want the removed proxy draining with 1 active", rt)
	}
	io.WriteString(conn, "still-up")
	buf := make([]byte, len("still-up"))
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "still-up" {
		t.Fatalf("tunnel after stale: %q %v", buf, err)
	}
	conn.Close()
	h.idle(t)
}

func TestDrainClosesTunnelsAtDeadline(t *testing.T) {
	h := start(t, "")
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	echo := gwtest.NewEchoServer(t)
	conn, br := connect(t, h.addr, echo, "")
	io.WriteString(conn, "x")
	if b, err := br.ReadByte(); err != nil || b != 'x' {
		t.Fatalf("echo: %v", err)
	}
	if rt := h.g.Runtime(); len(rt) != 1 || rt[0].Active != 1 {
		t.Fatalf("runtime during tunnel = %+v", rt)
	}
	h.stop()
	// The tunnel stays idle past the 300ms drain: the gateway closes it.
	if _, err := br.ReadByte(); err == nil {
		t.Fatal("tunnel still open after drain")
	}
	if err := <-h.served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	h.served <- nil // for the cleanup
	h.idle(t)
	if _, err := net.Dial("tcp", h.addr); err == nil {
		t.Fatal("listener still accepting after shutdown")
	}
}

func TestUpdateConfig(t *testing.T) {
	h := start(t, "")
	tg := gwtest.Target(t)
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cfg, err := config.Parse([]byte(authConfig(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.UpdateConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/", nil); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("after reload: status %d, want 407", resp.StatusCode)
	}
	if resp, _ := do(t, h.client("client:client-pass"), http.MethodGet, tg.URL()+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after reload with credentials: status %d", resp.StatusCode)
	}
	// A config the gateway cannot serve is refused and changes nothing.
	bad := *cfg
	bad.Gateway.Auth.Mode = "bearer" // no tokens configured
	if err := h.g.UpdateConfig(&bad); err == nil {
		t.Fatal("bearer without tokens accepted")
	}
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL()+"/", nil); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("refused reload changed auth: status %d", resp.StatusCode)
	}
}

// wildcardAddr pretends a loopback listener is bound to every interface.
type wildcardAddr struct{ net.Listener }

func (wildcardAddr) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 8080} }

func TestStrictModeRefusesOpenListener(t *testing.T) {
	tests := []struct {
		name   string
		yaml   string
		refuse bool
	}{
		{"auth none, no allowCIDRs", baseConfig, true},
		{"allowCIDRs set", baseConfig + "  access:\n    allowCIDRs: [10.0.0.0/8]\n", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tc.yaml))
			if err != nil {
				t.Fatal(err)
			}
			g, err := gateway.New(gateway.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			defer g.Close()
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- g.Serve(ctx, wildcardAddr{ln}) }()
			if !tc.refuse {
				cancel()
			}
			err = <-done
			cancel()
			if refused := err != nil && strings.Contains(err.Error(), "strict mode"); refused != tc.refuse {
				t.Fatalf("serve on an open listener: %v, want refused=%v", err, tc.refuse)
			}
		})
	}
}

// Tunnels are copied through buffers by default, and with splice once a
// reload sets gateway.tunnelSplice; both carry every byte.
func TestTunnelCopyModes(t *testing.T) {
	h := start(t, "")
	h.apply(t, snapshotOf(1, gwtest.Upstreams(t, 1, upUser, upPass)...))
	echo := gwtest.NewEchoServer(t)
	payload := strings.Repeat("proxypool", 1<<19) // 4.5 MiB: bulk, not a ping-pong
	through := func(t *testing.T) {
		t.Helper()
		conn, br := connect(t, h.addr, echo, "")
		defer conn.Close()
		go func() {
			_, _ = io.WriteString(conn, payload)
			_ = conn.(*net.TCPConn).CloseWrite()
		}()
		got, err := io.ReadAll(br)
		if err != nil || string(got) != payload {
			t.Fatalf("echoed %d bytes (%v), want the %d sent", len(got), err, len(payload))
		}
		h.idle(t)
	}

	pipes := h.metric(t, "proxypool_gateway_relay_pipes")
	through(t)
	if n := h.metric(t, "proxypool_gateway_relay_large_buffers"); n < 1 {
		t.Errorf("relay_large_buffers = %v after a bulk tunnel copied through buffers", n)
	}
	if n := h.metric(t, "proxypool_gateway_relay_pipes"); n != pipes {
		t.Errorf("relay_pipes went %v → %v without tunnelSplice", pipes, n)
	}

	cfg, err := config.Parse([]byte(baseConfig + "  tunnelSplice: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.UpdateConfig(cfg); err != nil {
		t.Fatal(err)
	}
	through(t)
	if n := h.metric(t, "proxypool_gateway_relay_pipes"); n < 1 {
		t.Errorf("relay_pipes = %v after a tunnel with tunnelSplice", n)
	}
}
