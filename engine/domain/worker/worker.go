// Package worker holds the data exchanged between the controller and a
// gateway worker (seed 002): the snapshot a worker serves from, the runtime
// counts it reports back and the outcomes of its allocations. In standalone
// mode these cross a Go interface; in a cluster, gRPC. The types are the same.
package worker

import (
	"context"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

// Snapshot is the full state a worker needs to route: the ordered routing
// rules, the sequential cursors, and the proxies this worker owns.
type Snapshot struct {
	Version     uint64
	GeneratedAt time.Time
	// ValidUntil is when the worker must stop new allocations if no newer
	// snapshot arrived (controller disconnect, maxStaleAge).
	ValidUntil time.Time
	Routings   []routing.Rule
	// Cursors holds, per sequential routing name, the index of the upstream
	// in use; -1 means exhausted (policy stop).
	Cursors map[string]int
	// Disabled upstreams take no new allocations.
	Disabled map[string]bool
	// Proxies owned by this worker. Only AVAILABLE ones are allocatable;
	// UsableUntil is the last allocatable instant.
	Proxies []proxy.Proxy
	// RoutingExclusions lists, per routing name, proxies of Proxies that
	// routing must not allocate: its TARGET check failed through them
	// (seed 000 §13, a target-level failure affects only that routing).
	// Every other routing may still use them. nil means none.
	RoutingExclusions map[string][]proxy.ID
}

// Applier accepts a new snapshot; the gateway implements it.
type Applier interface {
	Apply(ctx context.Context, s *Snapshot) error
}

// Runtime is one proxy's live counts on a worker.
type Runtime struct {
	ID       proxy.ID
	Active   int64
	Reserved int64
	// Draining: no longer in the current snapshot but still has counts.
	Draining bool
}

// RuntimeReader reads a worker's current counts (a sparse list: proxies
// with non-zero counts only).
type RuntimeReader interface {
	Runtime() []Runtime
}

// Phase is where an allocation failed.
type Phase uint8

// Failure phases (SPEC §7).
const (
	PhaseNone Phase = iota
	PhaseDial
	PhaseProxyHandshake
	PhaseResponseHeaders
	PhaseTunnel
)

func (p Phase) String() string {
	switch p {
	case PhaseNone:
		return "none"
	case PhaseDial:
		return "dial"
	case PhaseProxyHandshake:
		return "proxy_handshake"
	case PhaseResponseHeaders:
		return "response_headers"
	case PhaseTunnel:
		return "tunnel"
	}
	return "unknown"
}

// Outcome is the result of one allocation.
type Outcome struct {
	Proxy    proxy.ID
	Upstream string
	Routing  string
	Success  bool
	Phase    Phase
	Latency  time.Duration
	At       time.Time
}

// OutcomeSink receives outcomes in bounded batches; it must not block.
type OutcomeSink interface {
	ReportOutcomes(batch []Outcome)
}
