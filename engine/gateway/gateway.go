package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/adapters/http/auth"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/ingress"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/sticky"
	"github.com/proxypool/proxypool/engine/gateway/transport"
	"github.com/proxypool/proxypool/engine/netguard"
)

// DefaultStickyMaxEntries bounds a sticky routing's session bindings when
// the gateway's config does not name the routing (a cluster worker whose
// routings come only from the controller).
const DefaultStickyMaxEntries = 10000

// Options build a Gateway.
type Options struct {
	// Config supplies gateway limits, auth, access, security and the
	// shutdown drain. Routing comes from snapshots, not from here.
	Config *config.Config
	Logger *slog.Logger
	// Registry receives every gateway metric; nil keeps them private.
	Registry *prometheus.Registry
	// Outcomes receives allocation outcomes in batches; nil drops them.
	Outcomes worker.OutcomeSink
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxProxies bounds the runtime counter registry (live plus draining
	// proxies); 0 means snapshot.DefaultMaxEntries. Apply refuses a
	// snapshot that would exceed it.
	MaxProxies int
	// Resolver serves the destination guard; nil means
	// net.DefaultResolver.
	Resolver netguard.Resolver
	// OutcomeFlushInterval overrides OutcomeFlushInterval (tests).
	OutcomeFlushInterval time.Duration
}

// VersionError refuses a snapshot that is not newer than the current one.
type VersionError struct {
	Current, Offered uint64
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("applying snapshot: version %d is not newer than current %d", e.Offered, e.Current)
}

// Gateway is one data-plane worker.
type Gateway struct {
	log      *slog.Logger
	now      func() time.Time
	resolver netguard.Resolver

	reg     *snapshot.Registry
	snaps   snapshot.Holder
	disp    *dispatch.Dispatcher
	fwd     swapForwarder
	handler *ingress.Handler
	outq    *outcomeQueue

	applyMu sync.Mutex
	version prometheus.Gauge
	applyD  prometheus.Observer
	// Per routing name, kept across snapshots (guarded by applyMu).
	sessions map[string]*sticky.Cache
	gates    map[string]*snapshot.Gate

	// sticky holds the session header names of the snapshot in force.
	sticky atomic.Pointer[[]string]

	cfgMu     sync.Mutex
	cfg       atomic.Pointer[config.Config]
	tOpts     transport.Options
	listeners map[*ingress.LimitListener]struct{}
	closeOnce sync.Once
}

// New assembles a gateway from opts. It serves nothing until Serve and
// refuses every request with 503 "stale" until the first Apply.
func New(opts Options) (*Gateway, error) {
	if opts.Config == nil {
		return nil, errors.New("building gateway: config is required")
	}
	g := &Gateway{log: opts.Logger, now: opts.Now, resolver: opts.Resolver, listeners: map[*ingress.LimitListener]struct{}{},
		sessions: map[string]*sticky.Cache{}, gates: map[string]*snapshot.Gate{}}
	if g.log == nil {
		g.log = slog.New(slog.DiscardHandler)
	}
	g.log = g.log.With("component", "gateway")
	if g.now == nil {
		g.now = time.Now
	}
	reg := prometheus.Registerer(opts.Registry)
	if opts.Registry == nil {
		reg = prometheus.NewRegistry()
	}
	cfg := opts.Config
	policy, err := ingress.NewPolicy(cfg, opts.Resolver)
	if err != nil {
		return nil, fmt.Errorf("building gateway: %w", err)
	}
	g.reg = snapshot.NewRegistry(opts.MaxProxies, g.now)

	const ns, sub = "proxypool", "gateway"
	g.version = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_version",
		Help: "Version of the snapshot in use (0 before the first).",
	})
	age := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_age_seconds",
		Help: "Time since the snapshot in use was applied (0 before the first).",
	}, func() float64 {
		if s := g.snaps.Load(); s != nil {
			return g.now().Sub(s.BuiltAt).Seconds()
		}
		return 0
	})
	dropped := prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "outcomes_dropped_total",
		Help: "Allocation outcomes dropped because the report queue was full.",
	})
	applyD := prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: ns, Subsystem: sub, Name: "snapshot_apply_duration_seconds",
		Help:    "Time to build and swap in a snapshot.",
		Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	})
	g.applyD = applyD
	reg.MustRegister(g.version, age, dropped, applyD)

	dopts := dispatch.Options{Now: g.now, MaxStaleAge: cfg.Gateway.MaxStaleAge, Registerer: reg}
	if opts.Outcomes != nil {
		interval := opts.OutcomeFlushInterval
		if interval <= 0 {
			interval = OutcomeFlushInterval
		}
		g.outq = newOutcomeQueue(opts.Outcomes, dropped, interval)
		dopts.Outcomes = g.outq
	}
	g.disp = dispatch.New(&g.snaps, dopts)
	g.tOpts = transport.OptionsFrom(cfg.Gateway.Limits)
	g.fwd.p.Store(transport.New(g.tOpts))
	g.handler, err = ingress.NewHandler(ingress.Options{
		Dispatcher: g.disp, Forwarder: &g.fwd, Policy: policy, Logger: g.log, Registerer: reg,
		StickyHeaders: g.stickyHeaders,
	})
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("building gateway: %w", err)
	}
	g.cfg.Store(cfg)
	return g, nil
}

