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
	"github.com/proxypool/proxypool/engine/gateway/sticky"
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
	// MaxWaiters bounds the requests parked by onUnavailable "wait" at
	// once; beyond it a request is refused at once, as with "reject".
	MaxWaiters = 4096
)

// Request is what Acquire routes. It is passed by pointer and not retained
// beyond the allocation (whose session binding keeps Client and the
// session string).
type Request struct {
	Host   string // lower case, no port, no trailing dot
	Port   uint16
	Client string
	// Header is the client's request header (http.Header's map); a sticky
	// rule reads its session header from it. Nil is fine.
	Header map[string][]string
	// UserSession is the session id from the Proxy-Authorization username
	// convention (USER-session-ID); the sticky header wins over it.
	UserSession string
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

// session returns the request's session id for rule, "" when the rule is
// not sticky or the client sent none (or one too long to keep).
func (r *Request) session(rule *snapshot.Rule) string {
	if rule.Sessions == nil {
		return ""
	}
	s := r.UserSession
	if v := r.Header[rule.StickyHeader]; len(v) > 0 && v[0] != "" {
		s = v[0]
	}
	if len(s) > sticky.MaxSessionLen {
		return ""
	}
	return s
}

// Slot states, in the low 32 bits of slot.word; the high 32 bits hold the
// slot's generation.
const (
	stateFree uint64 = iota
	stateReserved
	stateCommitted
	stateReleased
)

// Allocation is the handle of one reservation on one proxy. It is a small
// value: the state lives in a pooled slot, and the handle carries the
// slot's generation, so a Release or Commit through a stale handle (after
// the slot was released and handed to another request) is detected and
// refused instead of acting on someone else's reservation. The zero
// Allocation is invalid.
type Allocation struct {
	// Target is the proxy to use.
	Target *snapshot.Target
	// Rule is the routing rule that matched.
	Rule *snapshot.Rule
	// Sticky: the proxy came from the request's session binding.
	Sticky bool

	s   *slot
	gen uint64
}

// Valid reports whether a came from a successful Acquire.
func (a Allocation) Valid() bool { return a.s != nil }

// Committed reports whether Commit succeeded on a and a is not released.
func (a Allocation) Committed() bool {
	return a.s != nil && a.s.word.Load() == a.gen<<32|stateCommitted
}

// slot is the pooled state of an allocation. Slots come from a sync.Pool
// so that the hot path allocates nothing.
type slot struct {
	word    atomic.Uint64
	counter *snapshot.Counter
	rule    *snapshot.Rule
	target  *snapshot.Target
	started int64
	// client and session key the binding Commit writes; session is empty
	// when the rule is not sticky or the request carries no session.
	client, session string
	until           int64
	gated           bool
	// bound: the proxy came from the session's live binding, which the
	// lookup already refreshed, so Commit need not write it again.
	bound bool
}

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

	// Waiters park on the channel in sig; wake closes it and installs a
	// fresh one. Release wakes only while someone waits, so the common
	// path stays free of allocation.
	waiters atomic.Int64
	sig     atomic.Pointer[chan struct{}]

	failNoRoute   prometheus.Counter
	failStale     prometheus.Counter
	failReason    [numReasons]prometheus.Counter
	releaseErrors prometheus.Counter
	sticky        [numStickyResults]prometheus.Counter
	waits         [numWaitResults]prometheus.Counter
}

type stickyResult uint8

const (
	stickyHit stickyResult = iota
	stickyMiss
	stickyStale
	numStickyResults
)

type waitResult uint8

const (
	waitAcquired waitResult = iota
	waitTimeout
	waitCanceled
	waitFull
	numWaitResults
)

// New returns a Dispatcher reading snapshots from snaps.
func New(snaps Loader, o Options) *Dispatcher {
	d := &Dispatcher{snaps: snaps, now: o.Now, outcomes: o.Outcomes}
	if d.now == nil {
		d.now = time.Now
	}
	ch := make(chan struct{})
	d.sig.Store(&ch)
	d.maxStale.Store(int64(o.MaxStaleAge))
	d.pool.New = func() any { return new(slot) }
	const ns, sub = "proxypool", "gateway"
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "dispatch_failures_total",
		Help: "Acquire refusals by reason.",
	}, []string{"reason"})
	d.releaseErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "release_errors_total",
		Help: "Release or Commit calls through an invalid or stale allocation handle (already released, or reused).",
	})
	stickyVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "sticky_lookups_total",
		Help: "Session binding lookups of sticky routings: hit, miss, or stale (bound proxy unusable; rebound).",
	}, []string{"result"})
	waitVec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: ns, Subsystem: sub, Name: "dispatch_waits_total",
		Help: "Requests parked by onUnavailable wait, by how the wait ended.",
	}, []string{"result"})
	// Children are resolved once: the refusal path only increments.
	d.failNoRoute = failures.WithLabelValues("no_route")
	d.failStale = failures.WithLabelValues("stale")
	for r := ReasonEmpty; r < numReasons; r++ {
		d.failReason[r] = failures.WithLabelValues(r.String())
	}
	for i, n := range []string{"hit", "miss", "stale"} {
		d.sticky[i] = stickyVec.WithLabelValues(n)
	}
	for i, n := range []string{"acquired", "timeout", "canceled", "full"} {
		d.waits[i] = waitVec.WithLabelValues(n)
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(failures, d.releaseErrors, stickyVec, waitVec)
	}
	return d
}

