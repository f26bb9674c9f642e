package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/distribution"
	ctlext "github.com/proxypool/proxypool/engine/controller/extraction"
	"github.com/proxypool/proxypool/engine/controller/health"
	"github.com/proxypool/proxypool/engine/controller/internal/loop"
	"github.com/proxypool/proxypool/engine/controller/pool"
	"github.com/proxypool/proxypool/engine/controller/provider"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/coordination"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Worker is a gateway worker as the controller drives it: it applies
// snapshots and reports its runtime counts.
type Worker interface {
	worker.Applier
	worker.RuntimeReader
}

// Coordinator is the cluster coordination (storage.mode cluster): fetch
// leadership and permits, the fleet-wide extraction rate limit and the
// workers' heartbeats. redisstore.Coordinator implements it.
type Coordinator interface {
	provider.Coordinator
	ctlext.RateLimiter
	Workers(ctx context.Context) ([]coordination.WorkerBeat, error)
}

// DefaultWorkerID names the in-process worker of the standalone appliance.
const DefaultWorkerID = "local"

// Timing overrides loop periods; zero values take each loop's default.
// Tests shorten them; production leaves them alone.
type Timing struct {
	Publish, Lifecycle, HealthSweep, ProviderTick, Reconcile time.Duration
}

// Options configures New.
type Options struct {
	Config     *config.Config
	Pool       activitypool.Pool
	Management management.Store
	Providers  upstream.Provider
	// Worker is the gateway in this process; nil when there is none (then
	// every AVAILABLE proxy stays unowned and extractable).
	Worker   Worker
	WorkerID string
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Now      func() time.Time
	Version  string
	// ProbeTarget is the host:port the BASIC check CONNECTs to through each
	// proxy; empty: the proxy's own address (see checker.Options).
	ProbeTarget string
	// Checker runs checks; nil: an in-process checker.
	Checker checker.Executor
	Timing  Timing
	// Coordinator, when set (cluster storage), makes fetching, the
	// extraction rate limit and the live-worker list fleet-wide; nil: this
	// process decides alone.
	Coordinator Coordinator
	// Holder names this process in leader leases; unique per incarnation.
	Holder string
}

// Controller is the control plane. Create with New, start with Run.
type Controller struct {
	o         Options
	log       *slog.Logger
	startedAt time.Time

	cfg      atomic.Pointer[config.Config]
	loadedAt atomic.Pointer[time.Time]
	reloadMu sync.Mutex
	ready    atomic.Bool
	last     atomic.Pointer[ReloadStatus]
	runCtx   atomic.Pointer[context.Context]

	auditMu      sync.Mutex
	auditBacklog []management.AuditEntry
	auditDropped int

	sup    *provider.Supervisor
	sched  *checker.Scheduler
	health *health.Service
	life   *pool.Lifecycle
	inv    *pool.InventoryReader
	sw     *ctlrouting.Switcher
	pub    *distribution.Publisher
	ext    *ctlext.Service
	probe  *storeProbe
	out    *handedOut
}

// Bounds of the admin views.
const (
	maxProxyView    = 10000
	maxUpstreamScan = 100000
	hookTimeout     = 10 * time.Second
	// maxAuditBacklog bounds the audit entries kept while the management
	// store is down.
	maxAuditBacklog = 1000
)

