package provider

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// Overrides reads the admin enable/disable state; management.Store
// implements it.
type Overrides interface {
	UpstreamEnabled(ctx context.Context, name string) (enabled, set bool, err error)
}

// DefaultReconcileEvery is how often the supervisor re-reads admin
// overrides and repairs drift (a lost notification, a crashed runtime).
const DefaultReconcileEvery = 30 * time.Second

// SupervisorOptions configures a Supervisor.
type SupervisorOptions struct {
	Store Store
	// Inventory overrides Store's inventory for planning (nil: Store).
	Inventory      InventorySource
	Overrides      Overrides
	Depleted       func(ctx context.Context, upstream string) error
	Admitted       func(ctx context.Context, upstream string, ids []proxy.ID)
	Now            func() time.Time
	Logger         *slog.Logger
	Registry       *prometheus.Registry
	ReconcileEvery time.Duration
	Tick           time.Duration
	// HTTPClient, when set, is used by every runtime instead of the guarded
	// client (tests only).
	HTTPClient *http.Client
	// Coordinator, when set (cluster storage), makes every runtime fetch
	// only while it holds its upstream's leader lease, under permits and a
	// maxTotal ledger shared by the fleet (NewCoordGate). nil: this
	// process decides alone.
	Coordinator Coordinator
	// Holder names this process in leader leases; unique per incarnation.
	Holder string
	// LeaseTTL is the leader lease's TTL (0: DefaultLeaseTTL).
	LeaseTTL time.Duration
}

// spec is what a runtime is built from; a change of it replaces the
// runtime.
type spec struct {
	up            config.Upstream
	allowLoopback bool
	adapter       upstream.Adapter
}

func (a *spec) same(b *spec) bool {
	if a.allowLoopback != b.allowLoopback || !sameAdapter(a.adapter, b.adapter) {
		return false
	}
	// Check policy and the enabled flag do not concern fetching.
	x, y := a.up, b.up
	x.Check, y.Check = config.Check{}, config.Check{}
	x.Enabled, y.Enabled = nil, nil
	return reflect.DeepEqual(x, y)
}

