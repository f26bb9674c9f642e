// Package dispatch owns the gateway's allocation hot path (seed 000 §7.1):
// first-match routing on the current snapshot, the candidate filter,
// least-connections selection and the CAS reservation, and the
// Acquire/Commit/Release state of each Allocation.
//
// Invariants: Acquire reads only the local snapshot and local atomic
// counters; an Allocation exists only after its CAS reservation succeeded;
// Commit turns the reservation into an active count exactly once; Release
// drops whichever count the allocation holds, and a repeated Release — even
// through a stale handle whose pooled slot already serves another request
// (the handle carries the slot's generation) — is harmless but counted.
// Acquire, Commit and Release do no I/O, take no lock and allocate nothing
// in steady state; a sticky rule adds one shard mutex of its session cache.
// Sticky sessions (bound at Commit, cleared on failure), the per-routing
// admission gate and onUnavailable "wait" (parking on a channel that a
// Release or a snapshot swap closes, bounded by MaxWaiters and the rule's
// wait timeout) live here too.
//
// Metrics: proxypool_gateway_dispatch_failures_total{reason},
// proxypool_gateway_release_errors_total,
// proxypool_gateway_sticky_lookups_total{result},
// proxypool_gateway_dispatch_waits_total{result}.
//
// This package must never import net/http, transport or ingress.
package dispatch
