// Package loadgen is the load generator behind cmd/proxy-loadgen and the
// benchmark suite (seed 000 §3.4): it drives a proxy (or a target
// directly) with HTTP requests, CONNECT tunnels or Distribution extract
// calls, and reports latency quantiles, outcome classes, throughput, its
// own Go memory and GC, and the CPU, RSS and open descriptors of the
// system under test sampled from /proc.
//
// It owns:
//
//   - the open-loop Schedule: with a target rate, operation i is due at
//     start + i/rate whether or not earlier ones have finished, and its
//     latency is measured from that intended time, so a stall of the
//     system under test shows in the quantiles instead of being hidden by
//     a load generator that politely waited (coordinated omission, as
//     wrk2 corrects it); operations that came due but never found a free
//     worker are counted as unsent;
//   - the Recorder (HdrHistogram, sharded so recording never contends),
//     the per-second timeline, and the outcome classes (ClassifyStatus,
//     ClassifyConnect, ClassifyError);
//   - the modes: http (keep-alive clients, one connection each), connect
//     (a new tunnel per operation: the setup rate), tunnels (K long-lived
//     tunnels held open with traffic through them) and extract;
//   - the Sampler of /proc/<pid> (and descendants) and of the host's
//     loopback traffic, TCP socket counts and load average;
//   - the Result and its two renderings: JSON for machines, a table for
//     people.
//
// Every run is bounded: by a request count, a duration, or both, and
// always by Config.MaxDuration (hard: everything in flight is cut); every
// operation by Config.Timeout. Canceling the context is a soft stop: no
// new operation starts and those in flight finish. It only dials the
// addresses it is given; the suite gives it loopback ones.
//
// It must never import engine/ packages: it measures the appliance from
// the outside, as any client would.
package loadgen