// New builds a controller for cfg. It fails if a provider plugin of cfg
// cannot be resolved.
func New(o Options) (*Controller, error) {
	switch {
	case o.Config == nil:
		return nil, errors.New("creating controller: no configuration")
	case o.Pool == nil:
		return nil, errors.New("creating controller: no activity pool")
	case o.Management == nil:
		return nil, errors.New("creating controller: no management store")
	case o.Providers == nil:
		return nil, errors.New("creating controller: no provider set")
	case o.Coordinator != nil && o.Holder == "":
		return nil, errors.New("creating controller: a coordinator needs a holder name")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.WorkerID == "" {
		o.WorkerID = DefaultWorkerID
	}
	if o.Checker == nil {
		o.Checker = checker.New(checker.Options{ProbeTarget: o.ProbeTarget, Now: o.Now})
	}
	c := &Controller{o: o, log: o.Logger.With("component", "controller"), startedAt: o.Now()}
	c.probe = newStoreProbe(o.Registry, c.log, o.Pool)
	c.out = newHandedOut(maxHandedOut)
	c.cfg.Store(o.Config)
	t := o.Now()
	c.loadedAt.Store(&t)

	c.sw = ctlrouting.New(ctlrouting.Options{
		Store: o.Management, Enabled: c.allocatable,
		Logger: o.Logger.With("component", "routing"), Registry: o.Registry,
	})
	c.pub = distribution.New(distribution.Options{
		Store: o.Pool, Cursors: o.Management, OnPublished: c.onPublished,
		Exclusions: func() map[string]map[proxy.ID]bool { return c.health.Exclusions() },
		Now:        o.Now, Logger: o.Logger.With("component", "distribution"), Registry: o.Registry,
		Every: o.Timing.Publish,
	})
	if o.Worker != nil {
		c.pub.Register(o.WorkerID, o.Worker)
	}
	c.sched = checker.NewScheduler(checker.SchedulerOptions{
		Executor: o.Checker, MaxInFlight: checkInFlight(o.Config), Report: c.onObservation, Registry: o.Registry,
		MaxPerSecond: o.Config.Checker.MaxPerSecond,
	})
	c.health = health.New(health.Options{
		Store: o.Pool, Scheduler: c.sched, Policy: c.checkPolicy, OnChange: c.onHealthChange,
		Targets: c.targets, OnTargetChange: func(string) { c.pub.Trigger() },
		Now: o.Now, Logger: o.Logger.With("component", "health"), Registry: o.Registry,
		SweepEvery: o.Timing.HealthSweep,
	})
	c.inv = pool.NewInventoryReader(o.Pool, c.workerMap)
	c.sup = provider.NewSupervisor(provider.SupervisorOptions{
		Store: admitFilter{Pool: o.Pool, out: c.out, now: o.Now}, Inventory: c.inv, Overrides: o.Management,
		Depleted: c.onDepleted,
		Admitted: func(ctx context.Context, _ string, ids []proxy.ID) { c.health.Schedule(ctx, ids) },
		Now:      o.Now, Logger: o.Logger.With("component", "provider"), Registry: o.Registry,
		ReconcileEvery: o.Timing.Reconcile, Tick: o.Timing.ProviderTick,
		Coordinator: o.Coordinator, Holder: o.Holder, LeaseTTL: o.Config.Storage.Redis.LeaderTTL,
	})
	c.life = pool.New(pool.Options{
		Store: o.Pool, Workers: c.workers, SnapshotVersion: c.pub.Version, Known: c.allocatable,
		OnDrop: c.sup.Signal, OnChange: c.pub.Trigger,
		Now: o.Now, Logger: o.Logger.With("component", "pool"), Registry: o.Registry,
		Every: o.Timing.Lifecycle,
	})
	var pubForExt ctlext.Publisher
	if o.Worker != nil {
		pubForExt = c.pub
	}
	c.ext = ctlext.New(ctlext.Options{
		Store: o.Pool, Publisher: pubForExt, Workers: c.workers, Limiter: o.Coordinator,
		Now: o.Now, Logger: o.Logger.With("component", "extraction"), Registry: o.Registry,
	}, extractionConfig(o.Config))
	if err := c.sup.Update(o.Config, o.Providers); err != nil {
		return nil, fmt.Errorf("creating controller: %w", err)
	}
	c.applyView(o.Config)
	return c, nil
}

func checkInFlight(cfg *config.Config) int {
	n := 0
	for _, u := range cfg.Upstreams {
		n = max(n, u.Check.MaxInFlight)
	}
	if n == 0 {
		n = checker.DefaultMaxInFlight
	}
	return n
}

func extractionConfig(cfg *config.Config) ctlext.Config {
	e := cfg.Extraction
	return ctlext.Config{
		MinRemainingTTL: e.MinRemainingTTL, MaxHealthCheckAge: e.MaxHealthCheckAge,
		ReserveForGateway: e.ReserveForGateway, IdempotencyTTL: e.IdempotencyTTL,
		MaxCount: e.MaxCount, PerClientPerMinute: e.PerClientPerMinute,
	}
}

// applyView pushes the configuration-derived state to the components.
func (c *Controller) applyView(cfg *config.Config) {
	c.sw.SetRules(ctlrouting.Compile(cfg.Routings))
	c.pub.SetView(distribution.View{
		Rules: ctlrouting.Compile(cfg.Routings), Disabled: c.disabled(cfg), MaxStaleAge: cfg.Gateway.MaxStaleAge,
	})
	c.ext.SetConfig(extractionConfig(cfg))
}

func (c *Controller) disabled(cfg *config.Config) map[string]bool {
	out := map[string]bool{}
	for _, u := range cfg.Upstreams {
		if !c.sup.Enabled(u.Name) {
			out[u.Name] = true
		}
	}
	return out
}

// allocatable: configured, enabled in config and not disabled by an admin.
func (c *Controller) allocatable(name string) bool { return c.sup.Enabled(name) }

func (c *Controller) checkPolicy(name string) (health.Policy, bool) {
	u := c.cfg.Load().Upstream(name)
	if u == nil || !c.sup.Enabled(name) {
		return health.Policy{}, false
	}
	k := u.Check
	probe := k.ProbeTarget
	if probe == "" {
		probe = c.o.ProbeTarget
	}
	return health.Policy{
		FailureThreshold: k.FailureThreshold, Interval: k.Interval, Timeout: k.Timeout,
		ProbeTarget: probe, EgressURL: k.EgressURL, Anonymity: health.ParseAnonymity(k.Anonymity),
	}, true
}

// targets lists the routings' TARGET checks; proxies of disabled
// upstreams get no task (checkPolicy refuses them).
func (c *Controller) targets() []health.TargetSpec {
	cfg := c.cfg.Load()
	var out []health.TargetSpec
	for _, r := range cfg.Routings {
		if r.Check == nil {
			continue
		}
		out = append(out, health.TargetSpec{
			Routing: r.Name, Upstreams: r.Upstreams, URL: r.Check.URL,
			ExpectStatus: r.Check.ExpectStatus, Interval: r.Check.Interval,
		})
	}
	return out
}

func (c *Controller) workers() []worker.RuntimeReader {
	if c.o.Worker == nil {
		return nil
	}
	return []worker.RuntimeReader{c.o.Worker}
}

// workerMap is every worker that reports its runtime, by ID: proxies owned
// by any other owner count as zero free capacity.
func (c *Controller) workerMap() map[string]worker.RuntimeReader {
	if c.o.Worker == nil {
		return nil
	}
	return map[string]worker.RuntimeReader{c.o.WorkerID: c.o.Worker}
}

func (c *Controller) baseCtx() context.Context {
	if p := c.runCtx.Load(); p != nil {
		return *p
	}
	return context.Background()
}

func (c *Controller) onObservation(obs checker.Observation) {
	ctx, cancel := context.WithTimeout(c.baseCtx(), hookTimeout)
	defer cancel()
	if err := c.health.Observe(ctx, obs); err != nil {
		c.log.Warn("applying health observation", "proxy", obs.ID, "err", err)
	}
}

func (c *Controller) onHealthChange(up string, from, to proxy.State) {
	if to == proxy.StateAvailable || from == proxy.StateAvailable {
		c.pub.Trigger()
	}
	if to != proxy.StateAvailable {
		c.sup.Signal(up) // usable or pending inventory shrank
	}
}

// onDepleted advances the routings on up; an error (management store
// down) makes the provider runtime retry it every cycle.
func (c *Controller) onDepleted(ctx context.Context, up string) error {
	moved, err := c.sw.Depleted(ctx, up)
	if len(moved) > 0 {
		c.pub.Trigger()
	}
	if err != nil {
		return fmt.Errorf("advancing sequential routings off %s: %w", up, err)
	}
	return nil
}

// skipDisabled moves sequential routings off upstreams that are disabled
// (by configuration or admin). A store failure is logged and retried by
// the next maintenance pass.
func (c *Controller) skipDisabled(ctx context.Context) {
	for _, u := range c.cfg.Load().Upstreams {
		if c.sup.Enabled(u.Name) {
			continue
		}
		moved, err := c.sw.Disabled(ctx, u.Name)
		if err != nil && ctx.Err() == nil {
			c.log.Warn("moving sequential routings off a disabled upstream", "upstream", u.Name, "err", err)
		}
		if len(moved) > 0 {
			c.pub.Trigger()
		}
	}
}

// maintain re-applies what a lost notification or a management store
// outage may have left undone.
func (c *Controller) maintain(ctx context.Context) error {
	every := c.o.Timing.Reconcile
	if every <= 0 {
		every = provider.DefaultReconcileEvery
	}
	loop.Run(ctx, every, nil, c.log, "controller maintenance", func(ctx context.Context) error {
		c.skipDisabled(ctx)
		c.flushAudit(ctx)
		return nil
	})
	return nil
}

func (c *Controller) onPublished(_ string, s *worker.Snapshot) {
	if len(s.Proxies) > 0 {
		c.ready.Store(true)
	}
}

// Run starts every loop and blocks until ctx is done, then stops them and
// waits for them to finish.
func (c *Controller) Run(ctx context.Context) error {
	c.runCtx.Store(&ctx)
	loops := []func(context.Context) error{c.sup.Run, c.sched.Run, c.health.Run, c.life.Run, c.pub.Run, c.maintain, c.watchStores}
	var wg sync.WaitGroup
	for _, run := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				c.log.Error("controller loop stopped", "err", err)
			}
		}()
	}
	c.log.Info("controller started", "upstreams", len(c.cfg.Load().Upstreams), "version", c.o.Version)
	wg.Wait()
	return nil
}

