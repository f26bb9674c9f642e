package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/proxypool/proxypool/engine/adapters/http/auth"
	"github.com/proxypool/proxypool/engine/config"
)

// Surface names, used as the metrics label and in log lines.
const (
	surfaceDistribution = "distribution"
	surfaceAdmin        = "admin"
	surfaceOps          = "ops"
)

// routeSpec is one documented route: what the OpenAPI documents list and
// the contract test compares.
type routeSpec struct {
	Method string
	Path   string // Go 1.22 ServeMux path, identical to the OpenAPI path
	Codes  []int
}

func (r routeSpec) pattern() string { return r.Method + " " + r.Path }

// route binds a routeSpec to its handler on the surface's handler type T.
type route[T any] struct {
	routeSpec
	handle func(T, http.ResponseWriter, *http.Request)
}

func specsOf[T any](rs []route[T]) []routeSpec {
	out := make([]routeSpec, len(rs))
	for i, r := range rs {
		out[i] = r.routeSpec
	}
	return out
}

func newMux[T any](h T, rs []route[T]) *http.ServeMux {
	mux := http.NewServeMux()
	for _, r := range rs {
		mux.HandleFunc(r.pattern(), func(w http.ResponseWriter, req *http.Request) { r.handle(h, w, req) })
	}
	return mux
}

// guardState is a surface's access and auth configuration. It is
// immutable and swapped whole on reload, so a request sees either the old
// or the new rules, never a mix.
type guardState struct {
	allow      []netip.Prefix
	trusted    []netip.Prefix
	authn      auth.Authenticator
	challenges []string
	maxBody    int64
}

func buildGuard(name string, s config.Surface) (*guardState, error) {
	allow, err := auth.ParsePrefixes(s.Access.AllowCIDRs)
	if err != nil {
		return nil, fmt.Errorf("configuring %s access.allowCIDRs: %w", name, err)
	}
	trusted, err := auth.ParsePrefixes(s.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("configuring %s trustedProxies: %w", name, err)
	}
	authn, err := auth.New(s.Auth)
	if err != nil {
		return nil, fmt.Errorf("configuring %s auth: %w", name, err)
	}
	g := &guardState{allow: allow, trusted: trusted, authn: authn, maxBody: s.MaxBodyBytes}
	if g.maxBody <= 0 {
		g.maxBody = config.DefaultMaxBodyBytes
	}
	realm := `realm="proxypool-` + name + `"`
	for _, sc := range authn.Schemes() {
		switch sc {
		case auth.SchemeBasic:
			g.challenges = append(g.challenges, string(sc)+" "+realm+`, charset="UTF-8"`)
		default:
			g.challenges = append(g.challenges, string(sc)+" "+realm)
		}
	}
	return g, nil
}

type principalKey struct{}

// principalOf returns the authenticated principal of a guarded request.
func principalOf(ctx context.Context) auth.Principal {
	p, _ := ctx.Value(principalKey{}).(auth.Principal)
	return p
}

// surface is the part every REST surface shares: metrics, the guard, the
// problem+json answers for unmatched requests and the body bound.
type surface struct {
	name    string
	mux     *http.ServeMux
	guarded bool
	guard   atomic.Pointer[guardState]
	metrics *metrics
	log     *slog.Logger
	cop     *http.CrossOriginProtection
}

