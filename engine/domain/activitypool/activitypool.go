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
