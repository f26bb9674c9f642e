// Package redisstore is the cluster activity pool and coordination store on
// Redis (SPEC §5, seed 000 §8, §10.2, §11, §12.2, §18).
//
// Pool implements activitypool.Pool with the embedded pool's semantics and
// passes the same contract suite (engine/adapters/storetest). Each proxy is
// a hash whose key expires server-side at max(ExpiresAt, admission) +
// HardExpiryGrace. Per upstream, sorted sets index the ids of each state
// (scored by key expiry, so counts skip what Redis already expired), the
// AVAILABLE proxies and the unowned AVAILABLE ones (scored by UsableUntil,
// ties newest admission first), with a running sum of their slots; a
// global free index serves extractions without an upstream filter, and
// free indexes per upstream and region, carrier and protocol (same members
// and scores) serve filtered ones: such an extraction walks the smallest
// that applies, so the entries a filter rejects do not pile up ahead of
// every later call. Extraction, inventory and admission therefore cost
// O(log n + candidates examined), not the pool size. Every mutation is
// one Lua script (EVALSHA, falling back to EVAL on NOSCRIPT), so a batch
// extraction — selection with Filters.Eligible's rules, the reserve,
// partial / allOrNothing, the moves to EXTRACTED and the TTL-bound
// idempotency result — is atomic.
//
// Pool also implements activitypool.ChangeFeed, so the snapshot publisher
// follows what changed instead of listing every AVAILABLE proxy each
// round. Every script that changes a proxy (admission, transition, health,
// ownership, extraction, removal, reclaim, sweep) records its ID, in the
// same script, in the change log: the sorted set "changes", scored by a
// version taken once per script from the counter "changes:v" (a proxy
// changed again moves to its latest version, so it is there once). A key
// Redis expired is recorded when Changes or Sweep drops its ID from the
// state indexes. Changes and Sweep trim the log to MaxChangeLog proxies
// (in between, the distinct proxies changed add to it), raising
// "changes:floor" to the highest version dropped; Changes reads
// the version and the IDs after the caller's in one script, then the
// proxies in pipelined batches. A version older than the floor, of an
// earlier generation (the counter restarts with it; the Pool offsets each
// generation's versions past every one it handed out), or with more than
// 10,000 (at most MaxList) proxies changed since answers Reset: the caller
// lists. One call trims at most 25,000 entries, so no script holds Redis
// for more than a few milliseconds.
//
// OwnerLease (GrantOwnerLease, RenewOwnerLease, ReleaseOwnerLease,
// AssignOwner, ReclaimOwner) fences worker ownership with epochs: a lost
// worker's proxies are reclaimed only once its lease expired.
//
// Coordinator holds the provider fetch leader lease per upstream
// (generation + monotonic epoch fence), the requestInterval, maxInFlight
// and maxTotal decisions (with pending expected amounts and idempotent
// settlement across leader changes), client rate limits (GCRA) and worker
// heartbeats. Every uncertainty fails closed.
//
// Generations: a key holds a random generation id; every script checks it.
// When Redis lost its state the key is gone, the first operation to notice
// creates a new one (SET NX, so all processes agree) and returns
// ErrGenerationChanged; every lease, permit and proxy ID of the old
// generation is void. Nothing is ever restored from PostgreSQL: providers
// refill the pool.
//
// Keys are "{namespace}:<layout>:…" (one hash tag, so one cluster slot).
// The layout number changes with every change to keys, index members or
// hash fields, or to what every writer must maintain (2: the attribute
// free indexes; 3: the change log, which a process of layout 2 would not
// write): a process of another layout works on other keys, its own pool
// refilled from the providers, and never misreads these. To a new layout's processes an upgrade is a lost state
// (a new generation: leases, permits, ledgers start afresh); during a
// rolling upgrade old and new processes hold separate pools and fetch
// leases. Keys of an abandoned layout are not cleaned up: proxy hashes
// expire, the index sets linger until deleted. Bounds: the
// client's dial/read/write/pool timeouts, OpTimeout per operation (no
// operation waits on an unreachable server longer), no client-side retries
// (a retried extraction would consume twice), MaxExamined candidates per
// extraction, MaxList, MaxChangeLog, MaxWorkers, the sweep batch, the
// change log's trim, expiry-drop and read batches.
//
// This package must never import the PostgreSQL driver, net/http, the
// gateway or the controller: it depends on the domain contracts and
// engine/config only.
package redisstore
