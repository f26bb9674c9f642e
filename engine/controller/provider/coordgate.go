package provider

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/coordination"
)

// Coordinator is the cluster arbiter of fetching (seed 000 §8): the leader
// lease per upstream and the requestInterval / maxInFlight / maxTotal
// decisions under its fence. redisstore.Coordinator implements it.
type Coordinator interface {
	AcquireLeader(ctx context.Context, upstream, holder string, ttl time.Duration) (coordination.Lease, error)
	RenewLeader(ctx context.Context, l coordination.Lease, ttl time.Duration) (coordination.Lease, error)
	ReleaseLeader(ctx context.Context, l coordination.Lease) error
	AcquirePermit(ctx context.Context, l coordination.Lease, r coordination.PermitRequest) (coordination.Permit, error)
	SettlePermit(ctx context.Context, p coordination.Permit, actual int64, known bool) (bool, error)
	Ledger(ctx context.Context, upstream string) (coordination.Ledger, error)
}

// Bounds of the coordinated gate.
const (
	// DefaultLeaseTTL is the leader lease's TTL when none is configured
	// (config.DefaultLeaderTTL): a crashed leader is replaced within it.
	DefaultLeaseTTL = 10 * time.Second
	// permitSlack is added to fetch.timeout for a permit's TTL: the call is
	// bounded by the timeout, the settlement follows at once. A permit
	// never settled (the holder crashed) is booked at its expected count
	// once its TTL passes.
	permitSlack = 30 * time.Second
	// coordTimeout bounds a settlement or a release that must complete
	// although the runtime's context is already cancelled.
	coordTimeout = 5 * time.Second
)

// Fixed Status.LeaderError texts.
const (
	LeaderUnavailable = "coordination store unavailable"
	LeaderLost        = "leader lease lost"
)

// CoordOptions configures NewCoordGate.
type CoordOptions struct {
	Coordinator Coordinator
	Upstream    string
	Fetch       config.Fetch
	// Holder names this controller process; unique per incarnation.
	Holder string
	// LeaseTTL is the leader lease's TTL (0: DefaultLeaseTTL). The lease is
	// renewed once less than half of it is left.
	LeaseTTL time.Duration
	// Overrun is shared by an upstream's successive gates in this process:
	// set once the vendor returned more than estimatedIPsPerCall with a
	// maxTotal in force (nil: a fresh one).
	Overrun *atomic.Bool
	Metrics *Metrics
	Logger  *slog.Logger
}

// coordGate is the cluster gate: the runtime fetches only while it holds
// the upstream's leader lease, and each call needs a permit from the
// arbiter, which applies requestInterval, maxInFlight and the maxTotal
// ledger for the whole fleet. Any error or doubt — Redis unreachable, a
// lease lost or past its local deadline — makes it not leader: it never
// falls back to deciding locally.
type coordGate struct {
	o CoordOptions

	mu     sync.Mutex
	lease  coordination.Lease
	held   bool   // lease may still be ours: renew it rather than acquire
	leader bool   // the last operation on the lease succeeded
	reason string // fixed LeaderError; "" while leader or following
	ledger coordination.Ledger
}

