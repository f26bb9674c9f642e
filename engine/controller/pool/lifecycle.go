package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/controller/internal/loop"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

// Store is the part of the activity pool the lifecycle needs.
type Store interface {
	List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error)
	Transition(ctx context.Context, id proxy.ID, from, to proxy.State, at time.Time) error
	Remove(ctx context.Context, id proxy.ID) error
	Counts(ctx context.Context) (map[proxy.State]int, error)
}

// Defaults.
const (
	DefaultEvery      = time.Second
	DefaultMaxPerTick = 1000
)

// Options configures a Lifecycle.
type Options struct {
	Store Store
	// Workers returns the runtime readers of every worker that may hold
	// capacity on a proxy.
	Workers func() []worker.RuntimeReader
	// SnapshotVersion returns the version of the last snapshot applied to
	// the workers. A DRAINING proxy expires only after a snapshot newer than
	// the one current when it drained, so no worker can still allocate it.
	// nil disables the fence.
	SnapshotVersion func() uint64
	// Known reports whether an upstream is still configured; proxies of an
	// unknown one drain. nil: all are known.
	Known func(upstream string) bool
	// OnDrop is called (per tick, once per upstream) when an upstream's
	// usable inventory shrank. It must not block.
	OnDrop func(upstream string)
	// OnChange is called when a tick changed anything. It must not block.
	OnChange   func()
	Now        func() time.Time
	Logger     *slog.Logger
	Registry   *prometheus.Registry
	Every      time.Duration
	MaxPerTick int
}

// Result counts what one tick did.
type Result struct {
	Drained, Expired, Unhealthy, Removed int
}

func (r Result) changed() bool { return r.Drained+r.Expired+r.Unhealthy+r.Removed > 0 }

// Lifecycle moves proxies along the state machine as time passes.
type Lifecycle struct {
	o      Options
	signal chan struct{}
	m      *metrics

	mu sync.Mutex
	// drainedAt is the snapshot version current when a proxy was seen
	// DRAINING; bounded by the number of DRAINING proxies.
	drainedAt map[proxy.ID]uint64
}

// New returns a Lifecycle.
func New(o Options) *Lifecycle {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Workers == nil {
		o.Workers = func() []worker.RuntimeReader { return nil }
	}
	if o.Known == nil {
		o.Known = func(string) bool { return true }
	}
	if o.OnDrop == nil {
		o.OnDrop = func(string) {}
	}
	if o.OnChange == nil {
		o.OnChange = func() {}
	}
	if o.Every <= 0 {
		o.Every = DefaultEvery
	}
	if o.MaxPerTick <= 0 {
		o.MaxPerTick = DefaultMaxPerTick
	}
	return &Lifecycle{o: o, signal: make(chan struct{}, 1), m: newMetrics(o.Registry), drainedAt: map[proxy.ID]uint64{}}
}

// Signal asks for a tick soon; signals coalesce.
func (l *Lifecycle) Signal() {
	select {
	case l.signal <- struct{}{}:
	default:
	}
}

// Run ticks every Every or on Signal until ctx is done.
func (l *Lifecycle) Run(ctx context.Context) error {
	loop.Run(ctx, l.o.Every, l.signal, l.o.Logger, "pool lifecycle tick", func(ctx context.Context) error {
		_, err := l.Tick(ctx)
		return err
	})
	return nil
}

