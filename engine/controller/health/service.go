package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/controller/internal/loop"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Store is the part of the activity pool health needs.
type Store interface {
	Get(ctx context.Context, id proxy.ID) (proxy.Proxy, error)
	List(ctx context.Context, f activitypool.Filter) ([]proxy.Proxy, error)
	Transition(ctx context.Context, id proxy.ID, from, to proxy.State, at time.Time) error
	RecordHealth(ctx context.Context, h activitypool.Health) error
}

// Submitter queues check tasks; *checker.Scheduler implements it.
type Submitter interface {
	Submit(t checker.Task) error
	PendingKey(k checker.Key) bool
	Stats() checker.Stats
}

// Defaults and bounds.
const (
	DefaultSweepEvery = time.Second
	// DefaultSweepLimit bounds how many proxies of each state one sweep
	// reads, so a huge pool costs bounded work per tick.
	DefaultSweepLimit = 5000
	// DefaultMaxTracked bounds each of the in-memory registries: TARGET
	// standings (proxy × routing) and EGRESS results (per proxy).
	DefaultMaxTracked = 100000
	// backlogStretch is how much longer ordinary rechecks wait while the
	// checker has a backlog.
	backlogStretch = 2
)

// TargetSpec is one routing's TARGET check (config routing.check).
type TargetSpec struct {
	Routing string
	// Upstreams are the routing's upstreams: their AVAILABLE proxies are
	// the ones checked against URL.
	Upstreams    []string
	URL          string
	ExpectStatus int
	Interval     time.Duration
}

// EgressInfo is the last successful EGRESS observation of a proxy.
type EgressInfo struct {
	ExitIP    string
	Anonymity Anonymity
	CheckedAt time.Time
}

// Options configures a Service.
type Options struct {
	Store     Store
	Scheduler Submitter
	// Policy returns the check policy of an upstream; ok is false for an
	// upstream that is removed or disabled, whose proxies get no new tasks.
	Policy func(upstream string) (Policy, bool)
	// Targets returns the routings' TARGET checks; nil: none.
	Targets func() []TargetSpec
	// OnChange is told about every decided state change (publish a
	// snapshot, signal the provider). It must not block.
	OnChange func(upstream string, from, to proxy.State)
	// OnTargetChange is told when a routing's exclusions changed. It must
	// not block.
	OnTargetChange func(routing string)
	Now            func() time.Time
	Logger         *slog.Logger
	Registry       *prometheus.Registry
	SweepEvery     time.Duration
	SweepLimit     int
	MaxTracked     int
}

// Service plans checks and applies their observations.
type Service struct {
	o Options
	m *metrics

	mu sync.Mutex
	// targets[routing][proxy]: TARGET standings; specs remembers what each
	// routing checks, so a changed URL starts its standings over.
	targets  map[string]map[proxy.ID]TargetHealth
	specs    map[string]string
	tracked  int
	egress   map[proxy.ID]EgressInfo
	deferred int64
}

// New returns a Service.
func New(o Options) *Service {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OnChange == nil {
		o.OnChange = func(string, proxy.State, proxy.State) {}
	}
	if o.OnTargetChange == nil {
		o.OnTargetChange = func(string) {}
	}
	if o.Targets == nil {
		o.Targets = func() []TargetSpec { return nil }
	}
	if o.SweepEvery <= 0 {
		o.SweepEvery = DefaultSweepEvery
	}
	if o.SweepLimit <= 0 {
		o.SweepLimit = DefaultSweepLimit
	}
	if o.MaxTracked <= 0 {
		o.MaxTracked = DefaultMaxTracked
	}
	return &Service{
		o: o, m: newMetrics(o.Registry),
		targets: map[string]map[proxy.ID]TargetHealth{}, specs: map[string]string{},
		egress: map[proxy.ID]EgressInfo{},
	}
}

// Schedule hands freshly admitted proxies to the checker at once
// (FETCHED -> CHECKING, high priority). A proxy the queue refuses stays
// CHECKING and the next sweep retries it.
func (s *Service) Schedule(ctx context.Context, ids []proxy.ID) {
	now := s.o.Now()
	for _, id := range ids {
		if err := s.o.Store.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, now); err != nil {
			if !errors.Is(err, activitypool.ErrConflict) && !errors.Is(err, activitypool.ErrNotFound) {
				s.o.Logger.Warn("moving proxy to CHECKING", "proxy", id, "err", err)
			}
			continue
		}
		p, err := s.o.Store.Get(ctx, id)
		if err != nil {
			continue
		}
		if pol, ok := s.o.Policy(p.Upstream); ok {
			_ = s.o.Scheduler.Submit(proxyTask(&p, pol, checker.PriorityHigh))
		}
	}
}

