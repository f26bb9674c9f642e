// Package domain is the root of the pure domain model of Proxy Pool: proxies
// and their lifecycle, routing rules, upstream fetch outcomes, the activity
// pool contract, exclusive extraction and client principals.
//
// Nothing below engine/domain may import net/http, gRPC, SQL, Redis, expr or
// wazero: adapters depend on these packages, never the reverse.
package domain
