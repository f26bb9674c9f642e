// Package transport owns the gateway's side of the upstream proxies: it
// forwards absolute-form HTTP requests through an upstream proxy over
// kept-alive connections of its own pool, opens CONNECT tunnels through
// one, and classifies every failure by the phase it happened in
// (worker.PhaseDial, PhaseProxyHandshake, PhaseResponseHeaders); a
// failure to read the client's body is a BodyError, blamed on no proxy.
// For onUnavailable "direct" it also reaches a target without a proxy,
// dialling only the addresses the destination guard checked
// (DirectRoundTrip, DirectConnect).
//
// One exchange: the request head (request line, the client side's field
// block, the proxy's Proxy-Authorization) goes out in one write; a body
// follows in its own framing (Content-Length, or chunked verbatim), after
// the upstream's 100 Continue or ExpectContinueTimeout when the client
// expects one; the response head is read in place (internal/h1) within
// MaxResponseHeaderBytes and ResponseHeaderTimeout (from the end of the
// body), interim 1xx skipped; the body is then the caller's to read by its
// framing (none for HEAD, 204, 304; Content-Length; chunked verbatim or
// decoded; until close). A body is written by a goroutine of the exchange
// while the head is read: an upstream answering before it has the whole
// body (an early 413) stops the body there and its answer is the response
// (BodyUnsent), on a connection that is then not kept. The goroutine has
// ended when RoundTrip returns; requests without a body start none.
//
// Connection reuse: idle connections are kept per upstream proxy (address
// and credentials) — per destination for direct requests — in a LIFO
// stack under its own mutex, found through 32 read-locked map shards: no
// lock shared by every request. Bounds: MaxIdleConnsPerProxy per proxy,
// MaxIdleConns in all, IdleConnTimeout (a timer sweeps expired ones and
// forgets unused proxies; none runs while nothing is idle). A connection
// goes back only when its response was read to the end and both sides
// allow keep-alive. One idle for over a second is probed (a non-blocking
// peek) before use; if a kept connection still turns out closed before
// any byte of a response, an idempotent request without a body is sent
// again on a fresh connection, not counted as a failure or a retry. A
// connection holds its read buffer only while a request uses it.
//
// This package must never import dispatch, ingress or net/http; it knows
// a proxy only as a *snapshot.Target.
package transport
