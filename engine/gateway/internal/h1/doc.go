// Package h1 holds the HTTP/1.1 wire primitives of the gateway's own
// forwarding path, shared by the client side (ingress) and the upstream
// side (transport): a connection reader whose buffer keeps a message head
// contiguous, request and response head parsers that work in place on
// that buffer (fields are byte slices into it; nothing is allocated), and
// a body reader that follows Content-Length, chunked (verbatim or
// decoded) and close-delimited framing and stops exactly at the end of a
// message.
//
// Every bound is explicit: the head limit is the caller's (config
// maxHeaderBytes, transport MaxResponseHeaderBytes), the field count the
// caller's, a chunk-size line 4 KiB, a trailer section 16 KiB. Parsing is
// strict where leniency would let two parsers disagree about where a
// message ends (request smuggling): obs-fold, Content-Length lists or
// conflicts, Transfer-Encoding with Content-Length or in HTTP/1.0, a
// transfer coding other than one chunked, bare CR, bare LF inside chunk
// framing. Bare LF as a head line ending is accepted (RFC 9112 §2.2).
//
// It imports only the standard library and is internal to the gateway.
package h1
