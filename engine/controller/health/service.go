package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/proxypool/proxypool/engine/checker"
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
	Pending(id proxy.ID) bool
}

// Defaults.
const (
	DefaultSweepEvery = time.Second
	// DefaultSweepLimit bounds how many proxies of each state one sweep
	// reads, so a huge pool costs bounded work per tick.
	DefaultSweepLimit = 5000
)

// Options configures a Service.
type Options struct {
	Store     Store
	Scheduler Submitter
	// Policy returns the check policy of an upstream; ok is false for an
	// upstream that is removed or disabled, whose proxies get no new tasks.
	Policy func(upstream string) (Policy, bool)
	// OnChange is told about every decided state change (publish a
	// snapshot, signal the provider). It must not block.
	OnChange   func(upstream string, from, to proxy.State)
	Now        func() time.Time
	Logger     *slog.Logger
	Registry   *prometheus.Registry
	SweepEvery time.Duration
	SweepLimit int
}

// Service plans checks and applies their observations.
type Service struct {
	o Options
	m *metrics
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
	if o.SweepEvery <= 0 {
		o.SweepEvery = DefaultSweepEvery
	}
	if o.SweepLimit <= 0 {
		o.SweepLimit = DefaultSweepLimit
	}
	return &Service{o: o, m: newMetrics(o.Registry)}
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
		s.submit(&p, checker.PriorityHigh)
	}
}

func (s *Service) submit(p *proxy.Proxy, prio checker.Priority) bool {
	pol, ok := s.o.Policy(p.Upstream)
	if !ok {
		return false
	}
	err := s.o.Scheduler.Submit(checker.Task{Proxy: *p, Level: checker.LevelBasic, Priority: prio, Timeout: pol.Timeout})
	return err == nil
}

// Observe applies one observation: reduce, then compare-and-set the
// decision. A proxy that changed state meanwhile (drained, extracted) keeps
// its new state: the observation is stale and dropped.
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
	next, fails := Reduce(p.State, p.ConsecutiveFails, obs, pol)
	if next == p.State && !governed(p.State) {
		return nil
	}
	result := "success"
	if !obs.Success {
		result = "failure"
	}
	s.m.observations.WithLabelValues(result).Inc()
	err = s.o.Store.RecordHealth(ctx, activitypool.Health{
		ID: p.ID, From: p.State, To: next, CheckedAt: obs.At,
		Success: obs.Success, Latency: obs.Latency, Fails: fails,
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

func governed(s proxy.State) bool {
	return s == proxy.StateChecking || s == proxy.StateAvailable || s == proxy.StateSuspect
}

// Sweep queues every check that is due: FETCHED proxies missed by Schedule,
// CHECKING and SUSPECT retries (high priority), AVAILABLE rechecks at their
// jittered interval (normal priority). Each state reads at most SweepLimit
// proxies.
func (s *Service) Sweep(ctx context.Context) error {
	now := s.o.Now()
	var errs []error
	for _, st := range []proxy.State{proxy.StateFetched, proxy.StateChecking, proxy.StateSuspect, proxy.StateAvailable} {
		ps, err := s.o.Store.List(ctx, activitypool.Filter{States: []proxy.State{st}, Limit: s.o.SweepLimit})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing %s proxies: %w", st, err))
			continue
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
			if s.o.Scheduler.Pending(p.ID) {
				continue
			}
			pol, ok := s.o.Policy(p.Upstream)
			if !ok || !due(p, pol, now) {
				continue
			}
			prio := checker.PriorityHigh
			if st == proxy.StateAvailable {
				prio = checker.PriorityNormal
			}
			s.submit(p, prio)
		}
	}
	return errors.Join(errs...)
}

func due(p *proxy.Proxy, pol Policy, now time.Time) bool {
	if p.LastCheckedAt.IsZero() {
		return true
	}
	if p.State == proxy.StateAvailable {
		return !now.Before(NextRecheck(p.ID, p.LastCheckedAt, pol.Interval))
	}
	return !now.Before(p.LastCheckedAt.Add(retryDelay(pol.Interval)))
}

// Run sweeps every SweepEvery until ctx is done.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.o.SweepEvery)
	defer t.Stop()
	for {
		if err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
			s.o.Logger.Warn("health sweep", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

type metrics struct {
	observations *prometheus.CounterVec
	transitions  *prometheus.CounterVec
	conflicts    prometheus.Counter
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		observations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "observations_total",
			Help: "Check observations applied, by result.",
		}, []string{"result"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "transitions_total",
			Help: "Proxy state changes decided by the health reducer.",
		}, []string{"from", "to"}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "proxypool", Subsystem: "health", Name: "conflicts_total",
			Help: "Health decisions dropped because the proxy changed state concurrently.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.observations, m.transitions, m.conflicts)
	}
	return m
}

var _ Submitter = (*checker.Scheduler)(nil)

var _ Store = activitypool.Pool(nil)