// proxyTask is the proxy-level check of p: EGRESS when the upstream has an
// echo service configured (it includes BASIC), BASIC otherwise.
func proxyTask(p *proxy.Proxy, pol Policy, prio checker.Priority) checker.Task {
	t := checker.Task{Proxy: *p, Level: checker.LevelBasic, Priority: prio, Timeout: pol.Timeout, ProbeTarget: pol.ProbeTarget}
	if pol.EgressURL != "" {
		t.Level, t.URL = checker.LevelEgress, pol.EgressURL
	}
	return t
}

func proxyLevel(pol Policy) checker.Level {
	if pol.EgressURL != "" {
		return checker.LevelEgress
	}
	return checker.LevelBasic
}

// Observe applies one observation: reduce, then compare-and-set the
// decision. A proxy that changed state meanwhile (drained, extracted) keeps
// its new state: the observation is stale and dropped. A TARGET
// observation changes only the proxy's standing for its routing.
func (s *Service) Observe(ctx context.Context, obs checker.Observation) error {
	p, err := s.o.Store.Get(ctx, obs.ID)
	if errors.Is(err, activitypool.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading proxy for health decision: %w", err)
	}
	pol, ok := s.o.Policy(p.Upstream)
	if !ok {
		return nil
	}
	if obs.Level == checker.LevelTarget {
		s.observeTarget(&p, obs, pol)
		return nil
	}
	if obs.Level == checker.LevelEgress && obs.Success {
		grade := Grade(obs)
		s.m.egress.WithLabelValues(grade.String()).Inc()
		s.mu.Lock()
		if _, known := s.egress[p.ID]; known || len(s.egress) < s.o.MaxTracked {
			s.egress[p.ID] = EgressInfo{ExitIP: obs.ExitIP, Anonymity: grade, CheckedAt: obs.At}
		}
		s.mu.Unlock()
	}
	next, fails := Reduce(p.State, p.ConsecutiveFails, obs, pol)
	if next == p.State && !governed(p.State) {
		return nil
	}
	passed := Passed(obs, pol)
	result := "success"
	if !passed {
		result = "failure"
	}
	s.m.observations.WithLabelValues(result).Inc()
	err = s.o.Store.RecordHealth(ctx, activitypool.Health{
		ID: p.ID, From: p.State, To: next, CheckedAt: obs.At,
		Success: passed, Latency: obs.Latency, Fails: fails,
	})
	if errors.Is(err, activitypool.ErrConflict) || errors.Is(err, activitypool.ErrNotFound) {
		s.m.conflicts.Inc()
		return nil
	}
	if err != nil {
		return fmt.Errorf("recording health of proxy %s: %w", p.ID, err)
	}
	if next != p.State {
		s.m.transitions.WithLabelValues(p.State.String(), next.String()).Inc()
		s.o.OnChange(p.Upstream, p.State, next)
	}
	return nil
}

func (s *Service) observeTarget(p *proxy.Proxy, obs checker.Observation, pol Policy) {
	if p.State != proxy.StateAvailable && p.State != proxy.StateSuspect {
		return
	}
	result := "success"
	if !obs.Success {
		result = "failure"
	}
	s.m.targetObs.WithLabelValues(result).Inc()
	s.mu.Lock()
	byID, ok := s.targets[obs.Routing]
	if !ok {
		s.mu.Unlock()
		return // routing no longer checked
	}
	prev, known := byID[p.ID]
	if !known && s.tracked >= s.o.MaxTracked {
		s.mu.Unlock()
		return
	}
	next := ReduceTarget(prev, obs, pol)
	byID[p.ID] = next
	if !known {
		s.tracked++
	}
	changed := prev.Excluded != next.Excluded
	if changed {
		s.m.exclusions.WithLabelValues(obs.Routing).Set(float64(countExcluded(byID)))
	}
	s.mu.Unlock()
	if changed {
		s.o.OnTargetChange(obs.Routing)
	}
}

func countExcluded(m map[proxy.ID]TargetHealth) int {
	n := 0
	for _, h := range m {
		if h.Excluded {
			n++
		}
	}
	return n
}

func governed(s proxy.State) bool {
	return s == proxy.StateChecking || s == proxy.StateAvailable || s == proxy.StateSuspect
}

