// Package health owns the controller's side of health checking: the pure,
// deterministic reducer that turns a checker observation into a lifecycle
// decision (seed 000 §13), and the Service that plans check tasks (new and
// SUSPECT proxies first, AVAILABLE ones at interval ± a stable 10% jitter)
// and applies decisions to the activity pool with compare-and-set.
//
// It must never dial anything (the checker does) and never import a
// concrete store: it sees the activity pool through a small interface.
//
// Metrics:
//
//	proxypool_health_observations_total{result}   observations applied
//	proxypool_health_transitions_total{from,to}   state changes decided
//	proxypool_health_conflicts_total               decisions lost to a concurrent change
package health
