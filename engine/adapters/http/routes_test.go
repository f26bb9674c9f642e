package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller"
	ctlextraction "github.com/proxypool/proxypool/engine/controller/extraction"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

const (
	distKey    = "k-dist-0123456789"
	adminToken = "t-admin-0123456789"
	// outsider is resolved from X-Forwarded-For sent through the trusted
	// loopback peer, and is not in allowCIDRs.
	outsider = "203.0.113.9"
)

// gate is an unchecked collector that blocks Collect while armed, so the
// scrape bound can be hit deterministically.
type gate struct {
	mu      sync.Mutex
	release chan struct{}
	entered chan struct{}
}

func (g *gate) Describe(chan<- *prometheus.Desc) {}

func (g *gate) Collect(chan<- prometheus.Metric) {
	g.mu.Lock()
	release, entered := g.release, g.entered
	g.mu.Unlock()
	if release != nil {
		entered <- struct{}{}
		<-release
	}
}

func (g *gate) arm() (entered, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.release, g.entered = make(chan struct{}), make(chan struct{}, 1)
	return g.entered, g.release
}

func (g *gate) disarm() {
	g.mu.Lock()
	g.release, g.entered = nil, nil
	g.mu.Unlock()
}

// fixture is every surface on loopback, sharing one registry, with the
// fakes behind them.
type fixture struct {
	reg      *prometheus.Registry
	ex       *fakeExtractor
	admin    *fakeAdmin
	reloader *fakeReloader
	ready    *fakeReady
	gate     *gate
	dist     *DistributionHandler
	adm      *AdminHandler
	ops      *OpsHandler
	urls     map[string]string
}

