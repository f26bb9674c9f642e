// Package checker executes health checks against upstream proxies and
// reports observations; it never decides a proxy's state. The controller's
// deterministic reducer (engine/controller/health) turns observations into
// lifecycle decisions (seed 000 §3.3, §13).
//
// It owns the three check levels and the Scheduler:
//
//   - BASIC: TCP connect and a proxy CONNECT handshake to a probe target.
//   - EGRESS: BASIC, then a GET through the proxy to an echo service; the
//     observation carries the exit IP, whether one of our own addresses
//     leaked (the exit itself, or any header the echo received) and which
//     proxy-revealing headers (Via, X-Forwarded-For, Forwarded, …) arrived.
//     Our own address is learned by one direct request to the echo
//     service, cached for ten minutes, plus the local address of the
//     connection to the proxy.
//   - TARGET: a GET through the proxy to one routing's URL; only the
//     expected status passes. Redirects are not followed.
//
// The Scheduler runs checks with a bounded, reloadable in-flight limit and
// an optional, reloadable bound on checks started per second
// (checker.maxPerSecond, so that checking a bulk import cannot take the
// gateway's CPU), from a bounded two-priority queue where new and SUSPECT proxies go first and
// ordinary rechecks are shed under backlog (seed 000 §18 "Checker 积压").
// One task per (proxy, level, routing) is queued or running at a time.
//
// Observations never carry credentials or the checked URL; bodies are read
// up to 64 KiB and dropped after parsing.
//
// It must never import the activity pool, the management store or any
// controller package: in a cluster it runs as its own process.
//
// Metrics (registered on the registry passed in):
//
//	proxypool_checker_checks_total{level,result}      checks executed (result: success, failure_<phase>)
//	proxypool_checker_check_duration_seconds{level}   check latency
//	proxypool_checker_queue_depth{priority}           queued tasks
//	proxypool_checker_in_flight                        running checks
//	proxypool_checker_dropped_total{priority}          tasks shed or refused
package checker