// Tick performs one bounded pass.
func (l *Lifecycle) Tick(ctx context.Context) (Result, error) {
	var (
		res     Result
		errs    []error
		dropped = map[string]bool{}
		budget  = l.o.MaxPerTick
		now     = l.o.Now()
	)
	list := func(st proxy.State) []proxy.Proxy {
		if budget <= 0 {
			return nil
		}
		ps, err := l.o.Store.List(ctx, activitypool.Filter{States: []proxy.State{st}, Limit: budget})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s proxies: %w", st, err))
		}
		return ps
	}
	move := func(p *proxy.Proxy, to proxy.State) bool {
		budget--
		err := l.o.Store.Transition(ctx, p.ID, p.State, to, now)
		if errors.Is(err, activitypool.ErrConflict) || errors.Is(err, activitypool.ErrNotFound) {
			return false // moved on concurrently; the next tick sees it
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("moving proxy %s %s -> %s: %w", p.ID, p.State, to, err))
			return false
		}
		l.m.transitions.WithLabelValues(to.String()).Inc()
		return true
	}

	// Past its usable period (or with its upstream gone) a proxy must take
	// no new allocation, but requests already on it may finish: it drains
	// rather than expiring at once.
	version := l.version()
	for _, p := range list(proxy.StateAvailable) {
		if budget <= 0 {
			break
		}
		if now.Before(p.UsableUntil) && l.o.Known(p.Upstream) {
			continue
		}
		if move(&p, proxy.StateDraining) {
			res.Drained++
			dropped[p.Upstream] = true
			l.mu.Lock()
			l.drainedAt[p.ID] = version
			l.mu.Unlock()
		}
	}
	// Proxies that never became AVAILABLE and ran out of time (or lost
	// their upstream) cannot drain: the state machine sends them to
	// UNHEALTHY, and from there to removal.
	for _, st := range []proxy.State{proxy.StateFetched, proxy.StateChecking, proxy.StateSuspect} {
		for _, p := range list(st) {
			if budget <= 0 {
				break
			}
			if now.Before(p.UsableUntil) && l.o.Known(p.Upstream) {
				continue
			}
			if p.State == proxy.StateFetched {
				if !move(&p, proxy.StateChecking) {
					continue
				}
				p.State = proxy.StateChecking
			}
			if move(&p, proxy.StateUnhealthy) {
				res.Unhealthy++
				dropped[p.Upstream] = true
			}
		}
	}
	// DRAINING with no capacity held anywhere, behind the snapshot fence;
	// or past hard expiry, when the vendor has cut it anyway.
	draining := list(proxy.StateDraining)
	l.prune(draining, budget)
	if len(draining) > 0 {
		busy := l.busy()
		for _, p := range draining {
			if budget <= 0 {
				break
			}
			expired := !now.Before(p.ExpiresAt)
			if !expired && (busy[p.ID] || !l.fenced(p.ID, version)) {
				continue
			}
			if move(&p, proxy.StateExpired) {
				res.Expired++
				l.forget(p.ID)
			}
		}
	}
	for _, p := range list(proxy.StateExtracted) {
		if budget <= 0 {
			break
		}
		if now.Before(p.ExpiresAt) {
			continue
		}
		if move(&p, proxy.StateExpired) {
			res.Expired++
		}
	}
	for _, st := range []proxy.State{proxy.StateExpired, proxy.StateUnhealthy} {
		for _, p := range list(st) {
			if budget <= 0 {
				break
			}
			budget--
			err := l.o.Store.Remove(ctx, p.ID)
			if err != nil && !errors.Is(err, activitypool.ErrNotFound) {
				errs = append(errs, fmt.Errorf("removing proxy %s: %w", p.ID, err))
				continue
			}
			l.forget(p.ID)
			res.Removed++
			l.m.transitions.WithLabelValues(proxy.StateRemoved.String()).Inc()
		}
	}
	if counts, err := l.o.Store.Counts(ctx); err == nil {
		for _, st := range proxy.States() {
			l.m.proxies.WithLabelValues(st.String()).Set(float64(counts[st]))
		}
	}
	for u := range dropped {
		l.o.OnDrop(u)
	}
	if res.changed() {
		l.o.OnChange()
	}
	return res, errors.Join(errs...)
}

func (l *Lifecycle) version() uint64 {
	if l.o.SnapshotVersion == nil {
		return 0
	}
	return l.o.SnapshotVersion()
}

// fenced reports whether a snapshot newer than the one current when the
// proxy was first seen DRAINING has been applied. A proxy drained by
// someone else (extraction revoke, a previous process) starts its fence now.
func (l *Lifecycle) fenced(id proxy.ID, current uint64) bool {
	if l.o.SnapshotVersion == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.drainedAt[id]
	if !ok {
		l.drainedAt[id] = current
		return false
	}
	return current > v
}

// prune drops fence entries of proxies no longer DRAINING, when the list
// read was complete, so the map stays bounded by the DRAINING population.
func (l *Lifecycle) prune(draining []proxy.Proxy, limit int) {
	if len(draining) >= limit {
		return
	}
	live := make(map[proxy.ID]bool, len(draining))
	for i := range draining {
		live[draining[i].ID] = true
	}
	l.mu.Lock()
	for id := range l.drainedAt {
		if !live[id] {
			delete(l.drainedAt, id)
		}
	}
	l.mu.Unlock()
}

func (l *Lifecycle) forget(id proxy.ID) {
	l.mu.Lock()
	delete(l.drainedAt, id)
	l.mu.Unlock()
}

// busy is the set of proxies with active or reserved capacity on any
// worker.
func (l *Lifecycle) busy() map[proxy.ID]bool {
	out := map[proxy.ID]bool{}
	for _, w := range l.o.Workers() {
		for _, r := range w.Runtime() {
			if r.Active > 0 || r.Reserved > 0 {
				out[r.ID] = true
			}
		}
	}
	return out
}

type metrics struct {
	transitions *prometheus.CounterVec
	proxies     *prometheus.GaugeVec
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "pool", Name: "lifecycle_transitions_total",
			Help: "Lifecycle moves made by the pool loop, by target state.",
		}, []string{"to"}),
		proxies: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "pool", Name: "proxies",
			Help: "Proxies per lifecycle state, all upstreams.",
		}, []string{"state"}),
	}
	if reg != nil {
		reg.MustRegister(m.transitions, m.proxies)
	}
	return m
}

var _ Store = activitypool.Pool(nil)