// Exclusions returns, per routing, the proxies excluded from it by their
// TARGET check. The maps are copies.
func (s *Service) Exclusions() map[string]map[proxy.ID]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]map[proxy.ID]bool{}
	for r, byID := range s.targets {
		for id, h := range byID {
			if h.Excluded {
				if out[r] == nil {
					out[r] = map[proxy.ID]bool{}
				}
				out[r][id] = true
			}
		}
	}
	return out
}

// ExcludedFrom lists the routings that exclude id, sorted.
func (s *Service) ExcludedFrom(id proxy.ID) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for r, byID := range s.targets {
		if byID[id].Excluded {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out
}

// Egress returns the last successful EGRESS result of id.
func (s *Service) Egress(id proxy.ID) (EgressInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.egress[id]
	return e, ok
}

// Deferred counts ordinary rechecks postponed because of a backlog.
func (s *Service) Deferred() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deferred
}

// syncSpecs installs the current TARGET specs: a routing that is gone or
// checks something else now loses its standings.
func (s *Service) syncSpecs(specs []TargetSpec) (changed []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	want := make(map[string]string, len(specs))
	for _, sp := range specs {
		want[sp.Routing] = fmt.Sprintf("%s|%d", sp.URL, sp.ExpectStatus)
	}
	for r, fp := range s.specs {
		if want[r] != fp {
			if countExcluded(s.targets[r]) > 0 {
				changed = append(changed, r)
			}
			s.tracked -= len(s.targets[r])
			delete(s.targets, r)
			delete(s.specs, r)
			s.m.exclusions.DeleteLabelValues(r)
		}
	}
	for r, fp := range want {
		if _, ok := s.specs[r]; !ok {
			s.specs[r] = fp
			s.targets[r] = map[proxy.ID]TargetHealth{}
		}
	}
	return changed
}

// prune forgets proxies that are no longer live, so the registries stay
// bounded by the pool.
func (s *Service) prune(live map[proxy.ID]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id := range s.egress {
		if !live[id] {
			delete(s.egress, id)
		}
	}
	for r, byID := range s.targets {
		before := countExcluded(byID)
		for id := range byID {
			if !live[id] {
				delete(byID, id)
				s.tracked--
			}
		}
		if after := countExcluded(byID); after != before {
			s.m.exclusions.WithLabelValues(r).Set(float64(after))
		}
	}
}

func (s *Service) standing(routing string, id proxy.ID) (TargetHealth, bool, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.targets[routing][id]
	return h, ok, s.tracked < s.o.MaxTracked
}

func (s *Service) countDeferred(n int) {
	if n == 0 {
		return
	}
	s.mu.Lock()
	s.deferred += int64(n)
	s.mu.Unlock()
	s.m.deferred.Add(float64(n))
}

// sweep is one planning pass's budget: while the checker has a backlog,
// ordinary rechecks wait backlogStretch times longer and only as many are
// queued as keep the queue under half full; new and SUSPECT proxies are
// never held back.
type sweep struct {
	now      time.Time
	stretch  time.Duration
	room     int // ordinary tasks this pass may still queue; -1 = no limit
	deferred int
}

func (b *sweep) takeNormal() bool {
	if b.room < 0 {
		return true
	}
	if b.room == 0 {
		b.deferred++
		return false
	}
	b.room--
	return true
}

// Sweep queues every check that is due: FETCHED proxies missed by
// Schedule, CHECKING and SUSPECT retries (high priority), AVAILABLE
// rechecks at their jittered interval (normal priority), and TARGET checks
// of AVAILABLE proxies for every routing with a check (the first one high,
// then normal at the routing's interval). Each state reads at most
// SweepLimit proxies.
func (s *Service) Sweep(ctx context.Context) error {
	b := &sweep{now: s.o.Now(), stretch: 1, room: -1}
	if st := s.o.Scheduler.Stats(); st.Backlogged() {
		b.stretch = backlogStretch
		b.room = max(st.QueueSize/2-st.QueuedHigh-st.QueuedNormal, 0)
	}
	specs := s.o.Targets()
	for _, r := range s.syncSpecs(specs) {
		s.o.OnTargetChange(r)
	}
	var (
		errs     []error
		live     = map[proxy.ID]bool{}
		complete = true
	)
	for _, st := range []proxy.State{proxy.StateFetched, proxy.StateChecking, proxy.StateSuspect, proxy.StateAvailable} {
		ps, err := s.o.Store.List(ctx, activitypool.Filter{States: []proxy.State{st}, Limit: s.o.SweepLimit})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s proxies: %w", st, err))
			complete = false
			continue
		}
		if len(ps) >= s.o.SweepLimit {
			complete = false
		}
		if st == proxy.StateFetched {
			ids := make([]proxy.ID, 0, len(ps))
			for i := range ps {
				ids = append(ids, ps[i].ID)
			}
			s.Schedule(ctx, ids)
			continue
		}
		for i := range ps {
			p := &ps[i]
			live[p.ID] = true
			pol, ok := s.o.Policy(p.Upstream)
			if !ok {
				continue
			}
			s.planProxy(p, pol, b)
			if st == proxy.StateAvailable {
				s.planTargets(p, pol, specs, b)
			}
		}
	}
	if complete {
		s.prune(live)
	}
	s.countDeferred(b.deferred)
	return errors.Join(errs...)
}

