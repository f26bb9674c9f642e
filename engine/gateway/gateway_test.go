package gateway_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
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

// start serves a gateway built from yaml (baseConfig when empty) on a
// loopback listener.
func start(t *testing.T, yaml string) *harness {
	t.Helper()
	if yaml == "" {
		yaml = baseConfig
	}
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{prom: prometheus.NewRegistry(), sink: &sink{}, served: make(chan error, 1)}
	h.g, err = gateway.New(gateway.Options{Config: cfg, Registry: h.prom, Outcomes: h.sink, OutcomeFlushInterval: 10 * time.Millisecond})
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

func do(t *testing.T, c *http.Client, method, url string, body io.Reader) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
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

func threeProxies(t *testing.T) []*gwtest.UpstreamProxy {
	return []*gwtest.UpstreamProxy{
		gwtest.NewUpstreamProxy(t, "up1", "u1", "p1"),
		gwtest.NewUpstreamProxy(t, "up2", "u2", "p2"),
		gwtest.NewUpstreamProxy(t, "up3", "u3", "p3"),
	}
}

func snapshotOf(version uint64, ups ...*gwtest.UpstreamProxy) *worker.Snapshot {
	now := time.Now()
	var ps []proxy.Proxy
	for _, u := range ups {
		ps = append(ps, u.Proxy("vendor", now))
	}
	return gwtest.Snapshot(version, now, ps...)
}

func TestGETThroughUpstreamProxy(t *testing.T) {
	h := start(t, "")
	tg := gwtest.NewTarget(t)
	ups := threeProxies(t)
	h.apply(t, snapshotOf(1, ups...))
	names := map[string]bool{"up1": true, "up2": true, "up3": true}
	for i := range 6 {
		resp, body := do(t, h.client(""), http.MethodGet, tg.URL+"/page"+strconv.Itoa(i), nil)
		if resp.StatusCode != 200 || body != "hello /page"+strconv.Itoa(i) {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		seen := tg.Seen()
		if via := seen[len(seen)-1].Header.Get(gwtest.UpstreamHeader); !names[via] {
			t.Fatalf("target saw upstream %q", via)
		}
		if resp.Header.Get("X-Seen-Upstream-Proxy") == "" {
			t.Fatal("response lost the target's headers")
		}
		h.idle(t)
	}
	// Upstream proxies got their own credentials.
	for _, u := range ups {
		for _, s := range u.Seen() {
			want := "Basic " + base64.StdEncoding.EncodeToString([]byte(u.User+":"+u.Pass))
			if got := s.Header.Get("Proxy-Authorization"); got != want {
				t.Fatalf("%s got Proxy-Authorization %q", u.Name, got)
			}
		}
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

func TestHopByHopAndProxyCredentialsNeverForwarded(t *testing.T) {
	h := start(t, authConfig(t))
	tg := gwtest.NewTarget(t)
	up := gwtest.NewUpstreamProxy(t, "up1", "u1", "p1")
	h.apply(t, snapshotOf(1, up))

	conn, err := net.Dial("tcp", h.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	clientAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("client:client-pass"))
	fmt.Fprintf(conn, "GET %s/h HTTP/1.1\r\nHost: %s\r\n"+
		"Proxy-Authorization: %s\r\n"+
		"Proxy-Connection: keep-alive\r\n"+
		"Connection: keep-alive, X-Hop-Secret\r\n"+
		"X-Hop-Secret: 1\r\n"+
		"Keep-Alive: timeout=300\r\n"+
		"TE: trailers\r\n"+
		"Upgrade: websocket\r\n"+
		"X-End-To-End: kept\r\n\r\n", tg.URL, tg.Listener.Addr(), clientAuth)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d (%s)", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	stripped := []string{"Proxy-Connection", "X-Hop-Secret", "Keep-Alive", "Te", "Upgrade"}
	// Gateway to upstream: no client credentials, no hop-by-hop header.
	us := up.Seen()
	if len(us) != 1 {
		t.Fatalf("upstream saw %d requests", len(us))
	}
	if got := us[0].Header.Get("Proxy-Authorization"); got == clientAuth || got == "" {
		t.Fatalf("upstream got Proxy-Authorization %q, want its own credentials", got)
	}
	for _, name := range stripped {
		if gwtest.HasHeader(us[0].Header, name) {
			t.Fatalf("upstream received %s", name)
		}
	}
	if c := us[0].Header.Get("Connection"); strings.Contains(strings.ToLower(c), "x-hop") {
		t.Fatalf("upstream received Connection %q", c)
	}
	// And end to end, the target.
	ts := tg.Seen()
	for _, name := range append(stripped, "Proxy-Authorization") {
		if gwtest.HasHeader(ts[0].Header, name) {
			t.Fatalf("target received %s", name)
		}
	}
	if ts[0].Header.Get("X-End-To-End") != "kept" {
		t.Fatal("end-to-end header lost")
	}
	if gwtest.HasHeader(us[0].Header, "User-Agent") {
		t.Fatalf("gateway added User-Agent %q", us[0].Header.Get("User-Agent"))
	}
}

// connect opens a CONNECT tunnel through the gateway; first is written in
// the same segment as the CONNECT request (pipelined).
func connect(t *testing.T, gw, authority, first string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", gw)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n%s", authority, authority, first)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT status %d reason %q", resp.StatusCode, resp.Header.Get("X-Proxypool-Reason"))
	}
	return conn, br
}

func TestCONNECTTunnel(t *testing.T) {
	h := start(t, "")
	tg := gwtest.NewTarget(t)
	h.apply(t, snapshotOf(1, threeProxies(t)...))

	t.Run("http inside the tunnel", func(t *testing.T) {
		conn, br := connect(t, h.addr, tg.Listener.Addr().String(), "")
		fmt.Fprintf(conn, "GET /inside HTTP/1.1\r\nHost: target\r\nConnection: close\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "hello /inside" {
			t.Fatalf("tunnelled body %q", body)
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

// withDead returns a snapshot of one live proxy and one whose port
// refuses connections.
func withDead(t *testing.T, version uint64, live *gwtest.UpstreamProxy) (*worker.Snapshot, proxy.ID) {
	now := time.Now()
	dead := gwtest.MakeProxy("vendor", "127.0.0.1", gwtest.ClosedPort(t), "", "", now)
	return gwtest.Snapshot(version, now, live.Proxy("vendor", now), dead), dead.ID
}

func TestGETRetriedOnSecondProxy(t *testing.T) {
	h := start(t, "")
	tg := gwtest.NewTarget(t)
	ws, deadID := withDead(t, 1, gwtest.NewUpstreamProxy(t, "live", "", ""))
	h.apply(t, ws)
	c := h.client("")
	// The first choice is random; 40 requests hit the dead proxy first
	// with probability 1-2^-40. Every one must succeed.
	for range 40 {
		resp, body := do(t, c, http.MethodGet, tg.URL+"/r", nil)
		if resp.StatusCode != 200 || body != "hello /r" {
			t.Fatalf("got %d %q (%s)", resp.StatusCode, body, resp.Header.Get("X-Proxypool-Reason"))
		}
	}
	if r := h.metric(t, "proxypool_gateway_retries_total"); r == 0 {
		t.Fatal("no request was retried")
	}
	h.idle(t)
	gwtest.Eventually(t, "dial failure reported", func() bool {
		for _, o := range h.sink.outcomes() {
			if o.Proxy == deadID && !o.Success && o.Phase == worker.PhaseDial {
				return true
			}
		}
		return false
	})
}

func TestPOSTNeverRetried(t *testing.T) {
	h := start(t, "")
	tg := gwtest.NewTarget(t)
	ws, _ := withDead(t, 1, gwtest.NewUpstreamProxy(t, "live", "", ""))
	h.apply(t, ws)
	c := h.client("")
	var failed, ok int
	for i := 0; i < 64 && failed == 0; i++ {
		resp, _ := do(t, c, http.MethodPost, tg.URL+"/p", strings.NewReader("payload"))
		switch resp.StatusCode {
		case 200:
			ok++
		case 502:
			failed++
			if r := resp.Header.Get("X-Proxypool-Reason"); r != "upstream-dial" {
				t.Fatalf("502 reason %q", r)
			}
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if failed == 0 {
		t.Fatal("no POST ever chose the dead proxy")
	}
	if r := h.metric(t, "proxypool_gateway_retries_total"); r != 0 {
		t.Fatalf("POST retried %v times", r)
	}
	posts := 0
	for _, s := range tg.Seen() {
		if s.Method == http.MethodPost && s.Body == "payload" {
			posts++
		}
	}
	if posts != ok {
		t.Fatalf("target saw %d POSTs for %d successes", posts, ok)
	}
	h.idle(t)
}

func TestClientAuth(t *testing.T) {
	h := start(t, authConfig(t))
	tg := gwtest.NewTarget(t)
	h.apply(t, snapshotOf(1, gwtest.NewUpstreamProxy(t, "up1", "", "")))
	tests := []struct {
		name     string
		userinfo string
		status   int
	}{
		{"no credentials", "", http.StatusProxyAuthRequired},
		{"wrong password", "client:nope", http.StatusProxyAuthRequired},
		{"unknown user", "mallory:client-pass", http.StatusProxyAuthRequired},
		{"valid", "client:client-pass", http.StatusOK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, _ := do(t, h.client(tc.userinfo), http.MethodGet, tg.URL+"/a", nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if tc.status == http.StatusProxyAuthRequired && resp.Header.Get("Proxy-Authenticate") != `Basic realm="proxypool"` {
				t.Fatalf("Proxy-Authenticate = %q", resp.Header.Get("Proxy-Authenticate"))
			}
		})
	}
	if n := len(tg.Seen()); n != 1 {
		t.Fatalf("target saw %d requests, want only the authenticated one", n)
	}
}

func TestRefusals(t *testing.T) {
	tg := gwtest.NewTarget(t)
	up := gwtest.NewUpstreamProxy(t, "up1", "", "")
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
				resp, _ = do(t, h.client(""), http.MethodGet, tg.URL+"/x", nil)
			} else {
				conn, err := net.Dial("tcp", h.addr)
				if err != nil {
					t.Fatal(err)
				}
				defer conn.Close()
				io.WriteString(conn, tc.raw)
				resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
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
	if n := len(tg.Seen()); n != 0 {
		t.Fatalf("target saw %d refused requests", n)
	}
}

func TestSnapshotSwap(t *testing.T) {
	h := start(t, "")
	tg := gwtest.NewTarget(t)
	up1 := gwtest.NewUpstreamProxy(t, "up1", "", "")
	up2 := gwtest.NewUpstreamProxy(t, "up2", "", "")
	via := func() string {
		resp, _ := do(t, h.client(""), http.MethodGet, tg.URL+"/s", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.Header.Get("X-Seen-Upstream-Proxy")
	}
	h.apply(t, snapshotOf(1, up1))
	if v := via(); v != "up1" {
		t.Fatalf("v1 went via %q", v)
	}
	h.apply(t, snapshotOf(2, up2))
	for range 3 {
		if v := via(); v != "up2" {
			t.Fatalf("v2 went via %q", v)
		}
	}
	var ve *gateway.VersionError
	if err := h.g.Apply(context.Background(), snapshotOf(2, up1)); !errors.As(err, &ve) {
		t.Fatalf("same version: %v", err)
	}
	if err := h.g.Apply(context.Background(), snapshotOf(1, up1)); !errors.As(err, &ve) {
		t.Fatalf("older version: %v", err)
	}
	if v := via(); v != "up2" {
		t.Fatalf("refused snapshot took effect: via %q", v)
	}
	if got := h.metric(t, "proxypool_gateway_snapshot_version"); got != 2 {
		t.Fatalf("snapshot_version = %v", got)
	}
	h.idle(t)
}

func TestDrainClosesTunnelsAtDeadline(t *testing.T) {
	h := start(t, "")
	h.apply(t, snapshotOf(1, gwtest.NewUpstreamProxy(t, "up1", "", "")))
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
	tg := gwtest.NewTarget(t)
	h.apply(t, snapshotOf(1, gwtest.NewUpstreamProxy(t, "up1", "", "")))
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cfg, err := config.Parse([]byte(authConfig(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.g.UpdateConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL+"/", nil); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("after reload: status %d, want 407", resp.StatusCode)
	}
	if resp, _ := do(t, h.client("client:client-pass"), http.MethodGet, tg.URL+"/", nil); resp.StatusCode != 200 {
		t.Fatalf("after reload with credentials: status %d", resp.StatusCode)
	}
	// A config the gateway cannot serve is refused and changes nothing.
	bad := *cfg
	bad.Gateway.Auth.Mode = "bearer"
	if err := h.g.UpdateConfig(&bad); err == nil {
		t.Fatal("unsupported auth mode accepted")
	}
	if resp, _ := do(t, h.client(""), http.MethodGet, tg.URL+"/", nil); resp.StatusCode != http.StatusProxyAuthRequired {
		t.Fatalf("refused reload changed auth: status %d", resp.StatusCode)
	}
}

func TestCONNECTRetriedBeforeItsResponse(t *testing.T) {
	h := start(t, "")
	echo := gwtest.NewEchoServer(t)
	ws, _ := withDead(t, 1, gwtest.NewUpstreamProxy(t, "live", "", ""))
	h.apply(t, ws)
	for range 40 {
		conn, br := connect(t, h.addr, echo, "")
		io.WriteString(conn, "ok")
		conn.(*net.TCPConn).CloseWrite()
		if got, err := io.ReadAll(br); err != nil || string(got) != "ok" {
			t.Fatalf("echo %q %v", got, err)
		}
		conn.Close()
	}
	if r := h.metric(t, "proxypool_gateway_retries_total"); r == 0 {
		t.Fatal("no CONNECT was retried")
	}
	h.idle(t)
}

// wildcardAddr pretends a loopback listener is bound to every interface.
type wildcardAddr struct{ net.Listener }

func (wildcardAddr) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4zero, Port: 8080} }

func TestStrictModeRefusesOpenListener(t *testing.T) {
	cfg, err := config.Parse([]byte(baseConfig))
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
	if err := g.Serve(context.Background(), wildcardAddr{ln}); err == nil || !strings.Contains(err.Error(), "strict mode") {
		t.Fatalf("serve on an open listener: %v", err)
	}
}
