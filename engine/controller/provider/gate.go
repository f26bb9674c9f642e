package provider

import (
	"context"
	"time"

	"golang.org/x/time/rate"

	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/coordination"
)

// Gate decides whether a runtime may call its vendor now and for how many
// proxies, and books each call afterwards (seed 000 §8): leadership,
// requestInterval, maxInFlight and the fetch.maxTotal ledger. The local
// gate decides within this process (embedded storage: one controller);
// the coordinated gate asks the cluster arbiter (NewCoordGate).
type Gate interface {
	// Lead takes or renews the upstream's fetch leadership; false: this
	// runtime must not fetch now. Called at the start of every cycle.
	Lead(ctx context.Context) bool
	// Acquire grants one call of 1..want proxies, or refuses it (Count 0).
	Acquire(ctx context.Context, want int, now time.Time) Grant
	// Settle closes a granted call: actual when certain, otherwise the
	// granted count (the vendor may have billed it).
	Settle(ctx context.Context, g Grant, actual int, certain bool)
	// Release gives up leadership (the runtime stops or is replaced).
	Release(ctx context.Context)
	// View is the gate's part of the runtime's Status.
	View(ctx context.Context) GateView
}

// Grant is one call a gate allowed, or a refusal.
type Grant struct {
	// Count is the proxies the call may ask for; 0: refused.
	Count int
	// Retry, on a refusal, is when planning again is useful (0: a tick).
	Retry time.Duration
	// More: another call could be granted at once (a maxInFlight slot is
	// still free).
	More bool

	permit coordination.Permit // the coordinated gate's permit
	free   func()              // frees the local in-flight slot
}

// done frees what the grant holds beyond its settlement.
func (g Grant) done() {
	if g.free != nil {
		g.free()
	}
}

// GateView is what a gate reports for the admin view.
type GateView struct {
	// Leader: this runtime may fetch for the upstream. LeaderError is the
	// fixed reason it may not ("" when another controller simply leads).
	Leader      bool
	LeaderError string
	LedgerUsed  int64
	InFlight    int
	Exhausted   bool
}

// localGate is the single-process gate: always leader, a token bucket for
// requestInterval, a channel semaphore for maxInFlight and the in-memory
// Ledger.
type localGate struct {
	limiter   *rate.Limiter
	sem       chan struct{}
	ledger    *Ledger
	estimated int // estimatedIPsPerCall
}

func newLocalGate(f config.Fetch, l *Ledger) *localGate {
	return &localGate{
		limiter:   rate.NewLimiter(rate.Every(f.RequestInterval), 1),
		sem:       make(chan struct{}, max(f.MaxInFlight, 1)),
		ledger:    l,
		estimated: f.EstimatedIPsPerCall,
	}
}

func (g *localGate) Lead(context.Context) bool { return true }

func (g *localGate) Acquire(_ context.Context, want int, now time.Time) Grant {
	select {
	case g.sem <- struct{}{}:
	default:
		return Grant{} // a finishing call signals
	}
	res := g.limiter.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		<-g.sem
		return Grant{Retry: d}
	}
	n := g.ledger.Reserve(want)
	if n == 0 {
		res.CancelAt(now)
		<-g.sem
		return Grant{} // maxTotal: spent, or held by calls in flight
	}
	return Grant{Count: n, More: len(g.sem) < cap(g.sem), free: func() { <-g.sem }}
}

func (g *localGate) Settle(_ context.Context, gr Grant, actual int, certain bool) {
	g.ledger.Settle(gr.Count, actual, certain, g.estimated)
}

func (g *localGate) Release(context.Context) {}

func (g *localGate) View(context.Context) GateView {
	return GateView{Leader: true, LedgerUsed: g.ledger.Used(), InFlight: len(g.sem), Exhausted: g.ledger.Exhausted()}
}

var _ Gate = (*localGate)(nil)
