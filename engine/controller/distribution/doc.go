// Package distribution owns snapshot publication to gateway workers (seed
// 000 §11, §12.3): it assigns unowned AVAILABLE proxies to registered
// workers (pool.SetOwner), re-reads what each worker owns, and pushes each
// a complete worker.Snapshot with a monotonic version, ValidUntil = now +
// maxStaleAge, the compiled routings, the sequential cursors, the
// disabled upstreams and, per routing, the proxies its TARGET check
// excluded (RoutingExclusions: the gateway must not allocate them for that
// routing; other routings still may). It publishes on a ticker and on
// demand, resting three times as long as a round took before the next
// (at most the ticker's period), so a storm of triggers while the pool
// grows by thousands of proxies a second costs at most a quarter of a
// core while rounds take under a third of that period; a direct Publish
// (extraction) never waits. Proxies being revoked for extraction are excluded from
// assignment and from every snapshot until released, which is what lets
// extraction drain them.
//
// In standalone mode one worker, "local", is registered; the assignment
// balances over any number of workers.
//
// A round costs what changed: over a store with an activitypool.ChangeFeed
// the publisher keeps a sorted mirror of the AVAILABLE proxies and applies
// the changes since the last round (and lists the store again every five
// minutes, so nothing a feed missed outlives that); a worker's proxy list is rebuilt only
// when its proxies, the exclusions or their usability changed, and handed
// out again otherwise. Other stores are listed every round. Published
// lists are shared between rounds and with the mirror: appliers and
// OnPublished must never modify a snapshot's proxies.
//
// It must never import a concrete store or the gateway: workers are
// worker.Applier values.
//
// Metrics:
//
//	proxypool_distribution_publish_total{result}        publish attempts per worker
//	proxypool_distribution_publish_duration_seconds     build and apply time
//	proxypool_distribution_snapshot_version             last version built
//	proxypool_distribution_snapshot_proxies{worker}     proxies in a worker's last snapshot
package distribution
