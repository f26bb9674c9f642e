package distribution

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/controller/internal/loop"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Store is the part of the activity pool the publisher needs. A store that
// is also an activitypool.ChangeFeed is followed through its changes, so a
// round costs what changed since the last; any other is listed every
// round.
type Store interface {
	List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error)
	SetOwner(ctx context.Context, ids []proxy.ID, owner string) error
}

// CursorReader reads sequential cursors; management.Store implements it.
type CursorReader interface {
	Cursor(ctx context.Context, routing string) (routing.Cursor, error)
}

// Defaults and bounds.
const (
	DefaultEvery       = time.Second
	DefaultMaxProxies  = 100000
	DefaultMaxStaleAge = 2 * time.Minute
	applyTimeout       = 5 * time.Second
	// restFactor paces Run: a round that took d is followed by at least
	// restFactor × d (at most Every) before the next one, so a storm of
	// triggers — a pool growing by thousands of proxies a second, each
	// turning AVAILABLE — spends at most a quarter of a core on publishing
	// while rounds take under Every/3 (a longer round rests Every) and
	// leaves the rest to the gateway. Publish called directly (extraction's
	// revocation) is never held back.
	restFactor = 3
)

// View is the configuration-derived part of a snapshot, swapped on reload
// and admin changes.
type View struct {
	Rules       []routing.Rule
	Disabled    map[string]bool
	MaxStaleAge time.Duration
}

// Options configures a Publisher.
type Options struct {
	Store   Store
	Cursors CursorReader
	// OnPublished is told about each worker's applied snapshot (workerID
	// "" when no worker is registered and the snapshot was only built). It
	// must not block nor modify the snapshot.
	OnPublished func(workerID string, s *worker.Snapshot)
	// Exclusions returns, per routing, proxies that routing must not use
	// (failed TARGET checks); nil: none. Called once per publish.
	Exclusions func() map[string]map[proxy.ID]bool
	Now        func() time.Time
	Logger     *slog.Logger
	Registry   *prometheus.Registry
	Every      time.Duration
	MaxProxies int
}

// WorkerState is a registered worker as the publisher last saw it.
type WorkerState struct {
	ID      string
	Version uint64 // last version applied successfully
	Proxies int
	Err     string
}

type registered struct {
	id      string
	applier worker.Applier
	state   WorkerState
	out     output
}

// Publisher builds and pushes snapshots.
type Publisher struct {
	o       Options
	view    atomic.Pointer[View]
	trigger chan struct{}
	m       *metrics

	// mu serialises publishes so workers see versions in order, and so a
	// Publish that returns has the last word: one running concurrently
	// that read the exclusions before an Exclude cannot apply its older
	// snapshot afterwards. Revocation for extraction relies on this.
	mu      sync.Mutex
	workers []*registered
	mirror  *mirror
	solo    output // the snapshot's proxies while no worker is registered
	version uint64
	cursors map[string]routing.Cursor // last known, for a store outage
	// cursorDown marks routings whose cursor read is failing, so an outage
	// is logged when it starts and ends rather than on every publish.
	cursorDown map[string]bool
	last       atomic.Pointer[worker.Snapshot]
	applied    atomic.Uint64

	exMu     sync.Mutex
	excluded map[proxy.ID]int
	exGen    uint64 // counts Exclude and Include calls

	// Run's pacing: clock measures rounds (the monotonic clock, never the
	// domain clock o.Now, which may be fake or step), rest waits d or
	// until ctx ends. Tests replace both.
	clock func() time.Time
	rest  func(ctx context.Context, d time.Duration)
}