// Ready reports whether a snapshot with at least one AVAILABLE proxy has
// been published (or there is no upstream to wait for) and the last one
// applied is not stale: past gateway.maxStaleAge without a publish the
// gateway refuses new traffic, so it leaves the load balancer too. A store
// outage alone does not make it unready: the gateway keeps serving from
// its snapshot meanwhile (seed 000 §18); the admin status and the
// proxypool_store_up metric report the stores.
func (c *Controller) Ready() bool {
	if len(c.cfg.Load().Upstreams) == 0 {
		return true
	}
	if !c.ready.Load() {
		return false
	}
	s := c.pub.Last()
	return s == nil || c.o.Now().Before(s.ValidUntil)
}

// Config returns the configuration in force.
func (c *Controller) Config() *config.Config { return c.cfg.Load() }

// Reload installs cfg (seed 000 §14): every provider plugin is resolved
// first and any failure keeps the old generation; then the configuration is
// swapped atomically, runtimes are started, replaced or stopped, routings
// and extraction defaults take effect for new requests, and proxies of
// removed upstreams drain.
func (c *Controller) Reload(ctx context.Context, cfg *config.Config, providers upstream.Provider) error {
	if cfg == nil || providers == nil {
		return errors.New("reloading: no configuration or provider set")
	}
	c.reloadMu.Lock()
	defer c.reloadMu.Unlock()
	if err := c.sup.Update(cfg, providers); err != nil {
		return fmt.Errorf("reloading: %w", err)
	}
	c.cfg.Store(cfg)
	t := c.o.Now()
	c.loadedAt.Store(&t)
	c.applyView(cfg)
	c.sched.SetMaxInFlight(checkInFlight(cfg))
	c.sched.SetMaxPerSecond(cfg.Checker.MaxPerSecond)
	c.skipDisabled(ctx)
	c.life.Signal()
	c.pub.Trigger()
	c.log.Info("configuration reloaded", "source", cfg.Source, "upstreams", len(cfg.Upstreams), "routings", len(cfg.Routings))
	return nil
}

