// Package gateway assembles the data plane worker (seed 000 §3.1, §7;
// SPEC §7): snapshot (compiled routing view and runtime counters), dispatch
// (Acquire/Commit/Release), transport (upstream proxies) and ingress (the
// client-facing HTTP/1.1 server), which share internal/h1; net/http is not
// on the data path (docs/gateway.md, "The forwarding path"). A Gateway
// implements worker.Applier and worker.RuntimeReader, serves listeners
// with a graceful drain, reloads its limits and auth atomically, and
// reports allocation outcomes in bounded batches.
//
// It also keeps, per routing name and across snapshots, what the gateway's
// own config adds to a rule: the sticky-session cache (sticky), the
// admission gate (routings[].maxInFlight) and the wait timeout.
//
// Metrics owned here: proxypool_gateway_snapshot_version,
// proxypool_gateway_snapshot_age_seconds,
// proxypool_gateway_snapshot_apply_duration_seconds,
// proxypool_gateway_outcomes_dropped_total; the sub-packages register the
// rest (see docs/gateway.md).
//
// It must never import the controller, the stores or any adapter but the
// shared client-auth package (engine/adapters/http/auth, which imports no
// net/http): the controller reaches it only through worker.Applier, and it
// reports only through worker.OutcomeSink and worker.RuntimeReader.
package gateway