func (s *Service) planProxy(p *proxy.Proxy, pol Policy, b *sweep) {
	if s.o.Scheduler.PendingKey(checker.Key{ID: p.ID, Level: proxyLevel(pol)}) {
		return
	}
	if p.State != proxy.StateAvailable {
		if due(p, pol, b.now, 1) {
			_ = s.o.Scheduler.Submit(proxyTask(p, pol, checker.PriorityHigh))
		}
		return
	}
	if due(p, pol, b.now, b.stretch) && b.takeNormal() {
		_ = s.o.Scheduler.Submit(proxyTask(p, pol, checker.PriorityNormal))
	}
}

func (s *Service) planTargets(p *proxy.Proxy, pol Policy, specs []TargetSpec, b *sweep) {
	for i := range specs {
		sp := &specs[i]
		if !contains(sp.Upstreams, p.Upstream) {
			continue
		}
		if s.o.Scheduler.PendingKey(checker.Key{ID: p.ID, Level: checker.LevelTarget, Routing: sp.Routing}) {
			continue
		}
		h, known, room := s.standing(sp.Routing, p.ID)
		prio := checker.PriorityNormal
		switch {
		case !known && !room:
			continue // registry full: no standing could be kept
		case !known:
			prio = checker.PriorityHigh // a new proxy's first check for this routing
		case b.now.Before(nextAt(string(p.ID)+"\x00"+sp.Routing, h.CheckedAt, sp.Interval*b.stretch)):
			continue
		case !b.takeNormal():
			continue
		}
		_ = s.o.Scheduler.Submit(checker.Task{
			Proxy: *p, Level: checker.LevelTarget, Priority: prio, Timeout: pol.Timeout,
			URL: sp.URL, ExpectStatus: sp.ExpectStatus, Routing: sp.Routing,
		})
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func due(p *proxy.Proxy, pol Policy, now time.Time, stretch time.Duration) bool {
	if p.LastCheckedAt.IsZero() {
		return true
	}
	if p.State == proxy.StateAvailable {
		return !now.Before(NextRecheck(p.ID, p.LastCheckedAt, pol.Interval*stretch))
	}
	return !now.Before(p.LastCheckedAt.Add(retryDelay(pol.Interval)))
}

// Run sweeps every SweepEvery until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	loop.Run(ctx, s.o.SweepEvery, nil, s.o.Logger, "health sweep", s.Sweep)
	return nil
}

type metrics struct {
	observations *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	conflicts    prometheus.Counter
	targetObs    *prometheus.CounterVec
	exclusions   *prometheus.GaugeVec
	egress       *prometheus.CounterVec
	deferred     prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "observations_total",
			Help: "Proxy-level check observations applied, by result (after the anonymity policy).",
		}, []string{"result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "transitions_total",
			Help: "Proxy state changes decided by the health reducer.",
		}, []string{"from", "to"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "conflicts_total",
			Help: "Health decisions dropped because the proxy changed state concurrently.",
		}),
		targetObs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "target_observations_total",
			Help: "TARGET check observations applied, by result.",
		}, []string{"result"}),
		exclusions: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "routing_exclusions",
			Help: "Proxies excluded from a routing by its TARGET check.",
		}, []string{"routing"}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "egress_total",
			Help: "Completed EGRESS checks, by the anonymity they showed.",
		}, []string{"anonymity"}),
		deferred: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "rechecks_deferred_total",
			Help: "Ordinary rechecks postponed because the checker had a backlog.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.observations, m.transitions, m.conflicts, m.targetObs, m.exclusions, m.egress, m.deferred)
	}
	return m
}

var _ Submitter = (*checker.Scheduler)(nil)

var _ Store = activitypool.Pool(nil)
