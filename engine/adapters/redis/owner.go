package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/proxypool/proxypool/engine/domain/coordination"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// ErrLeaseHeld is returned when a live lease is in the way: another leader
// of an upstream, or a worker's ownership lease that has not expired.
var ErrLeaseHeld = coordination.ErrLeaseHeld

// ErrLeaseLost is returned when a lease is no longer the current one: it
// expired, was released, was replaced by a later epoch, or Redis lost its
// state. Its holder must stop acting on it at once.
var ErrLeaseLost = coordination.ErrLeaseLost

// leaseSafety is the share of a lease's TTL by which a holder's local
// deadline (ValidUntil) precedes the server's expiry: it absorbs the
// request's round trip and clock-rate drift, so a holder stops before
// anyone else can start.
const leaseSafety = 10

// localDeadline is when a holder must consider a lease granted for ttl,
// requested at sent (local clock), gone.
func localDeadline(sent time.Time, ttl time.Duration) time.Time {
	return sent.Add(ttl - ttl/leaseSafety)
}

// OwnerLease is a gateway worker's ownership lease (seed 000 §11): while it
// is live the worker's proxies are its own; the epoch fences every
// assignment, and when the lease expires — the worker lost — its proxies
// are reclaimed before any other worker gets them, never earlier.
type OwnerLease struct {
	Worker     string
	Epoch      int64
	Generation string
	// ExpiresAt is the server's expiry; ValidUntil the holder's local,
	// earlier, deadline.
	ExpiresAt  time.Time
	ValidUntil time.Time
}

// Valid reports whether the lease may still be relied on at now (local
// clock).
func (l OwnerLease) Valid(now time.Time) bool { return now.Before(l.ValidUntil) }

func checkTTL(ttl time.Duration) error {
	if ttl < 10*time.Millisecond {
		return fmt.Errorf("lease ttl %s below 10ms", ttl)
	}
	return nil
}

// GrantOwnerLease starts a new ownership lease for worker with a new epoch.
// A live lease of the same worker is not replaced (ErrLeaseHeld): renew it,
// or let it expire.
func (p *Pool) GrantOwnerLease(ctx context.Context, worker string, ttl time.Duration) (OwnerLease, error) {
	what := fmt.Sprintf("grant ownership lease to worker %q", worker)
	if worker == "" {
		return OwnerLease{}, fmt.Errorf("%s: empty worker", what)
	}
	if err := checkTTL(ttl); err != nil {
		return OwnerLease{}, fmt.Errorf("%s: %w", what, err)
	}
	gen, sent := p.Generation(), time.Now()
	r, err := p.run(ctx, scriptOwnerGrant, what, gen, worker, ttl.Milliseconds())
	if err != nil {
		return OwnerLease{}, err
	}
	if status(r) == "HELD" {
		return OwnerLease{}, fmt.Errorf("%s: epoch %d live: %w", what, toInt(r[1]), ErrLeaseHeld)
	}
	return OwnerLease{Worker: worker, Epoch: toInt(r[1]), Generation: gen, ExpiresAt: fromMicros(toStr(r[2])), ValidUntil: localDeadline(sent, ttl)}, nil
}

// RenewOwnerLease extends a live lease, keeping its epoch.
func (p *Pool) RenewOwnerLease(ctx context.Context, l OwnerLease, ttl time.Duration) (OwnerLease, error) {
	what := fmt.Sprintf("renew ownership lease of worker %q", l.Worker)
	if err := checkTTL(ttl); err != nil {
		return OwnerLease{}, fmt.Errorf("%s: %w", what, err)
	}
	sent := time.Now()
	r, err := p.run(ctx, scriptOwnerRenew, what, l.Generation, l.Worker, strconv.FormatInt(l.Epoch, 10), ttl.Milliseconds())
	if err != nil {
		return OwnerLease{}, leaseGenErr(err)
	}
	if status(r) == "LOST" {
		return OwnerLease{}, fmt.Errorf("%s: epoch %d: %w", what, l.Epoch, ErrLeaseLost)
	}
	l.ExpiresAt, l.ValidUntil = fromMicros(toStr(r[2])), localDeadline(sent, ttl)
	return l, nil
}

// ReleaseOwnerLease ends a lease at once (a worker leaving cleanly), so its
// proxies can be reclaimed without waiting for expiry.
func (p *Pool) ReleaseOwnerLease(ctx context.Context, l OwnerLease) error {
	what := fmt.Sprintf("release ownership lease of worker %q", l.Worker)
	r, err := p.run(ctx, scriptOwnerRenew, what, l.Generation, l.Worker, strconv.FormatInt(l.Epoch, 10), "0")
	if err != nil {
		return leaseGenErr(err)
	}
	if status(r) == "LOST" {
		return fmt.Errorf("%s: %w", what, ErrLeaseLost)
	}
	return nil
}

// AssignOwner gives ids to the lease's worker under its fence: the lease
// must be live and current (same epoch, same generation), and the batch is
// all or nothing with SetOwner's rules.
func (p *Pool) AssignOwner(ctx context.Context, l OwnerLease, ids []proxy.ID) error {
	if l.Generation != p.Generation() {
		return fmt.Errorf("assign proxies to worker %q: lease of generation %s: %w", l.Worker, l.Generation, ErrLeaseLost)
	}
	return p.setOwner(ctx, ids, l.Worker, l.Worker, l.Epoch)
}

// ReclaimOwner clears the ownership of up to limit proxies of a worker
// whose lease is gone (expired or released) and returns their IDs; more
// reports whether some remain. With a live lease it returns ErrLeaseHeld
// and changes nothing: a lost worker's proxies are never handed on before
// its lease ran out.
func (p *Pool) ReclaimOwner(ctx context.Context, worker string, limit int) (ids []proxy.ID, more bool, err error) {
	what := fmt.Sprintf("reclaim proxies of worker %q", worker)
	if limit <= 0 {
		limit = 1000
	}
	r, err := p.run(ctx, scriptOwnerReclaim, what, p.Generation(), worker, limit)
	if err != nil {
		return nil, false, err
	}
	if status(r) == "HELD" {
		return nil, false, fmt.Errorf("%s: %w", what, ErrLeaseHeld)
	}
	cleared, _ := r[1].([]any)
	for _, c := range cleared {
		ids = append(ids, proxy.ID(toStr(c)))
	}
	return ids, toInt(r[2]) > 0, nil
}

// leaseGenErr makes a generation change also read as a lost lease: a lease
// of the old generation is void.
func leaseGenErr(err error) error {
	if errors.Is(err, ErrGenerationChanged) {
		return fmt.Errorf("%w: %w", ErrLeaseLost, err)
	}
	return err
}