// SetMaxStaleAge changes the staleness bound (config reload).
func (d *Dispatcher) SetMaxStaleAge(age time.Duration) { d.maxStale.Store(int64(age)) }

// Acquire routes req and reserves one slot on a candidate: the session's
// bound proxy when the rule is sticky and the binding is still good, else
// the least-loaded one. It refuses with ErrStale, ErrNoRoute or a
// *NoCandidateError. A rule with onUnavailable "wait" parks the request
// until a release or a snapshot swap frees a candidate, its waitTimeout
// passes or ctx ends.
//
// A refused Acquire returns an invalid Allocation whose Rule is the rule
// that matched (nil when none did), so the caller can apply its
// onUnavailable policy.
func (d *Dispatcher) Acquire(ctx context.Context, req *Request) (Allocation, error) {
	a, rule, err := d.try(req)
	if err == nil {
		return a, nil
	}
	if rule != nil && rule.OnUnavailable == routing.Wait && rule.WaitTimeout > 0 && waitable(err) {
		a, err = d.wait(ctx, req, rule.WaitTimeout, err)
	}
	if err != nil {
		a = Allocation{Rule: rule}
	}
	return a, err
}

func waitable(err error) bool {
	nc, ok := err.(*NoCandidateError)
	if !ok {
		return false
	}
	switch nc.Reason {
	case ReasonEmpty, ReasonExpired, ReasonBusy, ReasonRoutingLimit:
		return true
	}
	return false
}

func (d *Dispatcher) wait(ctx context.Context, req *Request, timeout time.Duration, first error) (Allocation, error) {
	if d.waiters.Add(1) > MaxWaiters {
		d.waiters.Add(-1)
		d.waits[waitFull].Inc()
		return Allocation{}, first
	}
	defer d.waiters.Add(-1)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	err := first
	for {
		// Take the signal before trying, so that a release between the
		// try and the select still wakes us.
		ch := *d.sig.Load()
		var a Allocation
		var rule *snapshot.Rule
		if a, rule, err = d.try(req); err == nil {
			d.waits[waitAcquired].Inc()
			return a, nil
		}
		if rule == nil || !waitable(err) {
			return a, err
		}
		select {
		case <-ch:
		case <-timer.C:
			d.waits[waitTimeout].Inc()
			return Allocation{}, err
		case <-ctx.Done():
			d.waits[waitCanceled].Inc()
			return Allocation{}, err
		}
	}
}

// Wake lets parked requests look again (a snapshot was applied). It costs
// nothing while nobody waits.
func (d *Dispatcher) Wake() {
	if d.waiters.Load() == 0 {
		return
	}
	ch := make(chan struct{})
	close(*d.sig.Swap(&ch))
}

// try is one non-waiting Acquire. It returns the matched rule (nil when
// none matched or the snapshot is stale) so Acquire can decide to wait.
func (d *Dispatcher) try(req *Request) (Allocation, *snapshot.Rule, error) {
	s := d.snaps.Load()
	now := d.now().UnixNano()
	if s == nil || s.Stale(now, time.Duration(d.maxStale.Load())) {
		d.failStale.Inc()
		return Allocation{}, nil, ErrStale
	}
	q := routing.Request{Host: req.Host, Port: req.Port, Client: req.Client}
	rule := s.Route(&q)
	if rule == nil {
		d.failNoRoute.Inc()
		return Allocation{}, nil, ErrNoRoute
	}
	list := rule.Candidates()
	if len(list) == 0 {
		return Allocation{}, rule, d.refuse(emptyReason(rule))
	}
	if rule.Gate != nil && !rule.Gate.TryEnter() {
		return Allocation{}, rule, d.refuse(ReasonRoutingLimit)
	}
	session := req.session(rule)
	if session != "" {
		if id, ok := rule.Sessions.Get(req.Client, session, now); ok {
			if e := rule.Lookup(id); e != nil && now < e.UsableUntil() && !req.excluded(id) && e.Counter().TryReserve(e.Limit()) {
				d.sticky[stickyHit].Inc()
				return d.newAllocation(e, rule, now, req.Client, session, true), rule, nil
			}
			// Gone, unusable, excluded by a retry or full: clear it and
			// choose afresh; Commit binds the new choice.
			rule.Sessions.Delete(req.Client, session, id)
			d.sticky[stickyStale].Inc()
		} else {
			d.sticky[stickyMiss].Inc()
		}
	}
	for range maxRounds {
		i, why := pick(list, now, req)
		if i < 0 {
			return Allocation{}, rule, d.refuseGated(rule, why)
		}
		e := &list[i]
		if e.Counter().TryReserve(e.Limit()) {
			return d.newAllocation(e, rule, now, req.Client, session, false), rule, nil
		}
		// Lost the last slot to a concurrent reservation (or the proxy
		// was withdrawn meanwhile): the counter now reads full, so the
		// next selection passes over it.
	}
	return Allocation{}, rule, d.refuseGated(rule, ReasonBusy)
}

