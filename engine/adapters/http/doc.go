// Package httpapi owns the REST surfaces of the controller: the
// distribution API (POST /v1/extract, seed 000 §10, seed 001 §4.2), the
// admin API (/v1/admin/..., seed 000 §15) and the ops endpoints (/healthz,
// /readyz, /metrics). Their contracts are api/openapi/distribution.yaml and
// api/openapi/admin.yaml; a test keeps the route tables here and those
// documents equal.
//
// Each surface applies, before routing: cross-origin protection for
// browser-sent writes, access.allowCIDRs (403), then the surface's auth
// mode (401 with WWW-Authenticate, or 403 when no credential could help).
// The client address comes from X-Forwarded-For only when the peer is a
// trusted proxy (package auth). Every error is application/problem+json
// (RFC 9457) and every response carries Cache-Control: no-store, since
// extract responses hold proxy credentials and admin data must not be
// cached by intermediaries either.
//
// Compose the admin listener as
//
//	mux := http.NewServeMux()
//	mux.Handle("/v1/admin/", admin)
//	mux.Handle("/", ops)
//	srv := httpapi.NewServer(mux, httpapi.DefaultServerLimits())
//
// The ops endpoints are unauthenticated on purpose: probes and scrapers
// must reach them, and they carry no secret or proxy address.
//
// Metrics (labels: surface = distribution | admin | ops; route = the
// registered pattern such as "POST /v1/admin/upstreams/{name}/enable", or
// "unmatched"; never the raw path):
//
//	proxypool_api_requests_total{surface,route,code}
//	proxypool_api_request_duration_seconds{surface,route}
//
// The package depends on the controller only through the small interfaces
// in api.go and the view types of engine/controller; it must never import a
// store adapter, the gateway or the checker.
package httpapi