func guardedSurface(t testing.TB, a config.Auth, maxBody int64) config.Surface {
	return config.Surface{
		Auth:           a,
		Access:         config.Access{AllowCIDRs: []string{"127.0.0.0/8", "::1"}},
		TrustedProxies: []string{"127.0.0.1", "::1"},
		MaxBodyBytes:   maxBody,
	}
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{
		reg:      newRegistry(),
		ex:       &fakeExtractor{},
		admin:    &fakeAdmin{},
		reloader: &fakeReloader{},
		ready:    &fakeReady{ready: true},
	}
	f.gate = &gate{}
	gated := prometheus.NewRegistry()
	gated.MustRegister(f.gate)
	var err error
	f.dist, err = NewDistribution(DistributionOptions{
		Extractor: f.ex,
		Surface:   guardedSurface(t, config.Auth{Mode: "apiKey", APIKeys: []config.APIKey{{Name: "ci", Key: secret(t, distKey)}}}, 1024),
		Extraction: config.Extraction{
			MaxCount: 50, MinRemainingTTL: 30 * time.Second, MaxHealthCheckAge: 5 * time.Minute,
			ReserveForGateway: 3, IdempotencyTTL: 10 * time.Minute,
		},
		Registry: f.reg,
		Logger:   quiet,
		Now:      fixedTS,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.adm, err = NewAdmin(AdminOptions{
		Admin:    f.admin,
		Reloader: f.reloader,
		Surface:  guardedSurface(t, config.Auth{Mode: "bearer", Tokens: []config.APIKey{{Name: "ops-team", Key: secret(t, adminToken)}}}, 256),
		Registry: f.reg,
		Logger:   quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.ops, err = NewOps(OpsOptions{Readiness: f.ready, Gatherer: prometheus.Gatherers{f.reg, gated}, Registry: f.reg, Logger: quiet, MaxScrapes: 1})
	if err != nil {
		t.Fatal(err)
	}
	f.urls = map[string]string{
		surfaceDistribution: serve(t, f.dist).URL,
		surfaceAdmin:        serve(t, f.adm).URL,
		surfaceOps:          serve(t, f.ops).URL,
	}
	return f
}

// reset clears the fakes' canned answers between cases.
func (f *fixture) reset() {
	*f.ex = fakeExtractor{}
	*f.admin = fakeAdmin{}
	*f.reloader = fakeReloader{}
	f.ready.set(true)
	f.gate.disarm()
}

func (f *fixture) mux(surface string) *http.ServeMux {
	switch surface {
	case surfaceDistribution:
		return f.dist.mux
	case surfaceAdmin:
		return f.adm.mux
	}
	return f.ops.mux
}

// scenario is one request against one surface and its expected status.
type scenario struct {
	name    string
	surface string
	call    call
	anon    bool // send no credentials
	setup   func(t *testing.T, f *fixture) (cleanup func())
	code    int
	check   func(t *testing.T, f *fixture, r reply)
}

func (s scenario) withAuth() call {
	c := s.call
	h := map[string]string{}
	if !s.anon {
		switch s.surface {
		case surfaceDistribution:
			h["X-API-Key"] = distKey
		case surfaceAdmin:
			h["Authorization"] = "Bearer " + adminToken
		}
	}
	for k, v := range c.headers {
		h[k] = v
	}
	c.headers = h
	return c
}

var (
	errBoom        = errors.New("database exploded: password=hunter2")
	errUnavailable = fmt.Errorf("reading cursor: %w", management.ErrUnavailable)
)

func extractBodyJSON(count int, fulfillment string) string {
	return fmt.Sprintf(`{"count":%d,"filters":{"protocol":"http","region":"eu","carrier":"","upstreams":["vendor-a"],"minRemainingTTLSeconds":60,"maxHealthCheckAgeSeconds":600},"fulfillment":%q}`, count, fulfillment)
}

func distributionScenarios() []scenario {
	ex := func(body string) call { return call{method: "POST", path: "/v1/extract", body: body} }
	ok := ex(extractBodyJSON(2, "partial"))
	setErr := func(err error) func(*testing.T, *fixture) func() {
		return func(_ *testing.T, f *fixture) func() { f.ex.err = err; return nil }
	}
	notCalled := func(t *testing.T, f *fixture, _ reply) {
		if _, n := f.ex.calls(); n != 0 {
			t.Errorf("extractor called %d times", n)
		}
	}
	return []scenario{
		{name: "partial", call: ok, code: 200,
			setup: func(_ *testing.T, f *fixture) func() {
				f.ex.res = extraction.Result{Requested: 2, Returned: 1, Proxies: []proxy.Proxy{testProxy("203.0.113.7", "user", "p@ss:w/rd")}}
				return nil
			},
			check: func(t *testing.T, f *fixture, r reply) {
				var got extractResponse
				if err := json.Unmarshal(r.body, &got); err != nil {
					t.Fatal(err)
				}
				want := extractResponse{Requested: 2, Returned: 1, Proxies: []proxyJSON{{
					URL: "http://user:p%40ss%3Aw%2Frd@203.0.113.7:8000", Scheme: "http", Host: "203.0.113.7", Port: 8000,
					Username: "user", Password: "p@ss:w/rd", ExpiresAt: t0.Add(90*time.Second + 500*time.Millisecond),
					RemainingTTLSeconds: 90, Protocol: "http", Region: "eu", Carrier: "acme", Upstream: "vendor-a",
				}}}
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("body = %+v\nwant   %+v", got, want)
				}
				if r.header.Get(HeaderIdempotentReplayed) != "" {
					t.Error("Idempotent-Replayed set on a fresh result")
				}
				req, _ := f.ex.calls()
				wantReq := extraction.Request{
					Client: "ci", Count: 2, Fulfillment: extraction.Partial,
					Filters: extraction.Filters{Protocol: "http", Region: "eu", Upstreams: []string{"vendor-a"},
						MinRemainingTTL: time.Minute, MaxHealthCheckAge: 5 * time.Minute},
					ReserveForGateway: 3, IdempotencyTTL: 10 * time.Minute,
				}
				if fmt.Sprint(req) != fmt.Sprint(wantReq) {
					t.Errorf("extractor got %+v\nwant %+v", req, wantReq)
				}
			}},
		{name: "replay with idempotency key", code: 200,
			call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{HeaderIdempotencyKey: "order-42"}},
			setup: func(_ *testing.T, f *fixture) func() {
				f.ex.res = extraction.Result{Requested: 1, Returned: 1, Replayed: true, Proxies: []proxy.Proxy{testProxy("203.0.113.8", "", "")}}
				return nil
			},
			check: func(t *testing.T, f *fixture, r reply) {
				if r.header.Get(HeaderIdempotentReplayed) != "true" {
					t.Errorf("Idempotent-Replayed = %q", r.header.Get(HeaderIdempotentReplayed))
				}
				req, _ := f.ex.calls()
				if req.IdempotencyKey != "order-42" || req.Fulfillment != extraction.Partial || req.Filters.MinRemainingTTL != 30*time.Second {
					t.Errorf("extractor got %+v", req)
				}
				if !strings.Contains(string(r.body), `"url":"http://203.0.113.8:8000"`) {
					t.Errorf("body %s", r.body)
				}
			}},
		{name: "unknown field", call: ex(`{"count":1,"cuont":2}`), code: 400, check: notCalled},
		{name: "unknown filter field", call: ex(`{"count":1,"filters":{"country":"de"}}`), code: 400, check: notCalled},
		{name: "wrong type", call: ex(`{"count":"1"}`), code: 400, check: notCalled},
		{name: "fractional count", call: ex(`{"count":1.5}`), code: 400, check: notCalled},
		{name: "trailing data", call: ex(`{"count":1} {"count":2}`), code: 400, check: notCalled},
		{name: "trailing garbage", call: ex(`{"count":1}x`), code: 400, check: notCalled},
		{name: "truncated", call: ex(`{"count":1`), code: 400, check: notCalled},
		{name: "not an object", call: ex(`[1]`), code: 400, check: notCalled},
		{name: "count zero", call: ex(`{"count":0}`), code: 400, check: notCalled},
		{name: "count above maxCount", call: ex(`{"count":51}`), code: 400, check: notCalled},
		{name: "bad fulfillment", call: ex(`{"count":1,"fulfillment":"some"}`), code: 400, check: notCalled},
		{name: "bad protocol", call: ex(`{"count":1,"filters":{"protocol":"ftp"}}`), code: 400, check: notCalled},
		{name: "negative seconds", call: ex(`{"count":1,"filters":{"minRemainingTTLSeconds":-1}}`), code: 400, check: notCalled},
		{name: "huge seconds", call: ex(`{"count":1,"filters":{"maxHealthCheckAgeSeconds":9223372036}}`), code: 400, check: notCalled},
		{name: "empty upstream name", call: ex(`{"count":1,"filters":{"upstreams":[""]}}`), code: 400, check: notCalled},
		{name: "two idempotency keys", code: 400, check: notCalled,
			call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{HeaderIdempotencyKey: "a\nb"}}},
		{name: "idempotency key too long", code: 400, check: notCalled,
			call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{HeaderIdempotencyKey: strings.Repeat("k", 201)}}},
		{name: "missing key", call: ok, anon: true, code: 401, check: func(t *testing.T, f *fixture, r reply) {
			notCalled(t, f, r)
			if got := r.header.Get("WWW-Authenticate"); got != `ApiKey realm="proxypool-distribution"` {
				t.Errorf("WWW-Authenticate = %q", got)
			}
		}},
		{name: "wrong key", call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{"X-API-Key": "nope"}}, code: 401, check: notCalled},
		{name: "client outside allowCIDRs", call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{"X-Forwarded-For": outsider}}, code: 403, check: notCalled},
		{name: "cross-origin browser post", call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, headers: map[string]string{"Sec-Fetch-Site": "cross-site"}}, code: 403, check: notCalled},
		{name: "all or nothing short", call: ex(extractBodyJSON(5, "allOrNothing")), code: 409,
			setup: setErr(fmt.Errorf("extracting: %w", &extraction.InsufficientError{Requested: 5, Available: 2})),
			check: func(t *testing.T, f *fixture, r reply) {
				p := r.problem(t)
				if p.Requested == nil || *p.Requested != 5 || p.Available == nil || *p.Available != 2 {
					t.Errorf("problem %s lacks requested/available", r.body)
				}
				if req, _ := f.ex.calls(); req.Fulfillment != extraction.AllOrNothing {
					t.Errorf("fulfillment %q", req.Fulfillment)
				}
			}},
		{name: "insufficient without counts", call: ex(`{"count":4,"fulfillment":"allOrNothing"}`), code: 409,
			setup: setErr(extraction.ErrInsufficient),
			check: func(t *testing.T, _ *fixture, r reply) {
				if p := r.problem(t); p.Requested == nil || *p.Requested != 4 || p.Available != nil {
					t.Errorf("problem %s", r.body)
				}
			}},
		{name: "oversize body", call: ex(`{"count":1,"filters":{"region":"` + strings.Repeat("x", 2000) + `"}}`), code: 413, check: notCalled},
		{name: "text content type", call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, ctype: "text/plain"}, code: 415, check: notCalled},
		{name: "form content type", call: call{method: "POST", path: "/v1/extract", body: `count=1`, ctype: "application/x-www-form-urlencoded"}, code: 415, check: notCalled},
		{name: "no content type", call: call{method: "POST", path: "/v1/extract"}, code: 415, check: notCalled},
		{name: "json with charset", call: call{method: "POST", path: "/v1/extract", body: `{"count":1}`, ctype: "application/json; charset=utf-8"}, code: 200},
		{name: "idempotency conflict", call: ex(`{"count":1}`), code: 422, setup: setErr(fmt.Errorf("extracting: %w", extraction.ErrIdempotencyConflict))},
		{name: "controller rejects request", call: ex(`{"count":1}`), code: 400,
			setup: setErr(fmt.Errorf("extracting: %w: count 9 exceeds extraction.maxCount 5", controller.ErrInvalidRequest)),
			check: func(t *testing.T, _ *fixture, r reply) {
				if p := r.problem(t); p.Type != problemTypeBase+ptBadRequest || !strings.Contains(p.Detail, "extraction.maxCount") {
					t.Errorf("problem %s", r.body)
				}
				if v := r.header.Get("Retry-After"); v != "" {
					t.Errorf("Retry-After = %q on a 400", v)
				}
			}},
		{name: "rate limited", call: ex(`{"count":1}`), code: 429,
			setup: setErr(fmt.Errorf("extracting: %w", &ctlextraction.RateLimitError{RetryAfter: 12*time.Second + time.Millisecond})),
			check: func(t *testing.T, _ *fixture, r reply) {
				if v := r.header.Get("Retry-After"); v != "13" {
					t.Errorf("Retry-After = %q, want 13", v)
				}
				if p := r.problem(t); p.Type != problemTypeBase+ptRateLimited {
					t.Errorf("problem %s", r.body)
				}
			}},
		{name: "internal error hides detail", call: ex(`{"count":1}`), code: 500, setup: setErr(errBoom),
			check: func(t *testing.T, _ *fixture, r reply) {
				if strings.Contains(string(r.body), "hunter2") || strings.Contains(string(r.body), "database") {
					t.Errorf("500 leaks the cause: %s", r.body)
				}
			}},
		{name: "store unavailable", call: ex(`{"count":1}`), code: 503, setup: setErr(errUnavailable)},
		{name: "store timeout", call: ex(`{"count":1}`), code: 503, setup: setErr(context.DeadlineExceeded)},
	}
}