// NewCoordGate returns a gate that asks o.Coordinator.
func NewCoordGate(o CoordOptions) Gate {
	if o.LeaseTTL <= 0 {
		o.LeaseTTL = DefaultLeaseTTL
	}
	if o.Overrun == nil {
		o.Overrun = &atomic.Bool{}
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &coordGate{o: o}
}

func (g *coordGate) Lead(ctx context.Context) bool {
	g.mu.Lock()
	lease, held, leader := g.lease, g.held, g.leader
	g.mu.Unlock()
	ttl := g.o.LeaseTTL
	if held && leader && time.Now().Before(lease.ValidUntil.Add(-ttl/2)) {
		return true
	}
	var err error
	if held {
		var l coordination.Lease
		if l, err = g.o.Coordinator.RenewLeader(ctx, lease, ttl); err == nil {
			lease = l
		} else if errors.Is(err, coordination.ErrLeaseLost) || !lease.Valid(time.Now()) {
			held = false
		}
	} else {
		lease, err = g.o.Coordinator.AcquireLeader(ctx, g.o.Upstream, g.o.Holder, ttl)
		held = err == nil
	}
	if err != nil && ctx.Err() != nil {
		return false // stopping: says nothing about the lease, Release settles it
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lease, g.held = lease, held
	g.setLocked(err)
	return err == nil
}

// setLocked records the outcome of an operation under the lease and logs
// a transition once.
func (g *coordGate) setLocked(err error) {
	leader, reason := err == nil, ""
	switch {
	case err == nil, errors.Is(err, coordination.ErrLeaseHeld):
	case errors.Is(err, coordination.ErrLeaseLost):
		reason = LeaderLost
	default:
		reason = LeaderUnavailable
	}
	if leader == g.leader && reason == g.reason {
		return
	}
	g.leader, g.reason = leader, reason
	v := 0.0
	log := g.o.Logger.With("upstream", g.o.Upstream)
	switch {
	case leader:
		v = 1
		log.Info("fetch leadership taken", "epoch", g.lease.Epoch)
	case reason == "":
		log.Info("another controller leads fetching")
	default:
		log.Warn("not fetch leader; fetching stops (fail closed)", "reason", reason, "err", err)
	}
	g.o.Metrics.leader.WithLabelValues(g.o.Upstream).Set(v)
}

// fail records an error of an operation under the lease: the gate is no
// longer leader until Lead succeeds again.
func (g *coordGate) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if errors.Is(err, coordination.ErrLeaseLost) {
		g.held = false
	}
	g.setLocked(err)
}

func (g *coordGate) Acquire(ctx context.Context, want int, _ time.Time) Grant {
	f := g.o.Fetch
	if f.MaxTotal > 0 && g.o.Overrun.Load() {
		return Grant{}
	}
	g.mu.Lock()
	lease, leader := g.lease, g.held && g.leader
	g.mu.Unlock()
	if !leader {
		return Grant{}
	}
	req := coordination.PermitRequest{
		RequestInterval: f.RequestInterval, MaxInFlight: max(f.MaxInFlight, 1), MaxTotal: f.MaxTotal,
		Expected: int64(want), TTL: f.Timeout + permitSlack,
	}
	p, err := g.o.Coordinator.AcquirePermit(ctx, lease, req)
	if errors.Is(err, coordination.ErrBudgetExhausted) {
		// Ask for what is left of maxTotal rather than nothing.
		var led coordination.Ledger
		if led, err = g.o.Coordinator.Ledger(ctx, g.o.Upstream); err == nil {
			err = coordination.ErrBudgetExhausted
			if room := f.MaxTotal - led.Total - led.Pending; room > 0 && room < req.Expected {
				req.Expected = room
				p, err = g.o.Coordinator.AcquirePermit(ctx, lease, req)
			}
		}
	}
	var wait *coordination.WaitError
	switch {
	case err == nil:
		return Grant{Count: int(p.Expected), More: req.MaxInFlight > 1, permit: p}
	case errors.As(err, &wait):
		// Wake in time to renew the lease however long requestInterval is.
		return Grant{Retry: min(wait.RetryAfter, g.o.LeaseTTL/4)}
	case errors.Is(err, coordination.ErrInFlightFull), errors.Is(err, coordination.ErrBudgetExhausted):
		return Grant{}
	}
	g.fail(ctx, err)
	return Grant{}
}

func (g *coordGate) Settle(ctx context.Context, gr Grant, actual int, certain bool) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), coordTimeout)
	defer cancel()
	// Idempotent and independent of the lease: a permit of an earlier term
	// settles once, one past its TTL was booked at its expected count.
	if _, err := g.o.Coordinator.SettlePermit(sctx, gr.permit, int64(actual), certain); err != nil {
		g.o.Logger.Warn("settling a fetch permit failed; it is booked at its expected count when it expires",
			"upstream", g.o.Upstream, "err", err)
	}
	if certain && g.o.Fetch.MaxTotal > 0 && actual > g.o.Fetch.EstimatedIPsPerCall && !g.o.Overrun.Swap(true) {
		g.o.Logger.Warn("provider returned more than estimatedIPsPerCall; fetching stops for maxTotal",
			"upstream", g.o.Upstream, "returned", actual, "estimatedIPsPerCall", g.o.Fetch.EstimatedIPsPerCall)
	}
}

func (g *coordGate) Release(ctx context.Context) {
	g.mu.Lock()
	lease, held, was := g.lease, g.held, g.leader
	g.held, g.leader, g.reason = false, false, ""
	g.mu.Unlock()
	if was {
		g.o.Metrics.leader.WithLabelValues(g.o.Upstream).Set(0)
	}
	if !held {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), coordTimeout)
	defer cancel()
	if err := g.o.Coordinator.ReleaseLeader(rctx, lease); err != nil && !errors.Is(err, coordination.ErrLeaseLost) {
		g.o.Logger.Warn("releasing fetch leadership failed; it lapses after its TTL", "upstream", g.o.Upstream, "err", err)
		return
	}
	g.o.Logger.Info("fetch leadership released", "upstream", g.o.Upstream)
}

func (g *coordGate) View(ctx context.Context) GateView {
	led, err := g.o.Coordinator.Ledger(ctx, g.o.Upstream)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err == nil {
		g.ledger = led
	} else if g.held && ctx.Err() == nil {
		g.setLocked(err) // a store that cannot be read cannot be led on
	}
	f := g.o.Fetch
	return GateView{
		Leader:      g.held && g.leader && g.lease.Valid(time.Now()),
		LeaderError: g.reason,
		LedgerUsed:  g.ledger.Total,
		InFlight:    g.ledger.InFlight,
		Exhausted:   f.MaxTotal > 0 && (g.o.Overrun.Load() || g.ledger.Total >= f.MaxTotal),
	}
}

var _ Gate = (*coordGate)(nil)