func sameAdapter(a, b upstream.Adapter) bool {
	if a == nil || b == nil {
		return a == b
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	if ta != tb || !ta.Comparable() {
		return false
	}
	return a == b
}

type running struct {
	rt     *Runtime
	spec   *spec
	cancel context.CancelFunc
	done   chan struct{}
}

// Supervisor keeps one Runtime per enabled upstream: enabled in the
// configuration and not disabled by an admin override.
type Supervisor struct {
	o       SupervisorOptions
	metrics *Metrics

	mu        sync.Mutex
	specs     map[string]*spec
	order     []string
	ledgers   map[string]*Ledger
	overruns  map[string]*atomic.Bool // cluster: see CoordOptions.Overrun
	tallies   map[string]*Tally
	overrides map[string]bool // admin overrides known so far
	runs      map[string]*running
	runCtx    context.Context
	// retired runtimes were cancelled but may still be finishing a call;
	// Run waits for them before it returns.
	retired []*running
}

// NewSupervisor returns a supervisor with no upstreams; Update sets them.
func NewSupervisor(o SupervisorOptions) *Supervisor {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.ReconcileEvery <= 0 {
		o.ReconcileEvery = DefaultReconcileEvery
	}
	return &Supervisor{
		o:         o,
		metrics:   NewMetrics(o.Registry),
		specs:     map[string]*spec{},
		ledgers:   map[string]*Ledger{},
		overruns:  map[string]*atomic.Bool{},
		tallies:   map[string]*Tally{},
		overrides: map[string]bool{},
		runs:      map[string]*running{},
	}
}

// Update installs a new configuration generation. Every adapter is
// resolved first and every runtime that would start or be replaced is
// pre-checked (Precheck); if anything fails nothing changes and every
// failure is returned. Then runtimes are started, cancelled or replaced
// (replaced when the provider, fetch, pool or tags changed, or the adapter
// was rebuilt).
func (s *Supervisor) Update(cfg *config.Config, providers upstream.Provider) error {
	specs := make(map[string]*spec, len(cfg.Upstreams))
	order := make([]string, 0, len(cfg.Upstreams))
	var errs []error
	s.mu.Lock()
	old := s.specs
	s.mu.Unlock()
	for _, u := range cfg.Upstreams {
		a, err := providers.Adapter(u.Provider.Plugin)
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream %s: resolving plugin %q: %w", u.Name, u.Provider.Plugin, err))
			continue
		}
		sp := &spec{up: u, allowLoopback: cfg.Security.AllowLoopbackDestinations, adapter: a}
		if prev := old[u.Name]; u.IsEnabled() && (prev == nil || !prev.same(sp)) {
			if err := Precheck(sp.up, sp.adapter, sp.allowLoopback, s.o.Now()); err != nil {
				errs = append(errs, fmt.Errorf("upstream %s: %w", u.Name, err))
				continue
			}
		}
		specs[u.Name] = sp
		order = append(order, u.Name)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	s.mu.Lock()
	for name := range s.specs {
		if specs[name] == nil {
			delete(s.ledgers, name)
			delete(s.overruns, name)
			delete(s.tallies, name)
			delete(s.overrides, name)
			s.metrics.forget(name)
		}
	}
	for name, sp := range specs {
		if l := s.ledgers[name]; l != nil {
			l.SetLimit(sp.up.Fetch.MaxTotal)
		} else {
			s.ledgers[name] = NewLedger(sp.up.Fetch.MaxTotal)
		}
		if s.tallies[name] == nil {
			s.tallies[name] = &Tally{}
		}
		if s.overruns[name] == nil {
			s.overruns[name] = &atomic.Bool{}
		}
	}
	s.specs, s.order = specs, order
	s.reconcileLocked()
	s.mu.Unlock()
	return nil
}

// SetEnabled records an admin override already written to the management
// store and applies it at once.
func (s *Supervisor) SetEnabled(name string, enabled bool) {
	s.mu.Lock()
	s.overrides[name] = enabled
	s.reconcileLocked()
	s.mu.Unlock()
}

// Enabled reports whether an upstream fetches and takes new allocations:
// configured, enabled in the configuration and not disabled by an admin.
func (s *Supervisor) Enabled(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.enabledLocked(name)
}

func (s *Supervisor) enabledLocked(name string) bool {
	sp := s.specs[name]
	if sp == nil {
		return false
	}
	// The configuration is the authority: an admin override can only
	// disable an upstream the configuration enables.
	if v, ok := s.overrides[name]; ok && !v {
		return false
	}
	return sp.up.IsEnabled()
}

// Signal wakes an upstream's runtime (inventory dropped).
func (s *Supervisor) Signal(name string) {
	s.mu.Lock()
	r := s.runs[name]
	s.mu.Unlock()
	if r != nil {
		r.rt.Signal()
	}
}

// Status returns an upstream's fetch status; ok is false when it has no
// runtime (disabled or unknown): the cumulative counters are then those
// of its last runtime.
func (s *Supervisor) Status(name string) (Status, bool) {
	s.mu.Lock()
	r := s.runs[name]
	tl := s.tallies[name]
	s.mu.Unlock()
	if r == nil {
		var st Status
		if tl != nil {
			st = tl.snapshot()
		}
		if g := s.idleGate(name); g != nil {
			ctx, cancel := context.WithTimeout(context.Background(), statusTimeout)
			defer cancel()
			st.applyGate(g.View(ctx))
			st.Leader = false
		}
		return st, false
	}
	return r.rt.Status(), true
}

// idleGate is a gate for reading an upstream's ledger while it has no
// runtime (nil for an unknown upstream). It never leads.
func (s *Supervisor) idleGate(name string) Gate {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.specs[name]
	if sp == nil {
		return nil
	}
	return s.gateLocked(name, sp)
}

// gateLocked builds the gate of a new runtime of name.
func (s *Supervisor) gateLocked(name string, sp *spec) Gate {
	if s.o.Coordinator == nil {
		return newLocalGate(sp.up.Fetch, s.ledgers[name])
	}
	return NewCoordGate(CoordOptions{
		Coordinator: s.o.Coordinator, Upstream: name, Fetch: sp.up.Fetch, Holder: s.o.Holder,
		LeaseTTL: s.o.LeaseTTL, Overrun: s.overruns[name], Metrics: s.metrics, Logger: s.o.Logger,
	})
}

// Running lists the upstreams with a runtime, in configuration order.
func (s *Supervisor) Running() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.runs))
	for _, n := range s.order {
		if s.runs[n] != nil {
			out = append(out, n)
		}
	}
	return out
}

// Run starts the runtimes and reconciles until ctx is done, then stops
// every runtime and waits for them.
func (s *Supervisor) Run(ctx context.Context) error {
	s.mu.Lock()
	s.runCtx = ctx
	s.mu.Unlock()
	s.refreshOverrides(ctx)
	s.mu.Lock()
	s.reconcileLocked()
	s.mu.Unlock()
	t := time.NewTicker(s.o.ReconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			s.stopAll()
			return nil
		case <-t.C:
			s.refreshOverrides(ctx)
			s.mu.Lock()
			s.reconcileLocked()
			s.mu.Unlock()
		}
	}
}