// Apply builds s into a compiled snapshot and swaps it in. A snapshot whose
// version is not newer than the current one is refused with *VersionError;
// a build failure (registry bound, duplicate proxy) keeps the current one.
func (g *Gateway) Apply(ctx context.Context, s *worker.Snapshot) error {
	if s == nil {
		return errors.New("applying snapshot: nil snapshot")
	}
	g.applyMu.Lock()
	defer g.applyMu.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("applying snapshot %d: %w", s.Version, err)
	}
	if cur := g.snaps.Load(); cur != nil && s.Version <= cur.Version {
		return &VersionError{Current: cur.Version, Offered: s.Version}
	}
	start := time.Now()
	cfg := g.cfg.Load()
	keep := make(map[string]bool, len(s.Routings))
	built, err := snapshot.BuildWith(s, g.reg, snapshot.Options{Settings: func(r *routing.Rule) snapshot.RuleSettings {
		keep[r.Name] = true
		return g.ruleSettings(cfg, r)
	}})
	if err != nil {
		return fmt.Errorf("applying snapshot %d: %w", s.Version, err)
	}
	g.sticky.Store(stickyHeaders(built))
	g.snaps.Store(built)
	// Parked requests (onUnavailable wait) look at the new snapshot.
	g.disp.Wake()
	for name := range g.sessions {
		if !keep[name] {
			delete(g.sessions, name)
		}
	}
	for name := range g.gates {
		if !keep[name] {
			delete(g.gates, name)
		}
	}
	g.applyD.Observe(time.Since(start).Seconds())
	g.version.Set(float64(built.Version))
	g.log.Debug("snapshot applied", "version", built.Version, "proxies", built.Proxies,
		"allocatable", built.Allocatable, "build", time.Since(start))
	return nil
}

// ruleSettings supplies what the gateway's config adds to a rule: its wait
// timeout, its admission gate and its session cache, the last two kept per
// routing name across snapshots. It runs under applyMu.
func (g *Gateway) ruleSettings(cfg *config.Config, r *routing.Rule) snapshot.RuleSettings {
	set := snapshot.RuleSettings{WaitTimeout: config.DefaultWaitTimeout}
	maxEntries, maxInFlight := DefaultStickyMaxEntries, 0
	for i := range cfg.Routings {
		if c := &cfg.Routings[i]; c.Name == r.Name {
			if c.WaitTimeout > 0 {
				set.WaitTimeout = c.WaitTimeout
			}
			if c.Sticky.MaxEntries > 0 {
				maxEntries = c.Sticky.MaxEntries
			}
			maxInFlight = c.MaxInFlight
			break
		}
	}
	if maxInFlight > 0 {
		gt := g.gates[r.Name]
		if gt == nil {
			gt = snapshot.NewGate(int64(maxInFlight))
			g.gates[r.Name] = gt
		}
		gt.SetMax(int64(maxInFlight))
		set.Gate = gt
	} else {
		delete(g.gates, r.Name)
	}
	if r.StickyHeader != "" {
		c := g.sessions[r.Name]
		if c == nil || c.Max() != maxEntries {
			c = sticky.New(maxEntries)
			g.sessions[r.Name] = c
		}
		set.Sessions = c
	} else {
		delete(g.sessions, r.Name)
	}
	return set
}

// stickyHeaders lists the distinct session header names of s's sticky
// rules: the only request headers Acquire is given.
func stickyHeaders(s *snapshot.Snapshot) *[]string {
	var names []string
	for i := range s.Rules() {
		if h := s.Rules()[i].StickyHeader; h != "" && !slices.Contains(names, h) {
			names = append(names, h)
		}
	}
	return &names
}

func (g *Gateway) stickyHeaders() []string {
	if p := g.sticky.Load(); p != nil {
		return *p
	}
	return nil
}

// Runtime reports the sparse runtime counts (worker.RuntimeReader).
func (g *Gateway) Runtime() []worker.Runtime { return g.reg.Runtime() }

// Snapshot returns the compiled snapshot in use (nil before the first).
func (g *Gateway) Snapshot() *snapshot.Snapshot { return g.snaps.Load() }

