package dispatch

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

// Bounds of one Acquire. They keep the worst case of a 100k-proxy snapshot
// inside the seed 000 §17.2 budget (p99 < 100µs) whatever the pool's state.
const (
	// MaxExclude is how many proxies a retry may exclude.
	MaxExclude = 2
	// Window is how many eligible candidates least-connections compares:
	// exact for pools up to this size, a random window of a larger one
	// (starting at a random offset), which balances nearly as well.
	Window = 256
	// MaxProbes bounds the entries one selection looks at, eligible or
	// not: a pool where fewer than one in MaxProbes proxies has a free
	// slot is refused as busy instead of scanned to the end.
	MaxProbes = 2048
	// maxRounds bounds selections when reservations keep losing the race
	// for a proxy's last slot.
	maxRounds = 4
)

// Request is what Acquire routes. It is passed by pointer and not retained.
type Request struct {
	Host   string // lower case, no port, no trailing dot
	Port   uint16
	Client string
	// Exclude lists proxies a retry must not use; empty slots are unused.
	Exclude [MaxExclude]proxy.ID
}

// AddExclude records id as excluded; false when the list is full.
func (r *Request) AddExclude(id proxy.ID) bool {
	for i := range r.Exclude {
		if r.Exclude[i] == "" || r.Exclude[i] == id {
			r.Exclude[i] = id
			return true
		}
	}
	return false
}

func (r *Request) excluded(id proxy.ID) bool {
	// Excluded IDs come from the same snapshot targets, so equal strings
	// usually share a pointer and compare in constant time.
	return id == r.Exclude[0] || id == r.Exclude[1]
}

// Allocation states.
const (
	stateFree uint32 = iota
	stateReserved
	stateCommitted
	stateReleased
)

// Allocation is one reservation on one proxy. Allocations come from a
// sync.Pool so that the hot path allocates nothing; the price is that after
// Release the allocation belongs to the dispatcher again and may be handed
// to another request. A repeated Release is detected and counted as long as
// the allocation was not handed out again in between — which covers the
// classic double release (a deferred Release plus an explicit one) but is
// a safety net, not a licence: the owner releases exactly once and drops
// the pointer, as the ingress does.
type Allocation struct {
	// Target is the proxy to use.
	Target *snapshot.Target
	// Rule is the routing rule that matched.
	Rule *snapshot.Rule

	counter *snapshot.Counter
	state   atomic.Uint32
	started int64
}

// Committed reports whether Commit succeeded on a.
func (a *Allocation) Committed() bool { return a.state.Load() == stateCommitted }

// Loader returns the current snapshot; *snapshot.Holder implements it.
type Loader interface {
	Load() *snapshot.Snapshot
}

// OutcomeQueue takes outcomes without blocking (dropping when full).
type OutcomeQueue interface {
	Enqueue(worker.Outcome)
}

// Options configure a Dispatcher.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxStaleAge refuses allocation when the snapshot was applied longer
	// ago than this; 0 disables the check (ValidUntil still applies).
	MaxStaleAge time.Duration
	// Outcomes receives the outcome of every released allocation that has
	// a verdict; nil drops them.
	Outcomes OutcomeQueue
	// Registerer receives the dispatch metrics; nil keeps them private.
	Registerer prometheus.Registerer
}

// Dispatcher implements Acquire/Commit/Release over a snapshot Loader.
type Dispatcher struct {
	snaps    Loader
	now      func() time.Time
	maxStale atomic.Int64
	outcomes OutcomeQueue
	pool     sync.Pool

	failNoRoute   prometheus.Counter
	failStale     prometheus.Counter
	failReason    [numReasons]prometheus.Counter
	releaseErrors prometheus.Counter
}

// New returns a Dispatcher reading snapshots from snaps.
func New(snaps Loader, o Options) *Dispatcher {
	d := &Dispatcher{snaps: snaps, now: o.Now, outcomes: o.Outcomes}
	if d.now == nil {
		d.now = time.Now
	}
	d.maxStale.Store(int64(o.MaxStaleAge))
	d.pool.New = func() any { return new(Allocation) }
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "proxypool", Subsystem: "gateway", Name: "dispatch_failures_total",
		Help: "Acquire refusals by reason.",
	}, []string{"reason"})
	d.releaseErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: "proxypool", Subsystem: "gateway", Name: "release_errors_total",
		Help: "Release calls on an allocation that was already released (or nil).",
	})
	// Children are resolved once: the refusal path only increments.
	d.failNoRoute = failures.WithLabelValues("no_route")
	d.failStale = failures.WithLabelValues("stale")
	for r := ReasonEmpty; r < numReasons; r++ {
		d.failReason[r] = failures.WithLabelValues(r.String())
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(failures, d.releaseErrors)
	}
	return d
}

// SetMaxStaleAge changes the staleness bound (config reload).
func (d *Dispatcher) SetMaxStaleAge(age time.Duration) { d.maxStale.Store(int64(age)) }