// New returns a Publisher with an empty view.
func New(o Options) *Publisher {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OnPublished == nil {
		o.OnPublished = func(string, *worker.Snapshot) {}
	}
	if o.Exclusions == nil {
		o.Exclusions = func() map[string]map[proxy.ID]bool { return nil }
	}
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.MaxProxies <= 0 {
		o.MaxProxies = DefaultMaxProxies
	}
	p := &Publisher{
		o: o, trigger: make(chan struct{}, 1), m: newMetrics(o.Registry), mirror: newMirror(o.Store, o.MaxProxies),
		cursors: map[string]routing.Cursor{}, cursorDown: map[string]bool{}, excluded: map[proxy.ID]int{},
	}
	p.view.Store(&View{MaxStaleAge: DefaultMaxStaleAge})
	p.clock = time.Now
	p.rest = func(ctx context.Context, d time.Duration) {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
	return p
}

// Register adds a worker; its first snapshot comes with the next publish.
func (p *Publisher) Register(id string, a worker.Applier) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.workers {
		if w.id == id {
			w.applier = a
			return
		}
	}
	p.workers = append(p.workers, &registered{id: id, applier: a, state: WorkerState{ID: id}})
}

// SetView installs a new configuration view; call Trigger or Publish to
// push it.
func (p *Publisher) SetView(v View) {
	if v.MaxStaleAge <= 0 {
		v.MaxStaleAge = DefaultMaxStaleAge
	}
	p.view.Store(&v)
}

// Exclude keeps ids out of assignment and out of every snapshot until a
// matching Include. Exclusions nest (a count per id).
func (p *Publisher) Exclude(ids []proxy.ID) {
	p.exMu.Lock()
	for _, id := range ids {
		p.excluded[id]++
	}
	p.exGen++
	p.exMu.Unlock()
}

// Include releases an Exclude.
func (p *Publisher) Include(ids []proxy.ID) {
	p.exMu.Lock()
	for _, id := range ids {
		if p.excluded[id] <= 1 {
			delete(p.excluded, id)
		} else {
			p.excluded[id]--
		}
	}
	p.exGen++
	p.exMu.Unlock()
}

func (p *Publisher) excludedSet() (map[proxy.ID]bool, uint64) {
	p.exMu.Lock()
	defer p.exMu.Unlock()
	out := make(map[proxy.ID]bool, len(p.excluded))
	for id := range p.excluded {
		out[id] = true
	}
	return out, p.exGen
}

// Trigger asks for a publish soon; triggers coalesce.
func (p *Publisher) Trigger() {
	select {
	case p.trigger <- struct{}{}:
	default:
	}
}

// Last returns the last snapshot applied to the first registered worker
// (or built, when none is registered); nil before the first publish.
func (p *Publisher) Last() *worker.Snapshot { return p.last.Load() }

// Version is the last version applied to every worker: a proxy removed from
// snapshots before it can no longer be allocated anywhere.
func (p *Publisher) Version() uint64 { return p.applied.Load() }

// Workers returns the registered workers' states.
func (p *Publisher) Workers() []WorkerState {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]WorkerState, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, w.state)
	}
	return out
}

// Run publishes every Every and on Trigger until ctx is done, resting
// restFactor times as long as each round took before the next.
func (p *Publisher) Run(ctx context.Context) error {
	var next time.Time
	loop.Run(ctx, p.o.Every, p.trigger, p.o.Logger, "publishing snapshot", func(ctx context.Context) error {
		if d := next.Sub(p.clock()); d > 0 {
			p.rest(ctx, d)
			if ctx.Err() != nil {
				return nil
			}
		}
		start := p.clock()
		err := p.Publish(ctx)
		end := p.clock()
		next = end.Add(min(restFactor*end.Sub(start), p.o.Every))
		return err
	})
	return nil
}

