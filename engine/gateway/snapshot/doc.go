// Package snapshot owns the gateway's compiled, immutable view of a
// worker.Snapshot (seed 000 §5, §11): the routing rules ready for
// first-match, the allocatable proxies of each rule as flat slices, and the
// per-proxy runtime counters those slices point at.
//
// A Snapshot is built off the hot path by Build and published through a
// Holder (one atomic pointer). The counters live in a Registry keyed by
// proxy ID that outlives every snapshot, so active and reserved counts
// carry over a swap; a proxy that left the snapshot while still in use is
// reported as draining and its counter is reclaimed by a later build once
// its counts are zero. A build withdraws (a bit in the packed counter word)
// every proxy the new snapshot no longer offers before it returns, so no
// request still holding an older snapshot can reserve on it afterwards.
// The registry has a hard bound on entries.
//
// This package must never import net/http or any I/O package, and must
// never import dispatch, transport or
// ingress: they depend on it. It imports sticky only to hold a rule's
// session cache.
package snapshot
