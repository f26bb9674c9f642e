// Package gwtest provides loopback servers for the gateway's tests: a
// minimal upstream HTTP proxy (absolute-form and CONNECT, Basic
// credentials, half-close), a target that records what reached it, a TCP
// echo server, and snapshot builders. testenv's simulated upstream proxies
// replace the proxy here once that package provides them. It is imported by
// tests only and must never be imported by production code.
package gwtest

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// UpstreamHeader is added by UpstreamProxy to every request it forwards.
const UpstreamHeader = "X-Upstream-Proxy"

// UpstreamProxy is a minimal HTTP forward proxy on loopback.
type UpstreamProxy struct {
	Name       string
	User, Pass string
	Host       string
	Port       uint16

	conns    atomic.Int64
	requests atomic.Int64
	mu       sync.Mutex
	seen     []Seen
	srv      *httptest.Server
	rt       *http.Transport
}

var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// NewUpstreamProxy starts a proxy named name; with a user it demands Basic
// credentials and answers 407 without them.
func NewUpstreamProxy(t testing.TB, name, user, pass string) *UpstreamProxy {
	t.Helper()
	p := &UpstreamProxy{Name: name, User: user, Pass: pass}
	p.rt = &http.Transport{Proxy: nil, DisableCompression: true}
	p.srv = httptest.NewUnstartedServer(http.HandlerFunc(p.serve))
	p.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}
	p.srv.Start()
	t.Cleanup(func() { p.srv.Close(); p.rt.CloseIdleConnections() })
	p.Host, p.Port = splitAddr(t, p.srv.Listener.Addr().String())
	return p
}

// Conns is the number of client connections the proxy accepted.
func (p *UpstreamProxy) Conns() int64 { return p.conns.Load() }

// Requests is the number of requests (including CONNECTs) it served.
func (p *UpstreamProxy) Requests() int64 { return p.requests.Load() }

// Close stops the proxy; its port then refuses connections.
func (p *UpstreamProxy) Close() { p.srv.CloseClientConnections(); p.srv.Close() }

// Seen returns the requests the proxy received, headers as they arrived.
func (p *UpstreamProxy) Seen() []Seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Seen(nil), p.seen...)
}

func (p *UpstreamProxy) serve(w http.ResponseWriter, r *http.Request) {
	p.requests.Add(1)
	p.mu.Lock()
	p.seen = append(p.seen, Seen{Method: r.Method, Path: r.URL.String(), Header: r.Header.Clone()})
	p.mu.Unlock()
	if p.User != "" {
		u, pw, ok := parseProxyBasic(r.Header.Get("Proxy-Authorization"))
		if !ok || u != p.User || pw != p.Pass {
			w.Header().Set("Proxy-Authenticate", `Basic realm="upstream"`)
			w.WriteHeader(http.StatusProxyAuthRequired)
			return
		}
	}
	if r.Method == http.MethodConnect {
		p.connect(w, r)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Set(UpstreamHeader, p.Name)
	resp, err := p.rt.RoundTrip(out)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vv := range resp.Header {
		w.Header()[k] = vv
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

func (p *UpstreamProxy) connect(w http.ResponseWriter, r *http.Request) {
	target, err := net.DialTimeout("tcp", r.Host, 5*time.Second)
	if err != nil {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	client, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		target.Close()
		return
	}
	_, _ = client.Write([]byte("HTTP/1.1 200 OK\r\n\r\n"))
	Pipe(client, target)
}

// Pipe copies both ways with half-close and closes both when done.
func Pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			_ = dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

func parseProxyBasic(h string) (user, pass string, ok bool) {
	req := &http.Request{Header: http.Header{"Authorization": {h}}}
	return req.BasicAuth()
}

// Proxy returns the domain proxy for p in upstream, AVAILABLE and usable
// for an hour from now.
func (p *UpstreamProxy) Proxy(upstream string, now time.Time) proxy.Proxy {
	return MakeProxy(upstream, p.Host, p.Port, p.User, p.Pass, now)
}

// MakeProxy builds an AVAILABLE http proxy usable for an hour from now.
func MakeProxy(upstream, host string, port uint16, user, pass string, now time.Time) proxy.Proxy {
	c := proxy.Candidate{Scheme: proxy.SchemeHTTP, Host: host, Port: port, Username: user, Password: pass}
	k := c.Key()
	return proxy.Proxy{
		ID: proxy.MakeID(k), Key: k, Password: pass, Upstream: upstream,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), UsableUntil: now.Add(time.Hour),
		MaxConcurrency: 32, State: proxy.StateAvailable,
	}
}

// Snapshot builds a snapshot with one catch-all least-connections rule over
// the upstreams of proxies (in first-seen order), valid for an hour.
func Snapshot(version uint64, now time.Time, proxies ...proxy.Proxy) *worker.Snapshot {
	var ups []string
	for _, p := range proxies {
		if !contains(ups, p.Upstream) {
			ups = append(ups, p.Upstream)
		}
	}
	if len(ups) == 0 {
		ups = []string{"none"}
	}
	return &worker.Snapshot{
		Version: version, GeneratedAt: now, ValidUntil: now.Add(time.Hour),
		Routings: []routing.Rule{{Name: "default", Upstreams: ups, Strategy: routing.LeastConnections,
			OnUnavailable: routing.Reject, MaxAttempts: 2}},
		Proxies: proxies,
	}
}

func contains(l []string, s string) bool {
	for _, v := range l {
		if v == s {
			return true
		}
	}
	return false
}

// Seen is one request as the target received it.
type Seen struct {
	Method string
	Path   string
	Header http.Header
	Body   string
}

// Target is an HTTP server that records every request and answers 200
// with "hello <path>", echoing the upstream proxy's name in
// X-Seen-Upstream-Proxy.
type Target struct {
	*httptest.Server
	Host string
	Port uint16

	mu   sync.Mutex
	seen []Seen
}

// NewTarget starts a Target.
func NewTarget(t testing.TB) *Target {
	t.Helper()
	tg := &Target{}
	tg.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		tg.mu.Lock()
		tg.seen = append(tg.seen, Seen{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: string(body)})
		tg.mu.Unlock()
		w.Header().Set("X-Seen-Upstream-Proxy", r.Header.Get(UpstreamHeader))
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello "+r.URL.Path)
	}))
	t.Cleanup(tg.Close)
	tg.Host, tg.Port = splitAddr(t, tg.Listener.Addr().String())
	return tg
}

// Seen returns a copy of the requests received so far.
func (tg *Target) Seen() []Seen {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]Seen(nil), tg.seen...)
}

// NewEchoServer starts a TCP server that echoes until the client
// half-closes, then half-closes back. It returns the address.
func NewEchoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	return ln.Addr().String()
}

// ClosedPort returns a loopback port nothing listens on.
func ClosedPort(t testing.TB) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port := splitAddr(t, ln.Addr().String())
	ln.Close()
	return port
}

func splitAddr(t testing.TB, addr string) (string, uint16) {
	t.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return h, uint16(n)
}

// HasHeader reports whether h has name (any case).
func HasHeader(h http.Header, name string) bool {
	_, ok := h[textproto.CanonicalMIMEHeaderKey(name)]
	return ok
}

// Eventually polls cond until it holds or the deadline passes.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Metric reads one counter or gauge from g: the series of name whose labels
// include every name/value pair given; 0 when absent.
func Metric(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue series
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				return float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return 0
}
