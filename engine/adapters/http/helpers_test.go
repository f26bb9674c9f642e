package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Fixed instants: the tests never read the wall clock for assertions.
var (
	t0      = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	fixedTS = func() time.Time { return t0 }
)

// fakeExtractor records the last request and answers with res/err.
type fakeExtractor struct {
	mu   sync.Mutex
	last extraction.Request
	n    int
	res  extraction.Result
	err  error
}

func (f *fakeExtractor) Extract(_ context.Context, req extraction.Request) (extraction.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.last, f.n = req, f.n+1
	return f.res, f.err
}

func (f *fakeExtractor) calls() (extraction.Request, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.last, f.n
}

// fakeAdmin answers every read with the canned values and err, and
// records the last write.
type fakeAdmin struct {
	mu        sync.Mutex
	err       error
	status    controller.Status
	upstreams []controller.UpstreamStatus
	routings  []controller.RoutingStatus
	proxies   []controller.ProxyView
	audit     []management.AuditEntry

	calls   int
	actor   string
	name    string
	enabled bool
	index   int
	filter  activitypool.Filter
	limit   int
}

func (f *fakeAdmin) record(fn func()) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if fn != nil {
		fn()
	}
	return f.err
}

func (f *fakeAdmin) Status(context.Context) (controller.Status, error) {
	return f.status, f.record(nil)
}
func (f *fakeAdmin) Upstreams(context.Context) ([]controller.UpstreamStatus, error) {
	return f.upstreams, f.record(nil)
}
func (f *fakeAdmin) SetUpstreamEnabled(_ context.Context, actor, name string, enabled bool) error {
	return f.record(func() { f.actor, f.name, f.enabled = actor, name, enabled })
}
func (f *fakeAdmin) Routings(context.Context) ([]controller.RoutingStatus, error) {
	return f.routings, f.record(nil)
}
func (f *fakeAdmin) SwitchRouting(_ context.Context, actor, name string, index int) error {
	return f.record(func() { f.actor, f.name, f.index = actor, name, index })
}
func (f *fakeAdmin) Proxies(_ context.Context, fl activitypool.Filter) ([]controller.ProxyView, error) {
	return f.proxies, f.record(func() { f.filter = fl })
}
func (f *fakeAdmin) Audit(_ context.Context, limit int) ([]management.AuditEntry, error) {
	return f.audit, f.record(func() { f.limit = limit })
}

type fakeReloader struct {
	mu    sync.Mutex
	err   error
	actor string
}

func (f *fakeReloader) Reload(_ context.Context, actor string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.actor = actor
	return f.err
}

type fakeReady struct {
	mu    sync.Mutex
	ready bool
}

func (f *fakeReady) Ready() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ready
}

func (f *fakeReady) set(v bool) {
	f.mu.Lock()
	f.ready = v
	f.mu.Unlock()
}

var (
	_ Extractor = (*fakeExtractor)(nil)
	_ Admin     = (*fakeAdmin)(nil)
	_ Reloader  = (*fakeReloader)(nil)
	_ Readiness = (*fakeReady)(nil)
)

// secret returns a resolved config.Secret holding value.
func secret(t testing.TB, value string) config.Secret {
	t.Helper()
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte(value), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := config.ParseSecretRef("file:" + p)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve(); err != nil {
		t.Fatal(err)
	}
	return s
}

func openSurface() config.Surface { return config.Surface{Auth: config.Auth{Mode: "none"}} }

// serve starts h on a real loopback listener for the test.
func serve(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

// call is one HTTP exchange.
type call struct {
	method  string
	path    string
	body    string
	ctype   string // default application/json when body is set
	headers map[string]string
}

type reply struct {
	code   int
	header http.Header
	body   []byte
}

func (r reply) problem(t testing.TB) problem {
	t.Helper()
	var p problem
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("decoding problem %q: %v", r.body, err)
	}
	return p
}

func do(t testing.TB, base string, c call) reply {
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, base+c.path, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		ct := c.ctype
		if ct == "" {
			ct = contentJSON
		}
		req.Header.Set("Content-Type", ct)
	} else if c.ctype != "" {
		req.Header.Set("Content-Type", c.ctype)
	}
	for k, v := range c.headers {
		if k == "Host" {
			req.Host = v
			continue
		}
		// "\n" separates repeated header lines.
		req.Header.Del(k)
		for _, line := range strings.Split(v, "\n") {
			req.Header.Add(k, line)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	return reply{code: resp.StatusCode, header: resp.Header, body: b}
}

// checkProblem asserts the RFC 9457 shape of an error answer.
func checkProblem(t testing.TB, r reply) problem {
	t.Helper()
	if ct := r.header.Get("Content-Type"); ct != contentProblem {
		t.Fatalf("Content-Type = %q, want %s (body %s)", ct, contentProblem, r.body)
	}
	var raw map[string]any
	dec := json.NewDecoder(bytes.NewReader(r.body))
	if err := dec.Decode(&raw); err != nil {
		t.Fatalf("problem body %q: %v", r.body, err)
	}
	for _, k := range []string{"type", "title", "status"} {
		if _, ok := raw[k]; !ok {
			t.Fatalf("problem %s lacks %q", r.body, k)
		}
	}
	p := r.problem(t)
	if p.Status != r.code || p.Title != http.StatusText(r.code) || !strings.HasPrefix(p.Type, problemTypeBase) {
		t.Fatalf("problem %+v does not match status %d", p, r.code)
	}
	return p
}

func newRegistry() *prometheus.Registry { return prometheus.NewRegistry() }

// quiet keeps expected error logs out of the test output.
var quiet = slog.New(slog.DiscardHandler)

func testProxy(host, user, pass string) proxy.Proxy {
	k := proxy.Key{Scheme: proxy.SchemeHTTP, Host: host, Port: 8000, Username: user}
	return proxy.Proxy{
		ID: proxy.MakeID(k), Key: k, Password: pass, Upstream: "vendor-a",
		ExpiresAt: t0.Add(90*time.Second + 500*time.Millisecond), UsableUntil: t0.Add(75 * time.Second),
		State: proxy.StateExtracted, Region: "eu", Carrier: "acme",
	}
}