// RecordReload records the outcome of a reload attempt (audit and status).
func (c *Controller) RecordReload(actor string, err error) {
	st := &ReloadStatus{At: c.o.Now(), OK: err == nil}
	if err != nil {
		var ce config.Errors
		if errors.As(err, &ce) {
			for _, e := range ce {
				st.Errors = append(st.Errors, e.Error())
			}
		} else {
			st.Errors = []string{err.Error()}
		}
	}
	c.last.Store(st)
	ctx, cancel := context.WithTimeout(c.baseCtx(), hookTimeout)
	defer cancel()
	c.audit(ctx, actor, "config.reload", c.cfg.Load().Source, err)
}

// audit appends an entry; a failure is logged, not returned: the audited
// operation already happened (or failed on its own).
//
// An entry the store refuses (it is down) is kept, up to maxAuditBacklog,
// and written with its original time once the store answers again, so a
// reload or a failed attempt made during an outage is not lost from the
// audit log.
func (c *Controller) audit(ctx context.Context, actor, action, target string, opErr error) {
	result := "ok"
	if opErr != nil {
		result = opErr.Error()
	}
	e := management.AuditEntry{At: c.o.Now(), Actor: actor, Action: action, Target: target, Result: result}
	c.auditMu.Lock()
	defer c.auditMu.Unlock()
	if err := c.flushAuditLocked(ctx); err == nil {
		err = c.o.Management.AppendAudit(ctx, e)
		if err == nil {
			return
		}
		c.log.Warn("writing audit entry; kept for retry", "action", action, "target", target, "err", err)
	}
	if len(c.auditBacklog) >= maxAuditBacklog {
		c.auditDropped++
		c.auditBacklog = c.auditBacklog[1:]
	}
	c.auditBacklog = append(c.auditBacklog, e)
}