// adminPath fills {name}.
func adminPath(p string) string { return strings.ReplaceAll(p, "{name}", "alpha") }

func adminScenarios() []scenario {
	var out []scenario
	// Every admin route: auth, access and the two dependency failures.
	for _, r := range adminRoutes {
		c := call{method: r.Method, path: adminPath(r.Path)}
		if strings.HasSuffix(r.Path, "/switch") {
			c.body = `{"index":1}`
		}
		withXFF := c
		withXFF.headers = map[string]string{"X-Forwarded-For": outsider}
		wrongTok := c
		wrongTok.headers = map[string]string{"Authorization": "Bearer " + adminToken + "x"}
		fail := func(err error) func(*testing.T, *fixture) func() {
			return func(_ *testing.T, f *fixture) func() { f.admin.err = err; f.reloader.err = err; return nil }
		}
		out = append(out,
			scenario{name: r.pattern() + " no token", call: c, anon: true, code: 401, check: checkChallenge(`Bearer realm="proxypool-admin"`)},
			scenario{name: r.pattern() + " wrong token", call: wrongTok, code: 401},
			scenario{name: r.pattern() + " outsider", call: withXFF, code: 403},
			scenario{name: r.pattern() + " internal", call: c, code: 500, setup: fail(errBoom)},
			scenario{name: r.pattern() + " unavailable", call: c, code: 503, setup: fail(errUnavailable)},
		)
		if r.Method == http.MethodPost {
			xo := c
			xo.headers = map[string]string{"Origin": "https://evil.example", "Host": "admin.internal"}
			out = append(out, scenario{name: r.pattern() + " cross-origin", call: xo, code: 403})
		}
	}
	get := func(p string) call { return call{method: "GET", path: p} }
	post := func(p, body string) call { return call{method: "POST", path: p, body: body} }
	canned := func(fn func(a *fakeAdmin)) func(*testing.T, *fixture) func() {
		return func(_ *testing.T, f *fixture) func() { fn(f.admin); return nil }
	}
	setErr := func(err error) func(*testing.T, *fixture) func() {
		return canned(func(a *fakeAdmin) { a.err = err })
	}
	noCall := func(t *testing.T, f *fixture, _ reply) {
		if f.admin.calls != 0 {
			t.Errorf("admin called %d times", f.admin.calls)
		}
	}
	wrote := func(name string, enabled bool, index int) func(*testing.T, *fixture, reply) {
		return func(t *testing.T, f *fixture, r reply) {
			if string(r.body) != "{\"ok\":true}\n" {
				t.Errorf("body %q", r.body)
			}
			a := f.admin
			if a.actor != "ops-team" || a.name != name || a.enabled != enabled || a.index != index {
				t.Errorf("admin got actor=%q name=%q enabled=%v index=%d", a.actor, a.name, a.enabled, a.index)
			}
		}
	}
	started := t0.Add(-time.Hour)
	out = append(out,
		scenario{name: "status", call: get("/v1/admin/status"), code: 200,
			setup: canned(func(a *fakeAdmin) {
				a.status = controller.Status{Version: "1.2.3", StartedAt: started, Ready: true, StorageMode: "embedded", Upstreams: 2}
			}),
			check: func(t *testing.T, _ *fixture, r reply) {
				var m map[string]any
				if err := json.Unmarshal(r.body, &m); err != nil {
					t.Fatal(err)
				}
				if m["version"] != "1.2.3" || m["upstreams"] != 2.0 || m["startedAt"] != started.Format(time.RFC3339) {
					t.Errorf("status %s", r.body)
				}
				// Contract: collections are never null.
				if _, ok := m["proxies"].(map[string]any); !ok {
					t.Errorf("proxies is %v", m["proxies"])
				}
				if _, ok := m["workers"].([]any); !ok {
					t.Errorf("workers is %v", m["workers"])
				}
				if _, ok := m["lastReload"]; ok {
					t.Error("lastReload present though nil")
				}
			}},
		scenario{name: "upstreams", call: get("/v1/admin/upstreams"), code: 200,
			setup: canned(func(a *fakeAdmin) {
				a.upstreams = []controller.UpstreamStatus{{Name: "vendor-a", Plugin: "json", Enabled: true, Managed: 3}}
			}),
			check: func(t *testing.T, _ *fixture, r reply) {
				if !strings.HasPrefix(string(r.body), `{"upstreams":[{"name":"vendor-a","plugin":"json","enabled":true,"states":{},"managed":3`) {
					t.Errorf("body %s", r.body)
				}
			}},
		scenario{name: "upstreams empty", call: get("/v1/admin/upstreams"), code: 200,
			check: func(t *testing.T, _ *fixture, r reply) {
				if string(r.body) != "{\"upstreams\":[]}\n" {
					t.Errorf("body %s", r.body)
				}
			}},
		scenario{name: "enable", call: post("/v1/admin/upstreams/vendor-a/enable", ""), code: 200, check: wrote("vendor-a", true, 0)},
		scenario{name: "disable", call: post("/v1/admin/upstreams/vendor-b/disable", ""), code: 200, check: wrote("vendor-b", false, 0)},
		scenario{name: "enable unknown", call: post("/v1/admin/upstreams/nope/enable", ""), code: 404,
			setup: setErr(fmt.Errorf("enabling nope: %w", controller.ErrUnknownUpstream))},
		scenario{name: "disable unknown", call: post("/v1/admin/upstreams/nope/disable", ""), code: 404,
			setup: setErr(fmt.Errorf("disabling nope: %w", controller.ErrUnknownUpstream))},
		scenario{name: "enable malformed name", call: post("/v1/admin/upstreams/BAD%20name/enable", ""), code: 404, check: noCall},
		scenario{name: "disable overlong name", call: post("/v1/admin/upstreams/"+strings.Repeat("a", 64)+"/disable", ""), code: 404, check: noCall},
		scenario{name: "routings", call: get("/v1/admin/routings"), code: 200,
			setup: canned(func(a *fakeAdmin) {
				a.routings = []controller.RoutingStatus{{Name: "seq", Strategy: "sequential", Upstreams: []string{"a", "b"}, CurrentIndex: 1, Current: "b", Generation: 7, OnUnavailable: "reject"}}
			}),
			check: func(t *testing.T, _ *fixture, r reply) {
				want := `{"routings":[{"name":"seq","strategy":"sequential","upstreams":["a","b"],"currentIndex":1,"current":"b","generation":7,"onUnavailable":"reject"}]}` + "\n"
				if string(r.body) != want {
					t.Errorf("body %s", r.body)
				}
			}},
		scenario{name: "switch", call: post("/v1/admin/routings/seq/switch", `{"index":1}`), code: 200, check: wrote("seq", false, 1)},
		scenario{name: "switch index zero", call: post("/v1/admin/routings/seq/switch", `{"index":0}`), code: 200, check: wrote("seq", false, 0)},
		scenario{name: "switch missing index", call: post("/v1/admin/routings/seq/switch", `{}`), code: 400, check: noCall},
		scenario{name: "switch negative index", call: post("/v1/admin/routings/seq/switch", `{"index":-1}`), code: 400, check: noCall},
		scenario{name: "switch unknown field", call: post("/v1/admin/routings/seq/switch", `{"index":1,"force":true}`), code: 400, check: noCall},
		scenario{name: "switch index as string", call: post("/v1/admin/routings/seq/switch", `{"index":"1"}`), code: 400, check: noCall},
		scenario{name: "switch trailing data", call: post("/v1/admin/routings/seq/switch", `{"index":1}{}`), code: 400, check: noCall},
		scenario{name: "switch empty body", call: call{method: "POST", path: "/v1/admin/routings/seq/switch", ctype: contentJSON}, code: 400, check: noCall},
		scenario{name: "switch out of range", call: post("/v1/admin/routings/seq/switch", `{"index":9}`), code: 400,
			setup: setErr(fmt.Errorf("switching seq to 9: %w (2 upstreams)", controller.ErrInvalidSwitch)),
			check: func(t *testing.T, _ *fixture, r reply) {
				if p := r.problem(t); !strings.Contains(p.Detail, "2 upstreams") {
					t.Errorf("detail %q", p.Detail)
				}
			}},
		scenario{name: "switch unknown routing", call: post("/v1/admin/routings/nope/switch", `{"index":1}`), code: 404,
			setup: setErr(fmt.Errorf("switching nope: %w", controller.ErrUnknownRouting))},
		scenario{name: "switch malformed name", call: post("/v1/admin/routings/-x/switch", `{"index":1}`), code: 404, check: noCall},
		scenario{name: "switch oversize", call: post("/v1/admin/routings/seq/switch", `{"index":1`+strings.Repeat(" ", 300)+`}`), code: 413, check: noCall},
		scenario{name: "switch form post", call: call{method: "POST", path: "/v1/admin/routings/seq/switch", body: "index=1", ctype: "application/x-www-form-urlencoded"}, code: 415, check: noCall},
		scenario{name: "reload", call: post("/v1/admin/reload", ""), code: 200,
			check: func(t *testing.T, f *fixture, r reply) {
				if f.reloader.actor != "ops-team" || string(r.body) != "{\"ok\":true}\n" {
					t.Errorf("actor %q body %s", f.reloader.actor, r.body)
				}
			}},
		scenario{name: "reload invalid config", call: post("/v1/admin/reload", ""), code: 422,
			setup: func(_ *testing.T, f *fixture) func() {
				f.reloader.err = fmt.Errorf("reloading: %w", config.Errors{
					{Path: "upstreams[0].fetch.requestInterval", Msg: "must be positive, got 0s"},
					{Msg: "at least one listener is required"},
				})
				return nil
			},
			check: func(t *testing.T, _ *fixture, r reply) {
				p := r.problem(t)
				want := []fieldError{{Path: "upstreams[0].fetch.requestInterval", Message: "must be positive, got 0s"}, {Message: "at least one listener is required"}}
				if !slices.Equal(p.Errors, want) {
					t.Errorf("errors = %+v", p.Errors)
				}
			}},
		scenario{name: "proxies", call: get("/v1/admin/proxies?upstream=vendor-a&state=available,Suspect&state=AVAILABLE&limit=2"), code: 200,
			setup: canned(func(a *fakeAdmin) {
				for _, h := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
					a.proxies = append(a.proxies, controller.ProxyView{ID: proxy.ID("http://user@" + h + ":8000"), Upstream: "vendor-a", Scheme: "http", Host: h, Port: 8000, HasAuth: true, State: "AVAILABLE"})
				}
			}),
			check: func(t *testing.T, f *fixture, r reply) {
				fl := f.admin.filter
				if fl.Upstream != "vendor-a" || fl.Limit != 2 || !slices.Equal(fl.States, []proxy.State{proxy.StateAvailable, proxy.StateSuspect}) {
					t.Errorf("filter %+v", fl)
				}
				var got proxiesResponse
				if err := json.Unmarshal(r.body, &got); err != nil {
					t.Fatal(err)
				}
				if len(got.Proxies) != 2 {
					t.Errorf("returned %d proxies past limit 2", len(got.Proxies))
				}
				for _, k := range []string{"password", "username", "user:"} {
					if strings.Contains(strings.ToLower(string(r.body)), k) {
						t.Errorf("listing contains %q: %s", k, r.body)
					}
				}
			}},
		scenario{name: "proxies defaults", call: get("/v1/admin/proxies"), code: 200,
			check: func(t *testing.T, f *fixture, r reply) {
				if fl := f.admin.filter; fl.Limit != DefaultListLimit || fl.Upstream != "" || fl.States != nil {
					t.Errorf("filter %+v", fl)
				}
				if string(r.body) != "{\"proxies\":[]}\n" {
					t.Errorf("body %s", r.body)
				}
			}},
		scenario{name: "proxies max limit", call: get("/v1/admin/proxies?limit=1000"), code: 200},
		scenario{name: "proxies limit too big", call: get("/v1/admin/proxies?limit=1001"), code: 400, check: noCall},
		scenario{name: "proxies limit zero", call: get("/v1/admin/proxies?limit=0"), code: 400, check: noCall},
		scenario{name: "proxies limit not a number", call: get("/v1/admin/proxies?limit=ten"), code: 400, check: noCall},
		scenario{name: "proxies limit twice", call: get("/v1/admin/proxies?limit=1&limit=2"), code: 400, check: noCall},
		scenario{name: "proxies unknown state", call: get("/v1/admin/proxies?state=BUSY"), code: 400, check: noCall},
		scenario{name: "proxies unknown parameter", call: get("/v1/admin/proxies?states=AVAILABLE"), code: 400, check: noCall},
		scenario{name: "proxies upstream twice", call: get("/v1/admin/proxies?upstream=a&upstream=b"), code: 400, check: noCall},
		scenario{name: "audit", call: get("/v1/admin/audit?limit=1"), code: 200,
			setup: canned(func(a *fakeAdmin) {
				a.audit = []management.AuditEntry{
					{ID: 9, At: t0, Actor: "ops-team", Action: "upstream.disable", Target: "vendor-a", Result: "ok"},
					{ID: 8, At: t0.Add(-time.Minute), Actor: "ops-team", Action: "reload", Result: "ok"},
				}
			}),
			check: func(t *testing.T, f *fixture, r reply) {
				want := `{"entries":[{"id":9,"at":"2030-01-02T03:04:05Z","actor":"ops-team","action":"upstream.disable","target":"vendor-a","result":"ok"}]}` + "\n"
				if f.admin.limit != 1 || string(r.body) != want {
					t.Errorf("limit %d body %s", f.admin.limit, r.body)
				}
			}},
		scenario{name: "audit default limit", call: get("/v1/admin/audit"), code: 200,
			check: func(t *testing.T, f *fixture, _ reply) {
				if f.admin.limit != DefaultListLimit {
					t.Errorf("limit %d", f.admin.limit)
				}
			}},
		scenario{name: "audit limit too big", call: get("/v1/admin/audit?limit=5000"), code: 400, check: noCall},
		scenario{name: "audit unknown parameter", call: get("/v1/admin/audit?since=yesterday"), code: 400, check: noCall},
	)
	return out
}

