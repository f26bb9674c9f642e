// Package netguard is the SSRF and DNS-rebinding guard shared by the gateway
// and the controller (SPEC §7, seed 000 §15): it classifies IP addresses —
// never host text — and decides whether traffic may go to them.
//
// Classify is pure and total: every netip.Addr gets exactly one Class, and
// Class.Internal says whether it points inside (loopback, RFC 1918,
// link-local, CGNAT, multicast, unspecified, broadcast and reserved, cloud
// metadata, IPv6 unique-local and site-local, zoned addresses, and the IPv6
// forms that embed an IPv4 address: IPv4-compatible, 6to4, Teredo, ISATAP,
// and NAT64 when the embedded address is itself internal; IPv4-mapped
// addresses are classified as the IPv4 address they carry). ParseHost reads
// an address in every spelling a resolver or an upstream proxy might
// accept (inet_aton's decimal, octal, hex and short forms, trailing dots,
// brackets, zones).
//
// A Guard adds policy: security.deniedCIDRs, the explicit loopback opt-in
// (security.allowLoopbackDestinations, for tests and the demo), the
// gateway's own listeners (self-connection), and Resolve, which resolves a
// name, refuses it if any address is refused, and returns the checked
// addresses so that a direct dial uses exactly those (no second lookup to
// rebind).
//
// The controller uses the same classifier to refuse provider-imported
// proxy addresses that point inside. This package must never import
// net/http, the gateway's other packages, or anything outside the standard
// library but engine/config.
package netguard
