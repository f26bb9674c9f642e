// Package sticky owns the gateway's session bindings (seed 001 §4.1): a
// bounded, sharded LRU per routing that maps (client, session id) to the
// proxy the session last committed on, with the proxy's usable_until as the
// binding's hard expiry.
//
// Lookups and updates take one shard mutex (never a global lock) and
// allocate nothing: keys are the strings the request already holds, and
// every shard's map and node array are sized once at construction.
//
// It knows proxies only by proxy.ID and must never import net/http,
// dispatch, transport or ingress.
package sticky
