// Package extraction owns the controller's exclusive-extraction command
// (seed 000 §10; seed 001 §4.2): validation and configured defaults, the
// per-client rate limit, the atomic store extraction over unowned proxies
// and, when those are short, revocation of gateway-owned ones: exclude them
// from snapshots, publish, wait until no worker holds capacity on them,
// clear their ownership, then extract. A proxy is never returned twice and
// never handed to a gateway after its extraction.
//
// It must never import a concrete store or the gateway; workers are seen
// through worker.RuntimeReader and snapshots through a small publisher
// interface.
//
// Metrics:
//
//	proxypool_extraction_requests_total{result}     requests by result (ok, partial, insufficient, rate_limited, invalid, error)
//	proxypool_extraction_returned_total              proxies handed out
//	proxypool_extraction_insufficient_total          requests that could not be filled
//	proxypool_extraction_idempotent_replays_total    answers served from the idempotency record
//	proxypool_extraction_revoked_total               gateway-owned proxies revoked for extraction
package extraction
