// Package ingress owns the gateway's client side: an http.Handler serving
// absolute-form HTTP proxy requests and CONNECT, client authentication
// (Authenticator, registered by mode name), the access allow-list, the
// destination policy, header hygiene (no Proxy-Authorization or hop-by-hop
// header reaches a target), safe retries, CONNECT tunnels with half-close
// and splice, and the connection-limiting listener.
//
// The request path: access → header bounds → auth → target → destination
// policy → Acquire → transport → Commit (response headers / CONNECT 2xx) →
// stream → Release with the outcome.
//
// Metrics: proxypool_gateway_requests_total{method_class,result},
// proxypool_gateway_request_duration_seconds{method_class},
// proxypool_gateway_connect_tunnels_active,
// proxypool_gateway_bytes_total{direction},
// proxypool_gateway_retries_total,
// proxypool_gateway_rejections_total{reason}.
//
// It depends on dispatch and transport only through the small interfaces
// declared in handler.go, and must never import the gateway package that
// assembles it.
package ingress
