// Package dispatch owns the gateway's allocation hot path (seed 000 §7.1):
// first-match routing on the current snapshot, the candidate filter,
// least-connections selection and the CAS reservation, and the
// Acquire/Commit/Release state of each Allocation.
//
// Invariants: Acquire reads only the local snapshot and local atomic
// counters; an Allocation exists only after its CAS reservation succeeded;
// Commit turns the reservation into an active count exactly once; Release
// drops whichever count the allocation holds, and a repeated Release is
// harmless but counted. Acquire, Commit and Release do no I/O, take no lock
// and allocate nothing in steady state.
//
// Metrics: proxypool_gateway_dispatch_failures_total{reason},
// proxypool_gateway_release_errors_total.
//
// This package must never import net/http, transport or ingress.
package dispatch