// Acquire routes req and reserves one slot on the least-loaded candidate.
// It refuses with ErrStale, ErrNoRoute or a *NoCandidateError. ctx is not
// consulted today: Acquire never waits (onUnavailable "wait" will).
func (d *Dispatcher) Acquire(_ context.Context, req *Request) (*Allocation, error) {
	s := d.snaps.Load()
	now := d.now().UnixNano()
	if s == nil || s.Stale(now, time.Duration(d.maxStale.Load())) {
		d.failStale.Inc()
		return nil, ErrStale
	}
	q := routing.Request{Host: req.Host, Port: req.Port, Client: req.Client}
	rule := s.Route(&q)
	if rule == nil {
		d.failNoRoute.Inc()
		return nil, ErrNoRoute
	}
	list := rule.Candidates()
	if len(list) == 0 {
		return nil, d.refuse(emptyReason(rule))
	}
	for range maxRounds {
		i, why := pick(list, now, req)
		if i < 0 {
			return nil, d.refuse(why)
		}
		e := &list[i]
		if e.Counter().TryReserve(e.Limit()) {
			a := d.pool.Get().(*Allocation)
			a.Target, a.Rule, a.counter, a.started = e.Target(), rule, e.Counter(), now
			a.state.Store(stateReserved)
			return a, nil
		}
		// Lost the last slot to a concurrent reservation: the counter
		// now reads full, so the next selection passes over it.
	}
	return nil, d.refuse(ReasonBusy)
}

func emptyReason(r *snapshot.Rule) Reason {
	switch {
	case r.Exhausted:
		return ReasonExhausted
	case r.Disabled:
		return ReasonDisabled
	}
	return ReasonEmpty
}

func (d *Dispatcher) refuse(r Reason) error {
	d.failReason[r].Inc()
	return noCandidate[r]
}

// pick returns the index of the least-loaded eligible entry, scanning from
// a random offset so that ties break randomly, or -1 and the reason none
// qualified. It stops early at an idle proxy (nothing beats zero), after
// Window eligible entries, or after MaxProbes entries.
func pick(list []snapshot.Entry, now int64, req *Request) (int, Reason) {
	n := len(list)
	// math/rand/v2's top-level source is per-thread runtime state: no lock,
	// no allocation.
	i := int(rand.Uint64N(uint64(n)))
	checkExclude := req.Exclude[0] != ""
	best, bestLoad := -1, ^uint64(0)
	eligible := 0
	var sawExcluded, sawBusy bool
	for probes := min(n, MaxProbes); probes > 0; probes-- {
		idx := i
		if i++; i == n {
			i = 0
		}
		e := &list[idx]
		if now >= e.UsableUntil() {
			continue
		}
		if checkExclude && req.excluded(e.Target().ID) {
			sawExcluded = true
			continue
		}
		load := e.Counter().InUse()
		if load >= e.Limit() {
			sawBusy = true
			continue
		}
		if load < bestLoad {
			best, bestLoad = idx, load
			if load == 0 {
				break
			}
		}
		if eligible++; eligible >= Window {
			break
		}
	}
	if best >= 0 {
		return best, 0
	}
	switch {
	case sawBusy:
		return -1, ReasonBusy
	case sawExcluded:
		return -1, ReasonExcluded
	}
	return -1, ReasonExpired
}

// Commit turns a's reservation into an active count; it fails with
// ErrAllocationState unless a is reserved (so a second Commit fails).
func (d *Dispatcher) Commit(a *Allocation) error {
	if a == nil || !a.state.CompareAndSwap(stateReserved, stateCommitted) {
		return ErrAllocationState
	}
	a.counter.Commit()
	return nil
}

// Release ends a: it drops the reservation of an uncommitted allocation or
// the active count of a committed one, reports the outcome, and returns a
// to the pool. The caller sets o.Success and o.Phase; Release fills in the
// proxy, upstream, routing, latency and time. An outcome with neither
// success nor a failure phase (the client went away) says nothing about the
// proxy and is not reported. Releasing an allocation again only increments
// proxypool_gateway_release_errors_total.
func (d *Dispatcher) Release(a *Allocation, o worker.Outcome) {
	if a == nil {
		d.releaseErrors.Inc()
		return
	}
	for {
		switch st := a.state.Load(); st {
		case stateReserved:
			if !a.state.CompareAndSwap(st, stateReleased) {
				continue // a concurrent Commit won; release the active count
			}
			a.counter.CancelReservation()
		case stateCommitted:
			if !a.state.CompareAndSwap(st, stateReleased) {
				continue
			}
			a.counter.ReleaseActive()
		default:
			d.releaseErrors.Inc()
			return
		}
		break
	}
	if d.outcomes != nil && (o.Success || o.Phase != worker.PhaseNone) {
		now := d.now()
		o.Proxy, o.Upstream, o.Routing = a.Target.ID, a.Target.Upstream, a.Rule.Name
		if o.Latency == 0 {
			o.Latency = time.Duration(now.UnixNano() - a.started)
		}
		if o.At.IsZero() {
			o.At = now
		}
		d.outcomes.Enqueue(o)
	}
	a.Target, a.Rule, a.counter = nil, nil, nil
	d.pool.Put(a)
}
