// Package relay copies bytes both ways between the two ends of a CONNECT
// tunnel, and owns the pipes it splices through.
//
// A tunnel is idle most of its life, so an idle tunnel must cost as little
// as possible: its two sockets and two small parked goroutines, no buffer
// and no pipe. On Linux, for a pair of *net.TCPConn, each direction parks
// in the netpoller until its source is readable, then takes a pipe from a
// bounded Pool, splices source → pipe → destination until the source has
// nothing more, and returns the pipe. (io.Copy between two TCPConns also
// splices, but keeps a pipe pair per direction for the copy's whole life:
// six descriptors per idle tunnel instead of two.) When the pool is
// exhausted a burst is copied through a pooled buffer instead of waiting,
// so tunnels whose destination is stalled (and which therefore hold their
// pipe) can never stall anyone else. Any other pair, and every pair on
// other systems, is copied through a pooled buffer.
//
// Copy keeps the semantics of a proxy tunnel: a clean end of one direction
// is passed on as a half-close (CloseWrite), an error in either direction
// closes both connections, and Close of either connection from another
// goroutine unblocks the copy.
//
// It imports only the standard library and golang.org/x/sys; it must never
// import the rest of the gateway.
package relay
