// Package testenv owns the real, loopback-only network servers that tests,
// benchmarks and the demo run Proxy Pool against:
//
//   - StartRedis and StartPostgres run throw-away database servers from the
//     locally installed binaries (or point at external ones through
//     PROXYPOOL_TEST_REDIS_URL / PROXYPOOL_TEST_POSTGRES_URL) and can be
//     stopped and restarted to exercise reconnect paths.
//   - Vendor simulates a proxy vendor's HTTP API, with switchable failure
//     modes (errors, rate limiting, slowness, garbage, duplicates).
//   - UpstreamProxy simulates the short-lived upstream HTTP/CONNECT proxies
//     that vendors hand out, with injectable faults.
//   - Target is the origin server requests finally reach; it reports what it
//     received and which upstream proxy the request came through.
//
// Everything listens on and dials only loopback addresses, so nothing here can
// reach or be reached from another machine. Vendor, UpstreamProxy and Target
// do not need a testing.TB, so the demo can use them too.
package testenv