// refreshOverrides re-reads admin overrides. A store failure keeps the
// last known state (seed 000 §18: management store down, fetch continues).
func (s *Supervisor) refreshOverrides(ctx context.Context) {
	if s.o.Overrides == nil {
		return
	}
	s.mu.Lock()
	names := append([]string(nil), s.order...)
	s.mu.Unlock()
	for _, n := range names {
		v, set, err := s.o.Overrides.UpstreamEnabled(ctx, n)
		if err != nil {
			s.o.Logger.Warn("reading upstream override; keeping last known", "upstream", n, "err", err)
			continue
		}
		s.mu.Lock()
		if set {
			s.overrides[n] = v
		} else {
			delete(s.overrides, n)
		}
		s.mu.Unlock()
	}
}

// reconcileLocked makes the running set match the desired one. Before Run
// it only records the desired state.
func (s *Supervisor) reconcileLocked() {
	if s.runCtx == nil || s.runCtx.Err() != nil {
		return
	}
	live := s.retired[:0]
	for _, r := range s.retired {
		select {
		case <-r.done:
		default:
			live = append(live, r)
		}
	}
	s.retired = live
	for name, r := range s.runs {
		sp := s.specs[name]
		select {
		case <-r.done:
			delete(s.runs, name) // ended on its own; restart below if wanted
			continue
		default:
		}
		if sp == nil || !s.enabledLocked(name) || !sp.same(r.spec) {
			r.cancel()
			delete(s.runs, name)
			s.retired = append(s.retired, r)
			s.o.Logger.Info("provider runtime stopped", "upstream", name)
		}
	}
	names := make([]string, 0, len(s.specs))
	for n := range s.specs {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		if s.runs[name] != nil || !s.enabledLocked(name) {
			continue
		}
		sp := s.specs[name]
		rt := NewRuntime(RuntimeOptions{
			Upstream: sp.up, AllowLoopback: sp.allowLoopback, Adapter: sp.adapter,
			Store: s.o.Store, Inventory: s.o.Inventory, Gate: s.gateLocked(name, sp), Tally: s.tallies[name], Metrics: s.metrics,
			Depleted: s.o.Depleted, Admitted: s.o.Admitted, HTTPClient: s.o.HTTPClient,
			Now: s.o.Now, Logger: s.o.Logger, Tick: s.o.Tick,
		})
		ctx, cancel := context.WithCancel(s.runCtx)
		r := &running{rt: rt, spec: sp, cancel: cancel, done: make(chan struct{})}
		s.runs[name] = r
		go func() {
			defer close(r.done)
			_ = rt.Run(ctx)
		}()
		s.o.Logger.Info("provider runtime started", "upstream", name)
	}
}

// stopAll cancels every runtime and waits for them, including those
// already cancelled by a reconcile.
func (s *Supervisor) stopAll() {
	s.mu.Lock()
	runs := make([]*running, 0, len(s.runs))
	for _, r := range s.runs {
		r.cancel()
		runs = append(runs, r)
	}
	s.runs = map[string]*running{}
	runs = append(runs, s.retired...)
	s.retired = nil
	s.mu.Unlock()
	for _, r := range runs {
		<-r.done
	}
}

// Precheck validates what a new runtime would do before it is published
// (seed 000 §14: reload pre-checks new runtimes): the adapter must build a
// request from the upstream's params and secrets, the request must be an
// http(s) URL, and a literal address in it must be one the guard allows.
// Nothing is sent.
func Precheck(up config.Upstream, a upstream.Adapter, allowLoopback bool, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), precheckTimeout)
	defer cancel()
	req, err := a.BuildRequest(ctx, buildInput(&up, up.Fetch.EstimatedIPsPerCall, now))
	if err != nil {
		return fmt.Errorf("pre-checking provider: building a request: %w", err)
	}
	h, err := newHTTPRequest(ctx, req)
	if err != nil {
		return fmt.Errorf("pre-checking provider: %w", err)
	}
	host := strings.TrimSuffix(strings.TrimPrefix(h.URL.Hostname(), "["), "]")
	if host == "" {
		return errors.New("pre-checking provider: the request URL names no host")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if err := checkIP(ip, allowLoopback); err != nil {
			return fmt.Errorf("pre-checking provider: %w", err)
		}
	}
	return nil
}

// precheckTimeout bounds one adapter call during a pre-check.
const precheckTimeout = 5 * time.Second

var (
	_ Store     = activitypool.Pool(nil)
	_ Overrides = management.Store(nil)
)