// flushAuditLocked writes the kept entries in order; it stops at the first
// failure.
func (c *Controller) flushAuditLocked(ctx context.Context) error {
	for len(c.auditBacklog) > 0 {
		if err := c.o.Management.AppendAudit(ctx, c.auditBacklog[0]); err != nil {
			return err
		}
		c.auditBacklog[0] = management.AuditEntry{}
		c.auditBacklog = c.auditBacklog[1:]
	}
	if c.auditDropped > 0 {
		c.log.Error("audit entries lost while the management store was down", "count", c.auditDropped)
		c.auditDropped = 0
	}
	return nil
}

func (c *Controller) flushAudit(ctx context.Context) {
	c.auditMu.Lock()
	defer c.auditMu.Unlock()
	if len(c.auditBacklog) > 0 {
		_ = c.flushAuditLocked(ctx)
	}
}

// unavailable marks a management store failure for the 503 mapping.
func unavailable(what string, err error) error {
	if errors.Is(err, management.ErrUnavailable) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w: %w", what, management.ErrUnavailable, err)
}

// Extract performs one exclusive extraction; see extraction.Service. It
// never waits for a vendor: what the pool holds is what it hands out; the
// upstreams it drew from (or, when short, every upstream the request
// allows) are only signalled to re-plan in the background.
func (c *Controller) Extract(ctx context.Context, req extraction.Request) (extraction.Result, error) {
	res, err := c.ext.Extract(ctx, req)
	c.out.add(res.Proxies, c.o.Now())
	signalled := map[string]bool{}
	for i := range res.Proxies {
		if up := res.Proxies[i].Upstream; !signalled[up] {
			signalled[up] = true
			c.sup.Signal(up)
		}
	}
	if err != nil || res.Returned < req.Count {
		for _, u := range c.cfg.Load().Upstreams {
			if !signalled[u.Name] && (len(req.Filters.Upstreams) == 0 || slices.Contains(req.Filters.Upstreams, u.Name)) {
				c.sup.Signal(u.Name)
			}
		}
	}
	return res, err
}