func checkChallenge(want string) func(*testing.T, *fixture, reply) {
	return func(t *testing.T, _ *fixture, r reply) {
		if got := r.header.Values("WWW-Authenticate"); !slices.Equal(got, []string{want}) {
			t.Errorf("WWW-Authenticate = %q, want %q", got, want)
		}
	}
}

func opsScenarios() []scenario {
	return []scenario{
		{name: "healthz", call: call{method: "GET", path: "/healthz"}, code: 200,
			check: func(t *testing.T, _ *fixture, r reply) {
				if string(r.body) != "ok\n" {
					t.Errorf("body %q", r.body)
				}
			}},
		{name: "healthz while not ready", call: call{method: "GET", path: "/healthz"}, code: 200,
			setup: func(_ *testing.T, f *fixture) func() { f.ready.set(false); return nil }},
		{name: "readyz", call: call{method: "GET", path: "/readyz"}, code: 200},
		{name: "readyz not ready", call: call{method: "GET", path: "/readyz"}, code: 503,
			setup: func(_ *testing.T, f *fixture) func() { f.ready.set(false); return nil }},
		{name: "metrics", call: call{method: "GET", path: "/metrics"}, code: 200,
			check: func(t *testing.T, _ *fixture, r reply) {
				if !strings.Contains(string(r.body), "proxypool_api_requests_total{") {
					t.Errorf("metrics lack proxypool_api_requests_total")
				}
			}},
		{name: "metrics scrape bound", call: call{method: "GET", path: "/metrics"}, code: 503,
			setup: func(t *testing.T, f *fixture) func() {
				entered, release := f.gate.arm()
				done := make(chan reply, 1)
				go func() { done <- do(t, f.urls[surfaceOps], call{method: "GET", path: "/metrics"}) }()
				<-entered // the first scrape holds the only slot
				return func() {
					close(release)
					if r := <-done; r.code != 200 {
						t.Errorf("blocked scrape finished with %d", r.code)
					}
				}
			}},
	}
}

