// Package embedded holds the single-host stores that make the appliance run
// with no external service (SPEC §5, seed 000 §12):
//
//   - Pool, the activity pool in memory. It implements activitypool.Pool with
//     the semantics the Redis adapter has: unique-key dedupe with the first
//     source keeping the lifecycle, per-upstream indexes, compare-and-set
//     lifecycle writes, one critical section per extraction and short-lived
//     idempotency records. Proxies are deliberately not persisted: after a
//     restart the providers refill the pool, exactly as after a Redis loss.
//     Beyond the contract it serves the controller's per-cycle reads from
//     maintained indexes instead of listings: FreeCapacity (per-owner
//     capacity for the inventory) and Changes (activitypool.ChangeFeed, a
//     bounded log of changed entries for the snapshot publisher).
//   - Management, the management store in a bbolt file under the state
//     directory: upstream admin state, routing cursors, the admin audit log
//     and config revisions. It survives restarts.
//
// Both are the controller's cold path; a mutex (Pool) and bbolt's single
// writer (Management) are the whole concurrency story. The gateway hot path
// never touches them.
//
// This package must never import net/http, SQL drivers, Redis clients or the
// plugin runtimes: it depends on the domain contracts only (and bbolt).
// The store contract it satisfies is tested by engine/adapters/storetest,
// the same suites the Redis and PostgreSQL adapters run.
package embedded