// SetUpstreamEnabled writes an admin override, audits it and applies it:
// a disabled upstream stops fetching and new allocations, its proxies
// drain.
func (c *Controller) SetUpstreamEnabled(ctx context.Context, actor, name string, enabled bool) error {
	action := "upstream.disable"
	if enabled {
		action = "upstream.enable"
	}
	if c.cfg.Load().Upstream(name) == nil {
		err := fmt.Errorf("setting upstream %q: %w", name, ErrUnknownUpstream)
		c.audit(ctx, actor, action, name, err)
		return err
	}
	err := c.o.Management.SetUpstreamEnabled(ctx, name, enabled)
	c.audit(ctx, actor, action, name, err)
	if err != nil {
		return unavailable(fmt.Sprintf("setting upstream %q", name), err)
	}
	c.sup.SetEnabled(name, enabled)
	c.applyView(c.cfg.Load())
	if !enabled {
		if _, err := c.sw.Disabled(ctx, name); err != nil {
			// The override is in force; the maintenance loop moves the
			// routings once the store answers.
			c.log.Warn("moving sequential routings off a disabled upstream", "upstream", name, "err", err)
		}
	}
	c.pub.Trigger()
	c.life.Signal()
	return nil
}

// SwitchRouting moves a sequential routing to the upstream at index.
func (c *Controller) SwitchRouting(ctx context.Context, actor, name string, index int) error {
	_, err := c.sw.Switch(ctx, name, index)
	c.audit(ctx, actor, "routing.switch", fmt.Sprintf("%s[%d]", name, index), err)
	switch {
	case errors.Is(err, ErrUnknownRouting), errors.Is(err, ErrInvalidSwitch):
		return err
	case err != nil:
		return unavailable("switching routing", err)
	}
	c.pub.Trigger()
	return nil
}

// Audit returns the latest audit entries, newest first.
func (c *Controller) Audit(ctx context.Context, limit int) ([]management.AuditEntry, error) {
	es, err := c.o.Management.ListAudit(ctx, limit)
	if err != nil {
		return nil, unavailable("listing audit", err)
	}
	return es, nil
}

// Proxies lists proxies without credentials.
func (c *Controller) Proxies(ctx context.Context, f activitypool.Filter) ([]ProxyView, error) {
	if f.Limit <= 0 || f.Limit > maxProxyView {
		f.Limit = maxProxyView
	}
	ps, err := c.o.Pool.List(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("listing proxies: %w", err)
	}
	out := make([]ProxyView, 0, len(ps))
	for i := range ps {
		out = append(out, view(&ps[i]))
	}
	return out, nil
}

func view(p *proxy.Proxy) ProxyView {
	v := ProxyView{
		ID: p.ID, Upstream: p.Upstream, Scheme: string(p.Key.Scheme), Host: p.Key.Host, Port: p.Key.Port,
		HasAuth: p.Key.Username != "" || p.Password != "", State: p.State.String(), Owner: p.Owner,
		ExpiresAt: p.ExpiresAt, UsableUntil: p.UsableUntil, Region: p.Region, Carrier: p.Carrier,
	}
	if !p.LastCheckedAt.IsZero() {
		t := p.LastCheckedAt
		v.LastCheckedAt = &t
	}
	return v
}