func newSurface(name string, guarded bool, reg prometheus.Registerer, log *slog.Logger) (*surface, error) {
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("registering %s metrics: %w", name, err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &surface{
		name:    name,
		guarded: guarded,
		metrics: m,
		log:     log.With("component", "httpapi", "surface", name),
		cop:     http.NewCrossOriginProtection(),
	}, nil
}

func (s *surface) configure(c config.Surface) error {
	g, err := buildGuard(s.name, c)
	if err != nil {
		return err
	}
	s.guard.Store(g)
	return nil
}

func (s *surface) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	_, pattern := s.mux.Handler(r)
	label := pattern
	if label == "" {
		label = routeUnmatched
	}
	sw := &statusWriter{ResponseWriter: w}
	defer func() { s.metrics.observe(s.name, label, sw.status(), time.Since(start)) }()
	sw.Header().Set("Cache-Control", "no-store")

	if s.guarded {
		g := s.guard.Load()
		p, ok := s.admit(sw, r, g)
		if !ok {
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		if r.Body != nil {
			r.Body = http.MaxBytesReader(sw, r.Body, g.maxBody)
		}
	}
	if pattern == "" {
		s.serveUnmatched(sw, r)
		return
	}
	s.mux.ServeHTTP(sw, r)
}

// admit applies, in order, cross-origin protection, access.allowCIDRs and
// authentication. Access comes before auth so a refused network learns
// nothing about which credentials exist.
func (s *surface) admit(w http.ResponseWriter, r *http.Request, g *guardState) (auth.Principal, bool) {
	peer := peerAddr(r.RemoteAddr)
	client := auth.ClientIP(peer, r.Header.Values("X-Forwarded-For"), g.trusted)
	if err := s.cop.Check(r); err != nil {
		writeProblem(w, newProblem(http.StatusForbidden, ptForbidden, "cross-origin browser request refused"))
		return auth.Principal{}, false
	}
	if len(g.allow) > 0 && !auth.Contains(g.allow, client) {
		s.log.Debug("client address not allowed", "client", client)
		writeProblem(w, newProblem(http.StatusForbidden, ptForbidden, "client address is not in access.allowCIDRs"))
		return auth.Principal{}, false
	}
	creds := auth.Credentials{RemoteIP: client, APIKey: r.Header.Get("X-API-Key")}
	if u, pw, ok := r.BasicAuth(); ok {
		creds.Username, creds.Password, creds.HasBasic = u, pw, true
	}
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		creds.Bearer = strings.TrimSpace(tok)
	}
	p, ok := g.authn.Authenticate(creds)
	if ok {
		return p, true
	}
	s.log.Debug("authentication failed", "client", client, "presented_basic", creds.HasBasic,
		"presented_api_key", creds.APIKey != "", "presented_bearer", creds.Bearer != "")
	if len(g.challenges) == 0 {
		// ipWhitelist alone: no credential could change the answer.
		writeProblem(w, newProblem(http.StatusForbidden, ptForbidden, "client address is not in auth.ips"))
		return auth.Principal{}, false
	}
	for _, c := range g.challenges {
		w.Header().Add("WWW-Authenticate", c)
	}
	writeProblem(w, newProblem(http.StatusUnauthorized, ptUnauthorized, "missing or invalid credentials"))
	return auth.Principal{}, false
}

// serveUnmatched turns the mux's plain-text 404/405 into problem+json,
// keeping its Allow header and redirects.
func (s *surface) serveUnmatched(w http.ResponseWriter, r *http.Request) {
	cw := &captureWriter{header: http.Header{}}
	s.mux.ServeHTTP(cw, r)
	switch {
	case cw.code == http.StatusMethodNotAllowed:
		w.Header().Set("Allow", cw.header.Get("Allow"))
		writeProblem(w, newProblem(http.StatusMethodNotAllowed, ptMethodNotAllowed, "method "+r.Method+" is not allowed here"))
	case cw.code >= 300 && cw.code < 400 && cw.header.Get("Location") != "":
		w.Header().Set("Location", cw.header.Get("Location"))
		w.WriteHeader(cw.code)
	default:
		writeProblem(w, newProblem(http.StatusNotFound, ptNotFound, "no such route"))
	}
}

// peerAddr parses http.Request.RemoteAddr; anything else (a unix socket)
// yields the invalid address, which no allow-list contains.
func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr()
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return a
	}
	return netip.Addr{}
}

// statusWriter records the status code for metrics.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// Unwrap lets http.ResponseController reach the connection.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// captureWriter absorbs the mux's default answers.
type captureWriter struct {
	header http.Header
	code   int
}

func (c *captureWriter) Header() http.Header { return c.header }
func (c *captureWriter) Write(b []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	return len(b), nil
}
func (c *captureWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
}

var (
	_ http.Handler        = (*surface)(nil)
	_ http.ResponseWriter = (*statusWriter)(nil)
	_ http.ResponseWriter = (*captureWriter)(nil)
)