// TestRoutes runs every scenario on real loopback listeners and then
// checks, from the metrics the handlers recorded, that the set of
// (route, status) pairs exercised equals the set documented in
// api/openapi, and that every answer has the documented media type.
func TestRoutes(t *testing.T) {
	f := newFixture(t)
	docs := map[string]map[string]map[int]string{
		surfaceDistribution: loadDoc(t, "distribution.yaml").documented(t),
		surfaceAdmin:        loadDoc(t, "admin.yaml").documented(t),
	}
	docs[surfaceOps] = docs[surfaceAdmin]

	var all []scenario
	for _, group := range []struct {
		surface string
		list    []scenario
	}{
		{surfaceDistribution, distributionScenarios()},
		{surfaceAdmin, adminScenarios()},
		{surfaceOps, opsScenarios()},
	} {
		for _, s := range group.list {
			s.surface = group.surface
			all = append(all, s)
		}
	}
	ran := 0
	for _, s := range all {
		// t.Run also returns true for a subtest -run filtered out, so
		// count only the bodies that executed.
		executed := false
		ok := t.Run(s.surface+"/"+s.name, func(t *testing.T) {
			executed = true
			f.reset()
			if s.setup != nil {
				if cleanup := s.setup(t, f); cleanup != nil {
					defer cleanup()
				}
			}
			c := s.withAuth()
			r := do(t, f.urls[s.surface], c)
			if r.code != s.code {
				t.Fatalf("status %d, want %d; body %s", r.code, s.code, r.body)
			}
			if cc := r.header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control = %q", cc)
			}
			req, _ := http.NewRequest(c.method, c.path, nil)
			_, pattern := f.mux(s.surface).Handler(req)
			media, documented := docs[s.surface][pattern][r.code]
			if !documented {
				t.Errorf("%s answered %d, which is not documented", pattern, r.code)
			}
			got, _, _ := mime.ParseMediaType(r.header.Get("Content-Type"))
			if got != media {
				t.Errorf("Content-Type %q, documented %q", got, media)
			}
			if r.code >= 400 {
				checkProblem(t, r)
			}
			if s.check != nil {
				s.check(t, f, r)
			}
		})
		if ok && executed {
			ran++
		}
	}
	if ran != len(all) || testing.Short() {
		return // a failed or filtered run cannot judge coverage
	}

	// Documented (surface, route, code) triples.
	want := map[string]bool{}
	for pattern, codes := range docs[surfaceDistribution] {
		for c := range codes {
			want[fmt.Sprintf("%s|%s|%d", surfaceDistribution, pattern, c)] = true
		}
	}
	for pattern, codes := range docs[surfaceAdmin] {
		surface := surfaceAdmin
		if !strings.Contains(pattern, "/v1/admin/") {
			surface = surfaceOps
		}
		for c := range codes {
			want[fmt.Sprintf("%s|%s|%d", surface, pattern, c)] = true
		}
	}
	got := observed(t, f.reg)
	var missing, extra []string
	for k := range want {
		if !got[k] {
			missing = append(missing, k)
		}
	}
	for k := range got {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Errorf("served vs documented (surface|route|code):\n  documented, never exercised: %v\n  exercised, not documented: %v", missing, extra)
	}
}

// observed reads proxypool_api_requests_total back as surface|route|code.
func observed(t testing.TB, g prometheus.Gatherer) map[string]bool {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, mf := range mfs {
		if mf.GetName() != "proxypool_api_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if m.GetCounter().GetValue() > 0 {
				out[l["surface"]+"|"+l["route"]+"|"+l["code"]] = true
			}
		}
	}
	return out
}