// Publish builds and applies one snapshot per worker. A worker's proxy
// list is rebuilt only when its proxies, the exclusions or their
// usability changed since the last round; otherwise the previous list is
// handed out again (snapshots are never modified once built).
func (p *Publisher) Publish(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	start := time.Now()
	now := p.o.Now()
	view := p.view.Load()
	excluded, exGen := p.excludedSet()
	cursors := p.readCursors(ctx, view.Rules)

	var errs []error
	if len(p.workers) > 0 {
		if err := p.mirror.sync(ctx); err != nil {
			errs = append(errs, fmt.Errorf("listing proxies to assign: %w", err))
		} else if err := p.assign(ctx, now, excluded); err != nil {
			errs = append(errs, err)
		}
	}
	// Re-read after the ownership write: a proxy is published only if it
	// was AVAILABLE and owned by the worker at this read, so one extracted
	// concurrently (unowned, hence never published) cannot slip in.
	if err := p.mirror.sync(ctx); err != nil {
		p.m.publishes.WithLabelValues("error").Inc()
		return errors.Join(append(errs, fmt.Errorf("listing available proxies: %w", err))...)
	}
	if len(p.workers) == 0 {
		if p.mirror.changed("", true) || p.solo.stale(now, exGen) {
			p.solo = p.mirror.build("", true, now, excluded, exGen, p.o.MaxProxies)
		}
	} else {
		p.solo = output{}
		for _, w := range p.workers {
			if p.mirror.changed(w.id, false) || w.out.stale(now, exGen) {
				w.out = p.mirror.build(w.id, false, now, excluded, exGen, p.o.MaxProxies)
			}
		}
	}
	p.mirror.clean()
	p.version++
	base := worker.Snapshot{
		Version:     p.version,
		GeneratedAt: now,
		ValidUntil:  now.Add(view.MaxStaleAge),
		Routings:    view.Rules,
		Cursors:     cursors,
		Disabled:    view.Disabled,
	}
	p.m.version.Set(float64(p.version))
	exclusions := p.o.Exclusions()
	if len(p.workers) == 0 {
		s := base
		s.Proxies = p.solo.proxies
		s.RoutingExclusions = routingExclusions(view.Rules, exclusions, s.Proxies)
		p.last.Store(&s)
		p.applied.Store(s.Version)
		p.o.OnPublished("", &s)
		p.m.duration.Observe(time.Since(start).Seconds())
		return errors.Join(errs...)
	}
	allOK := true
	for i, w := range p.workers {
		s := base
		s.Proxies = w.out.proxies
		s.RoutingExclusions = routingExclusions(view.Rules, exclusions, s.Proxies)
		actx, cancel := context.WithTimeout(ctx, applyTimeout)
		err := w.applier.Apply(actx, &s)
		cancel()
		if err != nil {
			allOK = false
			w.state.Err = err.Error()
			p.m.publishes.WithLabelValues("error").Inc()
			errs = append(errs, fmt.Errorf("applying snapshot %d to worker %s: %w", s.Version, w.id, err))
			continue
		}
		w.state = WorkerState{ID: w.id, Version: s.Version, Proxies: len(s.Proxies)}
		p.m.publishes.WithLabelValues("ok").Inc()
		p.m.proxies.WithLabelValues(w.id).Set(float64(len(s.Proxies)))
		if i == 0 {
			p.last.Store(&s)
		}
		p.o.OnPublished(w.id, &s)
	}
	if allOK {
		p.applied.Store(p.version)
	}
	p.m.duration.Observe(time.Since(start).Seconds())
	return errors.Join(errs...)
}

// routingExclusions restricts the exclusions to the configured routings
// and to the proxies this snapshot carries (sorted by ID, so each lookup
// is a binary search); nil when none applies.
func routingExclusions(rules []routing.Rule, ex map[string]map[proxy.ID]bool, ps []proxy.Proxy) map[string][]proxy.ID {
	if len(ex) == 0 || len(ps) == 0 {
		return nil
	}
	var out map[string][]proxy.ID
	for _, r := range rules {
		var hit []proxy.ID
		for id, on := range ex[r.Name] {
			if _, ok := slices.BinarySearchFunc(ps, id, func(p proxy.Proxy, id proxy.ID) int { return cmp.Compare(p.ID, id) }); on && ok {
				hit = append(hit, id)
			}
		}
		if len(hit) > 0 {
			slices.Sort(hit)
			if out == nil {
				out = map[string][]proxy.ID{}
			}
			out[r.Name] = append(out[r.Name], hit...)
		}
	}
	return out
}

