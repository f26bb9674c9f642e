// Package ingress owns the gateway's client side: an http.Handler serving
// absolute-form HTTP proxy requests and CONNECT, client credentials (read
// from Proxy-Authorization and X-Proxypool-Api-Key, checked by the shared
// engine/adapters/http/auth), access.allowCIDRs and trustedProxies, the
// destination guard (netguard), header hygiene (no Proxy-Authorization,
// gateway header, session header or hop-by-hop header reaches a target),
// framing checks net/http does not make (obs-fold, Transfer-Encoding with
// Content-Length), per-client rate limits, safe retries, onUnavailable
// "direct", CONNECT tunnels with half-close and splice, and the listener
// that caps connections in total and per client.
//
// The request path: listener caps → framing → access → header bounds →
// auth → rate limit → target → destination guard → Acquire → transport →
// Commit (response headers / CONNECT 2xx) → stream → Release with the
// outcome.
//
// Metrics: proxypool_gateway_requests_total{method_class,result},
// proxypool_gateway_request_duration_seconds{method_class},
// proxypool_gateway_connect_tunnels_active,
// proxypool_gateway_bytes_total{direction},
// proxypool_gateway_retries_total,
// proxypool_gateway_rejections_total{reason},
// proxypool_gateway_client_connections_active,
// proxypool_gateway_client_connections_total,
// proxypool_gateway_upstream_connect_duration_seconds,
// proxypool_gateway_upstream_failures_total{phase},
// proxypool_gateway_direct_requests_total.
//
// It depends on dispatch and transport only through the small interfaces
// declared in handler.go, and must never import the gateway package that
// assembles it.
package ingress