func (d *Dispatcher) newAllocation(e *snapshot.Entry, rule *snapshot.Rule, now int64, client, session string, bound bool) Allocation {
	s := d.pool.Get().(*slot)
	gen := s.word.Load()>>32 + 1
	s.counter, s.rule, s.target, s.started = e.Counter(), rule, e.Target(), now
	s.client, s.session, s.until, s.gated, s.bound = client, session, e.UsableUntil(), rule.Gate != nil, bound
	s.word.Store(gen<<32 | stateReserved)
	return Allocation{Target: s.target, Rule: rule, Sticky: bound, s: s, gen: gen}
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

func (d *Dispatcher) refuseGated(rule *snapshot.Rule, r Reason) error {
	if rule.Gate != nil {
		rule.Gate.Leave()
	}
	return d.refuse(r)
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

// Commit turns a's reservation into an active count and, for a sticky
// rule, binds the request's session to the proxy until the proxy's
// usable_until. It fails with ErrAllocationState unless a is reserved (a
// second Commit, a Commit after Release, or through a stale handle).
func (d *Dispatcher) Commit(a Allocation) error {
	s := a.s
	if s == nil || !s.word.CompareAndSwap(a.gen<<32|stateReserved, a.gen<<32|stateCommitted) {
		return ErrAllocationState
	}
	s.counter.Commit()
	if s.session != "" && !s.bound {
		s.rule.Sessions.Put(s.client, s.session, s.target.ID, s.until, d.now().UnixNano())
	}
	return nil
}

// Release ends a: it drops the reservation of an uncommitted allocation or
// the active count of a committed one, clears the session binding after a
// failure, reports the outcome, and recycles the slot. The caller sets
// o.Success and o.Phase; Release fills in the proxy, upstream, routing,
// latency and time. An outcome with neither success nor a failure phase
// (the client went away) says nothing about the proxy and is not reported.
// A Release through a zero, already released or stale handle changes
// nothing and increments proxypool_gateway_release_errors_total.
func (d *Dispatcher) Release(a Allocation, o worker.Outcome) {
	s := a.s
	if s == nil {
		d.releaseErrors.Inc()
		return
	}
	reserved, committed := a.gen<<32|stateReserved, a.gen<<32|stateCommitted
	for {
		switch w := s.word.Load(); w {
		case reserved:
			if !s.word.CompareAndSwap(w, a.gen<<32|stateReleased) {
				continue // a concurrent Commit won; release the active count
			}
			s.counter.CancelReservation()
		case committed:
			if !s.word.CompareAndSwap(w, a.gen<<32|stateReleased) {
				continue
			}
			s.counter.ReleaseActive()
		default:
			// Released already, or the slot now belongs to another
			// request: touching it would corrupt that one.
			d.releaseErrors.Inc()
			return
		}
		break
	}
	if s.gated {
		s.rule.Gate.Leave()
	}
	failed := !o.Success && o.Phase != worker.PhaseNone
	if failed && s.session != "" {
		s.rule.Sessions.Delete(s.client, s.session, s.target.ID)
	}
	if d.outcomes != nil && (o.Success || failed) {
		now := d.now()
		o.Proxy, o.Upstream, o.Routing = s.target.ID, s.target.Upstream, s.rule.Name
		if o.Latency == 0 {
			o.Latency = time.Duration(now.UnixNano() - s.started)
		}
		if o.At.IsZero() {
			o.At = now
		}
		d.outcomes.Enqueue(o)
	}
	s.counter, s.rule, s.target, s.client, s.session = nil, nil, nil, "", ""
	d.pool.Put(s)
	d.Wake()
}
