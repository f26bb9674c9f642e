// Package relay copies bytes both ways between the two ends of a CONNECT
// tunnel, and owns the buffers and pipes it copies through.
//
// A tunnel is idle most of its life, so an idle tunnel must cost as little
// as possible: its two sockets and two small parked goroutines, no buffer
// and no pipe. On Linux, for a *net.TCPConn source, each direction parks
// in the netpoller until its source is readable, then copies one burst and
// parks again:
//
//   - By default through a buffer taken for the burst only: a small one
//     (32 KiB), or, once a read has filled a small one (the direction is
//     moving bulk data), a large one (256 KiB) from a bounded set, so a
//     bulk transfer costs few system calls while the memory bulk tunnels
//     hold stays bounded however many there are. A bulk burst that finds
//     every large buffer in use takes a small one instead of waiting.
//   - With Options.Splice, between two TCP connections, by splice(2)
//     through a pipe from a bounded Pool, until the source has nothing
//     more. (io.Copy between two TCPConns also splices, but keeps a pipe
//     pair per direction for the copy's whole life: six descriptors per
//     idle tunnel instead of two.) When the pipes are exhausted a burst is
//     copied through a buffer instead of waiting, so tunnels whose
//     destination is stalled (and which therefore hold their pipe) can
//     never stall anyone else. On loopback, large buffers measured faster
//     than splice (docs/benchmarks.md), hence the default.
//
// Any other source, and every source on other systems, is copied through
// a small buffer held for the whole copy.
//
// Pool.Copy keeps the semantics of a proxy tunnel: a clean end of one direction
// is passed on as a half-close (CloseWrite), an error in either direction
// closes both connections, and Close of either connection from another
// goroutine unblocks the copy.
//
// It imports only the standard library and golang.org/x/sys; it must never
// import the rest of the gateway.
package relay
