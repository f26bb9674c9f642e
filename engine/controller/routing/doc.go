// Package routing owns sequential failover at run time (seed 000 §9): it
// compiles configured routings into domain rules and, when an upstream is
// depleted, advances every sequential routing whose current upstream it is
// exactly once, by compare-and-set on the cursor held in the management
// store, so concurrent signals produce one switch and cursors survive a
// restart. Disabled upstreams are skipped, and a routing whose current
// upstream gets disabled moves on the same way. Admins can switch by hand.
//
// It must never import a concrete store, the gateway or the provider
// runtime; old proxies of a switched-away upstream are left to drain.
//
// Metrics:
//
//	proxypool_routing_switches_total{routing,reason}  cursor moves (depleted, disabled, manual, exhausted)
package routing
