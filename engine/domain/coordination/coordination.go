// Package coordination holds the types of cluster coordination (seed 000
// §8, §12.2): the provider fetch leader lease with its generation + epoch
// fence, fetch permits and the maxTotal ledger, client rate limits and
// worker heartbeats. The Redis adapter implements them; the controller
// consumes them through interfaces it declares where it uses them. Pure:
// no I/O.
package coordination

import (
	"errors"
	"fmt"
	"time"
)

// Coordination outcomes that are policy, not failure. Any other error
// means the arbiter could not decide: the caller fails closed.
var (
	// ErrLeaseHeld: a live lease is in the way (another leader, or a
	// worker's ownership lease that has not expired).
	ErrLeaseHeld = errors.New("lease held")
	// ErrLeaseLost: the lease is no longer the current one (expired,
	// released, replaced by a later epoch, or the arbiter lost its state).
	// Its holder must stop acting on it at once.
	ErrLeaseLost = errors.New("lease lost")
	// ErrInFlightFull: maxInFlight permits are out.
	ErrInFlightFull = errors.New("provider calls in flight at maxInFlight")
	// ErrBudgetExhausted: settled plus pending plus this call's expected
	// amount would pass fetch.maxTotal.
	ErrBudgetExhausted = errors.New("fetch.maxTotal budget exhausted")
)

// WaitError says the upstream's requestInterval has not passed; retry
// after RetryAfter.
type WaitError struct{ RetryAfter time.Duration }

func (e *WaitError) Error() string {
	return fmt.Sprintf("requestInterval not elapsed; retry in %s", e.RetryAfter)
}

// Lease is an upstream's provider leader lease. The pair (Generation,
// Epoch) is the fence: epochs only grow within a generation, and a new
// generation (the arbiter lost its state) voids every earlier lease.
type Lease struct {
	Upstream   string
	Holder     string
	Generation string
	Epoch      int64
	// ExpiresAt is the server's expiry; ValidUntil the holder's local,
	// earlier, deadline: past it, without a successful renewal, the holder
	// is no longer leader, whatever the server says.
	ExpiresAt  time.Time
	ValidUntil time.Time
}

// Valid reports whether the holder may act as leader at now (local clock).
func (l Lease) Valid(now time.Time) bool { return now.Before(l.ValidUntil) }

// PermitRequest is one provider call the leader wants to make.
type PermitRequest struct {
	// RequestInterval is the minimum time between two permits.
	RequestInterval time.Duration
	// MaxInFlight bounds unsettled permits; 0 means no bound.
	MaxInFlight int
	// MaxTotal bounds the proxies fetched in this generation (settled plus
	// pending expected); 0 means no bound.
	MaxTotal int64
	// Expected is what the call is expected to return, reserved against
	// MaxTotal until settled.
	Expected int64
	// TTL is how long the permit is held at most; an unsettled permit past
	// it is booked at Expected and frees its in-flight slot.
	TTL time.Duration
}

// Permit allows one provider call.
type Permit struct {
	ID         int64
	Upstream   string
	Generation string
	Epoch      int64
	Expected   int64
	ExpiresAt  time.Time
}

// Ledger is an upstream's fetch accounting in the current generation.
type Ledger struct {
	// Total is what settled (actual or, when unknown, expected).
	Total int64
	// Pending is the expected amount of unsettled permits.
	Pending  int64
	InFlight int
	// Expired counts permits booked at expiry, never settled in time.
	Expired int64
}

// Rate is a rate limit: Limit units per Period with bursts of Burst units
// (at least 1).
type Rate struct {
	Limit  int
	Period time.Duration
	Burst  int
}

// RateResult is one rate-limit decision.
type RateResult struct {
	Allowed    bool
	Remaining  int
	RetryAfter time.Duration
}

// WorkerBeat is a live worker's last heartbeat.
type WorkerBeat struct {
	Worker    string
	At        time.Time
	ExpiresAt time.Time
	Info      map[string]string
}