// Status is the appliance-wide view.
func (c *Controller) Status(ctx context.Context) (Status, error) {
	cfg := c.cfg.Load()
	st := Status{
		Version: c.o.Version, StartedAt: c.startedAt, ConfigSource: cfg.Source, ConfigLoadedAt: *c.loadedAt.Load(),
		Ready: c.Ready(), StorageMode: cfg.Storage.Mode, Proxies: map[string]int{},
		Upstreams: len(cfg.Upstreams), Routings: len(cfg.Routings), LastReload: c.last.Load(),
		Storage: c.probeStores(ctx),
	}
	// While the activity pool store is down its counts are unknown and
	// left out; the storage section says why.
	if st.Storage.ActivityPool.Reachable {
		counts, err := c.o.Pool.Counts(ctx)
		if err != nil {
			st.Storage.ActivityPool = c.probe.record(storeActivityPool, fmt.Errorf("reading pool counts: %w", err), c.o.Now())
		}
		for s, n := range counts {
			st.Proxies[s.String()] = n
		}
	}
	if s := c.pub.Last(); s != nil {
		st.Snapshot = SnapshotStatus{Version: s.Version, GeneratedAt: s.GeneratedAt, Proxies: len(s.Proxies)}
	}
	ec := c.ext.Counters()
	st.Extraction = ExtractionCounters{Requests: ec.Requests, Returned: ec.Returned, Insufficient: ec.Insufficient}
	for _, w := range c.pub.Workers() {
		ws := WorkerStatus{ID: w.ID, SnapshotVersion: w.Version}
		if w.ID == c.o.WorkerID && c.o.Worker != nil {
			for _, r := range c.o.Worker.Runtime() {
				ws.Active += r.Active
				ws.Reserved += r.Reserved
			}
		}
		st.Workers = append(st.Workers, ws)
	}
	st.LiveWorkers = c.liveWorkers(ctx)
	return st, nil
}

// liveWorkers reads the fleet's heartbeats; nil without a coordinator or
// when Redis cannot be read (the storage section says why).
func (c *Controller) liveWorkers(ctx context.Context) []WorkerHeartbeat {
	if c.o.Coordinator == nil {
		return nil
	}
	beats, err := c.o.Coordinator.Workers(ctx)
	if err != nil {
		c.log.Debug("reading worker heartbeats", "err", err)
		return nil
	}
	out := make([]WorkerHeartbeat, 0, len(beats))
	for _, b := range beats {
		out = append(out, WorkerHeartbeat{ID: b.Worker, At: b.At, ExpiresAt: b.ExpiresAt, Info: b.Info})
	}
	return out
}

// Upstreams lists every configured upstream with its inventory and fetch
// state.
func (c *Controller) Upstreams(ctx context.Context) ([]UpstreamStatus, error) {
	cfg := c.cfg.Load()
	now := c.o.Now()
	out := make([]UpstreamStatus, 0, len(cfg.Upstreams))
	for _, u := range cfg.Upstreams {
		inv, err := c.inv.Inventory(ctx, u.Name, now)
		if err != nil {
			return nil, fmt.Errorf("reading inventory of %s: %w", u.Name, err)
		}
		ps, err := c.o.Pool.List(ctx, activitypool.Filter{Upstream: u.Name, Limit: maxUpstreamScan})
		if err != nil {
			return nil, fmt.Errorf("listing proxies of %s: %w", u.Name, err)
		}
		states := map[string]int{}
		for i := range ps {
			states[ps[i].State.String()]++
		}
		us := UpstreamStatus{
			Name: u.Name, Plugin: u.Provider.Plugin, Enabled: c.sup.Enabled(u.Name), States: states,
			Managed: inv.Managed, Available: inv.Available, AvailableSlots: inv.AvailableSlots, Pending: inv.Pending,
		}
		fs, running := c.sup.Status(u.Name)
		us.Fetch = fetchStatus(fs, now)
		if !running && us.Fetch.Stopped == "" && !us.Enabled {
			us.Fetch.Stopped = "disabled"
		}
		out = append(out, us)
	}
	return out, nil
}

