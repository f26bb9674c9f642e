// Package pool owns the lifecycle loop of the activity pool (seed 000 §6):
// AVAILABLE proxies past UsableUntil (or of an upstream removed from the
// configuration) drain; DRAINING ones expire once no worker holds active or
// reserved capacity on them and a snapshot without them has been published;
// EXTRACTED ones expire at their hard expiry; EXPIRED and UNHEALTHY ones are
// removed. Proxies that never became AVAILABLE and run out of time are
// declared UNHEALTHY. Each tick does bounded work and signals the provider
// runtime of every upstream whose inventory dropped.
//
// It also owns InventoryReader, the authoritative inventory the provider
// runtimes plan from (seed 000 §8): Managed and Pending from the store,
// Available and AvailableSlots from each usable AVAILABLE proxy's real free
// capacity — MaxConcurrency minus the owning worker's active and reserved,
// zero for a worker that does not report, the whole MaxConcurrency for an
// unowned proxy. A store that implements CapacityCounter (the embedded
// pool) computes that from its indexes; any other is listed.
//
// It must never import a concrete store or the gateway: it reads worker
// counts through worker.RuntimeReader.
//
// Metrics:
//
//	proxypool_pool_lifecycle_transitions_total{to}  lifecycle moves made by the loop
//	proxypool_pool_proxies{state}                   proxies per state, all upstreams
package pool
