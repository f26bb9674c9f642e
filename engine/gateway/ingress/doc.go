// Package ingress owns the gateway's client side: its own HTTP/1.1 server
// (Server: an accept loop over the LimitListener, one goroutine per client
// connection, no net/http), absolute-form proxy requests and CONNECT,
// client credentials (read from Proxy-Authorization and
// X-Proxypool-Api-Key, checked by the shared engine/adapters/http/auth),
// access.allowCIDRs and trustedProxies, the destination guard (netguard),
// header hygiene (no Proxy-Authorization, gateway header, session header,
// hop-by-hop header or header named in Connection reaches a target),
// framing checks against request smuggling, per-client rate limits, safe
// retries, onUnavailable "direct", CONNECT tunnels, and the listener that
// caps connections in total and per client.
//
// A connection reads request heads in place from a pooled buffer
// (internal/h1: fields are byte slices, nothing allocated), bounded by
// gateway.limits.maxHeaderBytes (431) and maxHeaderCount (431), under
// readHeaderTimeout; waits for the next request under idleTimeout;
// answers on a pooled bufio.Writer; keeps the connection alive as HTTP/1.1
// and HTTP/1.0 say (Connection: close / keep-alive), never after a
// refusal of a request with a body, a body it did not read (the
// upstream answered before taking all of it: the transport stops the
// body read through Request.StopBody), or a close-delimited response;
// pipelined requests are served in order.
// Closing on a client that may still be sending drains it first (FIN,
// then read until its close, at most 500 ms / 256 KiB) so the answer is
// not destroyed by a reset.
//
// The request path: listener caps → framing (malformed heads: 400
// bad-request / bad-framing, 431 headers-too-large, 501, 505; then bad
// chunk framing while the body streams) → access → header count → auth →
// rate limit → target → destination guard → Acquire → transport → Commit
// (response headers / CONNECT 2xx) → stream → Release with the outcome.
//
// Drain (Server.Shutdown): stop accepting, close idle kept-alive
// connections at once, let requests and tunnels in flight finish (their
// responses say Connection: close), poll every 20 ms until none is left or
// the deadline; Server.Close then closes every connection, upstream
// exchanges in progress included, and cancels the requests' context.
// A forwarded request parked by onUnavailable "wait" or waiting for
// upstream headers for longer than 500 ms has its client connection
// watched (watch.go: a peek, nothing consumed, no background read per
// request): a client that leaves cancels it, aborts the upstream exchange,
// releases the proxy without an outcome and closes the connection.
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
// declared in handler.go, and must never import net/http or the gateway
// package that assembles it.
package ingress
