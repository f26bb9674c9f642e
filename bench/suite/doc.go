// Package suite is the benchmark runner behind `make bench`, `make
// bench-quick` and `make bench-peers` (seed 000 §17): it starts the
// simulations (bench/cmd/simupstreams), the system under test (bin/proxypool
// and, for peers, Squid and tinyproxy) and the load generator
// (bin/proxy-loadgen) as separate processes, runs the scenarios of seed 000
// §17.3, and prints one line per figure.
//
// It owns the processes it starts and stops each by its PID, always: on
// success, on failure and on SIGINT/SIGTERM. Every server listens on
// loopback; every load is bounded in time.
//
// It must never import engine/ packages: it measures the appliance from
// the outside, through its listeners, its admin API and /proc.
package suite
