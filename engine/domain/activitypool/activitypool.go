// Package activitypool is the contract of the store that holds short-lived
// proxies: their lifecycle, TTL, worker ownership and exclusive extraction
// (seed 000 §5, §10, §12.2). The embedded store implements it in memory; the
// Redis adapter implements it for a fleet. One contract suite tests both.
package activitypool

import (
	"context"
	"errors"
	"time"

	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/upstream"
)

// ErrNotFound is returned for an unknown proxy ID.
var ErrNotFound = errors.New("proxy not found")

// ErrConflict is returned when a compare-and-set saw another state.
var ErrConflict = errors.New("proxy state changed concurrently")

// ErrUnavailable wraps failures to reach the store (Redis down or not
// answering in time): fetching, extraction and ownership changes stop and
// the API answers 503 until it answers again (seed 000 §18).
var ErrUnavailable = errors.New("activity pool store unavailable")

// ErrStateLost is returned by an operation that found the store had lost
// its state (a Redis restart without persistence): the operation changed
// nothing and a retry runs against the new, empty state.
var ErrStateLost = errors.New("activity pool store lost its state")

// AdmitResult reports what Admit did with a batch.
type AdmitResult struct {
	Added      []proxy.ID
	Duplicates int
	// Full counts candidates refused because the upstream reached maxSize.
	Full int
}

// Health is one reduced health decision to persist.
type Health struct {
	ID        proxy.ID
	From, To  proxy.State
	CheckedAt time.Time
	Success   bool
	Latency   time.Duration
	// Fails is the consecutive failure count after this observation.
	Fails int
}

// Filter selects proxies for List.
type Filter struct {
	Upstream string        // empty = all
	States   []proxy.State // empty = all
	Limit    int           // 0 = no limit beyond the store's bound
}

// Pool is the activity-pool store.
type Pool interface {
	// Admit inserts candidates as FETCHED under upstream. A key already
	// present keeps its first owner and TTL and counts as a duplicate;
	// maxSize bounds the upstream's managed proxies.
	Admit(ctx context.Context, upstream string, ps []proxy.Proxy, maxSize int) (AdmitResult, error)
	// Get returns one proxy.
	Get(ctx context.Context, id proxy.ID) (proxy.Proxy, error)
	// List returns proxies matching f.
	List(ctx context.Context, f Filter) ([]proxy.Proxy, error)
	// Transition moves id from -> to if it is in from (compare-and-set),
	// validated by proxy.Transition.
	Transition(ctx context.Context, id proxy.ID, from, to proxy.State, at time.Time) error
	// RecordHealth applies a reducer decision (compare-and-set on From).
	RecordHealth(ctx context.Context, h Health) error
	// Remove deletes a proxy in a terminal-bound state (EXPIRED, UNHEALTHY).
	Remove(ctx context.Context, id proxy.ID) error
	// Extract atomically selects eligible unowned AVAILABLE proxies and moves
	// them to EXTRACTED, honouring fulfillment and idempotency.
	Extract(ctx context.Context, req extraction.Request) (extraction.Result, error)
	// Inventory returns the authoritative counts for one upstream.
	Inventory(ctx context.Context, upstream string, now time.Time) (upstream.Inventory, error)
	// SetOwner assigns (owner != "") or clears ownership of AVAILABLE
	// proxies; only unowned proxies can be extracted.
	SetOwner(ctx context.Context, ids []proxy.ID, owner string) error
	// Counts returns the number of proxies per state, all upstreams.
	Counts(ctx context.Context) (map[proxy.State]int, error)
}

// Changes is what changed in a store since a version (ChangeFeed).
type Changes struct {
	// Version is the store's version this answer is current to; pass it
	// as since next time.
	Version uint64
	// Reset: the store cannot tell what changed since that version (too
	// old, or not one of its versions). Changed and Gone are empty; the
	// caller re-reads everything it mirrors with List, after this call,
	// and continues from Version.
	Reset bool
	// Changed holds a copy of every proxy changed since that version that
	// is now in one of the requested states (any state when none is),
	// sorted by ID.
	Changed []proxy.Proxy
	// Gone lists every other proxy changed since that version: deleted,
	// or now in a state not requested.
	Gone []proxy.ID
}

// ChangeFeed is implemented by a Pool that can tell which proxies changed
// since a version, so a caller mirroring part of the pool (the snapshot
// publisher) pays for what changed instead of listing everything. It is
// optional: callers fall back to List.
type ChangeFeed interface {
	Changes(ctx context.Context, since uint64, states []proxy.State) (Changes, error)
}
