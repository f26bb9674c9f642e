// Package provider owns fetching proxies from vendor APIs (seed 000 §8): one
// Runtime per enabled upstream under a Supervisor. A runtime wakes on a timer
// or a coalesced capacity signal, reads the upstream's inventory, applies the
// minimum/target refill plan and, when proxies are wanted, asks the upstream's
// adapter to build a request, performs the HTTP call itself (bounded time and
// body, destination guard), has the adapter parse the answer, validates and
// admits the candidates, and classifies the call as Success, Empty,
// DuplicateOnly or Error. It enforces exponential backoff with full
// jitter, Retry-After and pool.maxSize (through the store); leadership,
// requestInterval, maxInFlight and the fetch.maxTotal ledger are its Gate's:
// the local gate decides in this process (embedded storage), the
// coordinated gate (NewCoordGate) asks the cluster Coordinator, fetching
// only under the upstream's leader lease and failing closed on any doubt.
// A client request never triggers a fetch.
//
// The Supervisor pre-checks every runtime it would start or replace
// (Precheck: the adapter builds a request, the URL is http(s), a literal
// address passes the guard) before it publishes a new generation, keeps
// the ledgers and the cumulative counters (Tally) across runtime
// replacement, and re-reads admin overrides on a low-frequency reconcile
// that repairs lost notifications. A depletion the routing switcher could
// not record (management store down) is retried every cycle while the run
// of empties lasts. Status.LastError is a fixed class, never the adapter's
// or vendor's text; a vendor answer is dropped once converted.
//
// It must never import a concrete store, the gateway or the HTTP API
// adapters, and never log a secret, a response body or a proxy password.
//
// Metrics:
//
//	proxypool_provider_fetch_total{upstream,outcome}      calls by outcome class
//	proxypool_provider_fetch_duration_seconds{upstream}   call latency
//	proxypool_provider_fetched_proxies_total{upstream}    valid candidates returned
//	proxypool_provider_duplicates_total{upstream}         candidates already pooled
//	proxypool_provider_rejected_candidates_total{upstream} invalid or refused candidates
//	proxypool_provider_backoff_seconds{upstream}          current backoff (gauge)
//	proxypool_provider_http_429_total{upstream}           rate-limited answers
//	proxypool_provider_leader{upstream}                   1 while leading (cluster)
package provider
