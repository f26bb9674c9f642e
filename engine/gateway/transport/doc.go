// Package transport owns the gateway's side of the upstream proxies: it
// forwards absolute-form HTTP requests through an upstream proxy over kept-
// alive connections, opens CONNECT tunnels through one, and classifies every
// failure by the phase it happened in (worker.PhaseDial,
// PhaseProxyHandshake, PhaseResponseHeaders). For onUnavailable "direct" it
// also reaches a target without a proxy, dialling only the addresses the
// destination guard checked (DirectRoundTrip, DirectConnect).
//
// Connection reuse: one *http.Transport whose Proxy hook reads the target
// proxy from the request context. net/http keys its idle pool by proxy URL
// (credentials included) and, for plain-HTTP targets through an HTTP proxy,
// not by target host — so every upstream proxy gets its own bounded idle
// pool (MaxIdleConnsPerProxy) inside one global bound (MaxIdleConns), with
// idle expiry, and no map, lock or eviction policy of ours. A Transport per
// upstream proxy in a bounded LRU would add a locked map lookup per request,
// duplicate the idle-pool machinery per proxy and need explicit closing on
// eviction, for no gain in isolation.
//
// This package must never import dispatch or ingress; it knows a proxy only
// as a *snapshot.Target.
package transport