func fetchStatus(s provider.Status, now time.Time) FetchStatus {
	f := FetchStatus{
		Calls: s.Calls, Success: s.Success, Empty: s.Empty, DuplicateOnly: s.DuplicateOnly, Errors: s.Errors,
		ConsecutiveEmpty: s.ConsecutiveEmpty, ConsecutiveError: s.ConsecutiveErrors, TotalFetched: s.TotalFetched,
		LastOutcome: s.LastOutcome, LastError: s.LastError, Stopped: s.Stopped,
		Leader: s.Leader, LeaderError: s.LeaderError,
	}
	if !s.LastFetchAt.IsZero() {
		t := s.LastFetchAt
		f.LastFetchAt = &t
	}
	// Backoff is reported while it lasts: the next call waits until then.
	if s.BackoffUntil.After(now) {
		t := s.BackoffUntil
		f.BackoffUntil = &t
	}
	return f
}

// Routings lists every routing with its sequential cursor.
func (c *Controller) Routings(ctx context.Context) ([]RoutingStatus, error) {
	cfg := c.cfg.Load()
	out := make([]RoutingStatus, 0, len(cfg.Routings))
	for _, r := range cfg.Routings {
		rs := RoutingStatus{
			Name: r.Name, Strategy: r.Strategy, Upstreams: append([]string(nil), r.Upstreams...),
			OnUnavailable: r.OnUnavailable,
		}
		if r.Strategy == "sequential" {
			cur, err := c.o.Management.Cursor(ctx, r.Name)
			if err != nil {
				return nil, unavailable(fmt.Sprintf("reading routing %q", r.Name), err)
			}
			rs.CurrentIndex = ctlrouting.Effective(cur, len(r.Upstreams))
			rs.Generation = cur.Generation
			if rs.CurrentIndex >= 0 {
				rs.Current = r.Upstreams[rs.CurrentIndex]
			}
		}
		out = append(out, rs)
	}
	return out, nil
}

// Checker returns the health-check queue's state.
func (c *Controller) Checker() CheckerStatus {
	ks := c.sched.Stats()
	return CheckerStatus{
		QueuedHigh: ks.QueuedHigh, QueuedNormal: ks.QueuedNormal, QueueSize: ks.QueueSize,
		InFlight: ks.InFlight, MaxInFlight: ks.MaxInFlight, Dropped: ks.Dropped, Refused: ks.Refused,
		Deferred: c.health.Deferred(), Backlogged: ks.Backlogged(),
	}
}

// FetchDetail returns an upstream's in-flight calls, maxTotal ledger and
// pending depletion.
func (c *Controller) FetchDetail(name string) (FetchDetail, error) {
	u := c.cfg.Load().Upstream(name)
	if u == nil {
		return FetchDetail{}, fmt.Errorf("reading upstream %q: %w", name, ErrUnknownUpstream)
	}
	s, _ := c.sup.Status(name)
	return FetchDetail{InFlight: s.InFlight, MaxTotal: u.Fetch.MaxTotal, MaxTotalUsed: s.LedgerUsed, DepletionPending: s.DepletionPending}, nil
}

// ProxyHealth returns what the EGRESS and TARGET checks know about id.
func (c *Controller) ProxyHealth(id proxy.ID) ProxyHealth {
	var h ProxyHealth
	if e, ok := c.health.Egress(id); ok {
		h.ExitIP, h.Anonymity = e.ExitIP, e.Anonymity.String()
	}
	h.ExcludedRoutings = c.health.ExcludedFrom(id)
	return h
}

// RoutingExclusions returns, per routing with a TARGET check, the proxies
// it currently excludes (what snapshots carry as RoutingExclusions).
func (c *Controller) RoutingExclusions() map[string][]proxy.ID {
	out := map[string][]proxy.ID{}
	for r, ids := range c.health.Exclusions() {
		for id := range ids {
			out[r] = append(out[r], id)
		}
		slices.Sort(out[r])
	}
	return out
}

var _ ctlext.Publisher = (*distribution.Publisher)(nil)
