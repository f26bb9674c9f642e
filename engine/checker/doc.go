// Package checker executes health checks against upstream proxies and
// reports observations; it never decides a proxy's state. The controller's
// deterministic reducer (engine/controller/health) turns observations into
// lifecycle decisions (seed 000 §3.3, §13).
//
// It owns the BASIC check (TCP connect + proxy CONNECT handshake) and the
// Scheduler: bounded in-flight checks fed by a bounded two-priority queue
// where new and SUSPECT proxies go first and ordinary rechecks are shed
// under backlog (seed 000 §18 "Checker 积压").
//
// It must never import the activity pool, the management store or any
// controller package: in a cluster it runs as its own process.
//
// Metrics (registered on the registry passed in):
//
//	proxypool_checker_checks_total{level,result}      checks executed
//	proxypool_checker_check_duration_seconds{level}   check latency
//	proxypool_checker_queue_depth{priority}           queued tasks
//	proxypool_checker_in_flight                        running checks
//	proxypool_checker_dropped_total{priority}          tasks shed or refused
package checker