// Serve serves ln until ctx is cancelled, then drains: it stops accepting,
// lets in-flight requests and tunnels finish until the config's shutdown
// timeout, then closes what remains. It returns nil after a drain.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	cfg := g.cfg.Load()
	if err := strictCheck(cfg, ln.Addr()); err != nil {
		return err
	}
	l := cfg.Gateway.Limits
	trusted, err := auth.ParsePrefixes(cfg.Gateway.TrustedProxies)
	if err != nil {
		return fmt.Errorf("serving gateway on %s: trustedProxies: %w", ln.Addr(), err)
	}
	lln := ingress.NewLimitListener(ln, l.MaxConns, g.handler)
	lln.SetPerClient(l.MaxConnsPerClient, trusted)
	if ta, ok := ln.Addr().(*net.TCPAddr); ok {
		// Requests to our own listener would loop through the proxies.
		g.handler.AddSelf(ta.AddrPort())
	}
	g.cfgMu.Lock()
	g.listeners[lln] = struct{}{}
	g.cfgMu.Unlock()
	defer func() {
		g.cfgMu.Lock()
		delete(g.listeners, lln)
		g.cfgMu.Unlock()
	}()
	srv := ingress.NewServer(g.handler, lln, ingress.ServerConfig{
		MaxHeaderBytes: l.MaxHeaderBytes, ReadHeaderTimeout: l.ReadHeaderTimeout, IdleTimeout: l.IdleTimeout,
	})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve() }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving gateway on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	drain := g.cfg.Load().Shutdown // the drain of the config in force now
	if drain <= 0 {
		drain = config.DefaultShutdownTimeout
	}
	dctx, cancel := context.WithTimeout(context.Background(), drain)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		n := srv.Close()
		g.log.Warn("drain deadline passed, closed remaining connections", "connections", n, "drain", drain)
	}
	<-errc
	return nil
}

// strictCheck repeats config validation's open-proxy rule against the
// address actually bound (an inherited socket may differ from the config).
func strictCheck(cfg *config.Config, addr net.Addr) error {
	gw := &cfg.Gateway
	if !cfg.StrictMode() || (gw.Auth.Mode != "" && gw.Auth.Mode != "none") || len(gw.Access.AllowCIDRs) > 0 {
		return nil
	}
	if addr != nil && !config.IsLoopbackListener(addr.String()) {
		return fmt.Errorf("serving gateway on %s: strict mode refuses a non-loopback listener with auth none and no access.allowCIDRs", addr)
	}
	return nil
}

// UpdateConfig applies a reloaded config: auth, access, trusted proxies,
// destination guard, header count, rate limits, staleness bound and
// connection caps take effect for new requests at once; transport limits
// build a new transport (the old one's idle connections close, in-flight
// ones finish). Routing settings (wait timeout, maxInFlight, sticky
// maxEntries) apply from the next snapshot. Header size and server
// timeouts apply to listeners served after the change. On error nothing
// changes.
func (g *Gateway) UpdateConfig(cfg *config.Config) error {
	if cfg == nil {
		return errors.New("updating gateway config: nil config")
	}
	policy, err := ingress.NewPolicy(cfg, g.resolver)
	if err != nil {
		return fmt.Errorf("updating gateway config: %w", err)
	}
	trusted, err := auth.ParsePrefixes(cfg.Gateway.TrustedProxies)
	if err != nil {
		return fmt.Errorf("updating gateway config: trustedProxies: %w", err)
	}
	g.cfgMu.Lock()
	defer g.cfgMu.Unlock()
	g.handler.SetPolicy(policy)
	g.disp.SetMaxStaleAge(cfg.Gateway.MaxStaleAge)
	if to := transport.OptionsFrom(cfg.Gateway.Limits); to != g.tOpts {
		g.tOpts = to
		old := g.fwd.p.Swap(transport.New(to))
		old.Close()
	}
	for l := range g.listeners {
		l.SetMax(cfg.Gateway.Limits.MaxConns)
		l.SetPerClient(cfg.Gateway.Limits.MaxConnsPerClient, trusted)
	}
	g.cfg.Store(cfg)
	return nil
}

// Close flushes queued outcomes and releases idle upstream connections. It
// does not stop Serve: cancel its context for that.
func (g *Gateway) Close() {
	g.closeOnce.Do(func() {
		if g.outq != nil {
			g.outq.close()
		}
		if t := g.fwd.p.Load(); t != nil {
			t.Close()
		}
	})
}

// swapForwarder lets a reload replace the transport under running
// requests: each request loads the current one once per attempt.
type swapForwarder struct {
	p atomic.Pointer[transport.Transport]
}

func (s *swapForwarder) RoundTrip(ctx context.Context, req *transport.Request, t *snapshot.Target, resp *transport.Response) error {
	return s.p.Load().RoundTrip(ctx, req, t, resp)
}

func (s *swapForwarder) Connect(ctx context.Context, t *snapshot.Target, authority string) (*transport.Tunnel, error) {
	return s.p.Load().Connect(ctx, t, authority)
}

func (s *swapForwarder) DirectRoundTrip(ctx context.Context, req *transport.Request, addrs []netip.AddrPort, resp *transport.Response) error {
	return s.p.Load().DirectRoundTrip(ctx, req, addrs, resp)
}

func (s *swapForwarder) DirectConnect(ctx context.Context, addrs []netip.AddrPort) (net.Conn, error) {
	return s.p.Load().DirectConnect(ctx, addrs)
}

var (
	_ worker.Applier       = (*Gateway)(nil)
	_ worker.RuntimeReader = (*Gateway)(nil)
	_ ingress.Forwarder    = (*swapForwarder)(nil)
	_ ingress.Dispatcher   = (*dispatch.Dispatcher)(nil)
)