// readCursors returns the effective index of every sequential rule. A
// store failure keeps the last known cursor (seed 000 §18: workers keep
// routing while the management store is down).
func (p *Publisher) readCursors(ctx context.Context, rules []routing.Rule) map[string]int {
	out := map[string]int{}
	for _, r := range rules {
		if r.Strategy != routing.Sequential {
			continue
		}
		c, err := p.o.Cursors.Cursor(ctx, r.Name)
		if err != nil {
			// Logged once per outage, not once per publish.
			if !p.cursorDown[r.Name] {
				p.cursorDown[r.Name] = true
				p.o.Logger.Warn("reading routing cursor; using the last known until the store answers", "routing", r.Name, "err", err)
			}
			c = p.cursors[r.Name]
		} else {
			if p.cursorDown[r.Name] {
				delete(p.cursorDown, r.Name)
				p.o.Logger.Info("routing cursor readable again", "routing", r.Name)
			}
			p.cursors[r.Name] = c
		}
		out[r.Name] = ctlrouting.Effective(c, len(r.Upstreams))
	}
	for name := range p.cursors { // routings removed by a reload
		if _, ok := out[name]; !ok {
			delete(p.cursors, name)
			delete(p.cursorDown, name)
		}
	}
	return out
}

// assign gives unowned, usable, non-excluded AVAILABLE proxies (of the
// synced mirror) to the workers owning the fewest.
func (p *Publisher) assign(ctx context.Context, now time.Time, excluded map[proxy.ID]bool) error {
	free := p.mirror.freeIDs(now, excluded)
	if len(free) == 0 {
		return nil
	}
	owned := map[string]int{}
	for _, w := range p.workers {
		owned[w.id] = p.mirror.owned[w.id]
	}
	batches := map[string][]proxy.ID{}
	for _, id := range free {
		best := p.workers[0].id
		for _, w := range p.workers[1:] {
			if owned[w.id] < owned[best] {
				best = w.id
			}
		}
		owned[best]++
		batches[best] = append(batches[best], id)
	}
	var errs []error
	for _, w := range p.workers {
		if ids := batches[w.id]; len(ids) > 0 {
			err := p.o.Store.SetOwner(ctx, ids, w.id)
			if errors.Is(err, activitypool.ErrConflict) || errors.Is(err, activitypool.ErrNotFound) {
				// A proxy changed meanwhile (extracted, drained) and the
				// batch is all or nothing: assign the others one by one.
				err = nil
				for _, id := range ids {
					if e := p.o.Store.SetOwner(ctx, []proxy.ID{id}, w.id); e != nil && !errors.Is(e, activitypool.ErrConflict) && !errors.Is(e, activitypool.ErrNotFound) {
						err = e
					}
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("assigning %d proxies to worker %s: %w", len(ids), w.id, err))
			}
		}
	}
	return errors.Join(errs...)
}

type metrics struct {
	publishes *prometheus.CounterVec
	duration  prometheus.Histogram
	version   prometheus.Gauge
	proxies   *prometheus.GaugeVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "distribution", Name: "publish_total",
			Help: "Snapshot applications to workers, by result.",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "proxypool", Subsystem: "distribution", Name: "publish_duration_seconds",
			Help:    "Time to build and apply one round of snapshots.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 10),
		}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "distribution", Name: "snapshot_version",
			Help: "Version of the last snapshot built.",
		}),
		proxies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "distribution", Name: "snapshot_proxies",
			Help: "Proxies in the last snapshot applied to a worker.",
		}, []string{"worker"}),
	}
	if reg != nil {
		reg.MustRegister(m.publishes, m.duration, m.version, m.proxies)
	}
	return m
}

var (
	_ Store        = activitypool.Pool(nil)
	_ CursorReader = management.Store(nil)
)
