// Package health owns the controller's side of health checking (seed 000
// §13): the pure, deterministic reducers that turn checker observations
// into decisions, and the Service that plans check tasks and applies the
// decisions.
//
//   - Reduce: a proxy-level observation (BASIC, or EGRESS when the
//     upstream has check.egressURL; EGRESS includes BASIC) decides AVAILABLE
//     / SUSPECT / UNHEALTHY. An EGRESS check passes only if the proxy is at
//     least as anonymous as check.anonymity requires (transparent: our
//     address leaked; anonymous: only proxy headers; elite: neither).
//   - ReduceTarget: a TARGET observation decides the proxy's standing for
//     that routing only: failureThreshold consecutive failures exclude it
//     from the routing (published as worker.Snapshot.RoutingExclusions)
//     until it passes again. The proxy's own state never changes.
//
// The Service schedules new (FETCHED/CHECKING) and SUSPECT proxies first,
// AVAILABLE ones at interval ± a stable 10% jitter, and TARGET checks of
// AVAILABLE proxies per routing (first one high priority). While the
// checker has a backlog (a new/SUSPECT task waiting, or the queue half
// full) ordinary rechecks wait twice as long and only fill the queue to
// half, so nothing queues without bound and urgent checks go first. It
// applies decisions to the activity pool with compare-and-set. Its
// in-memory registries (TARGET standings, EGRESS results) are bounded by
// MaxTracked and pruned to live proxies.
//
// It must never dial anything (the checker does) and never import a
// concrete store: it sees the activity pool through a small interface.
//
// Metrics:
//
//	proxypool_health_observations_total{result}          proxy-level observations applied (after the anonymity policy)
//	proxypool_health_transitions_total{from,to}          state changes decided
//	proxypool_health_conflicts_total                      decisions lost to a concurrent change
//	proxypool_health_target_observations_total{result}   TARGET observations applied
//	proxypool_health_routing_exclusions{routing}          proxies a routing's TARGET check excludes
//	proxypool_health_egress_total{anonymity}              completed EGRESS checks by anonymity shown
//	proxypool_health_rechecks_deferred_total              ordinary rechecks postponed under backlog
package health
