package dispatch

import "errors"

// ErrNoRoute: no routing rule matches the request.
var ErrNoRoute = errors.New("dispatching request: no routing rule matches")

// ErrStale: the snapshot is past its ValidUntil or older than maxStaleAge,
// or none was applied yet; no new allocation may start (seed 000 §11).
var ErrStale = errors.New("dispatching request: snapshot stale")

// ErrNoCandidate matches every *NoCandidateError with errors.Is.
var ErrNoCandidate = errors.New("dispatching request: no candidate proxy")

// ErrAllocationState: Commit on an allocation that is not reserved
// (committed twice, already released, or a stale handle).
var ErrAllocationState = errors.New("committing allocation: not in reserved state")

// Reason says why a rule had no candidate.
type Reason uint8

// Reasons, in the order the filter applies them.
const (
	// ReasonEmpty: the rule's upstreams have no allocatable proxy.
	ReasonEmpty Reason = iota + 1
	// ReasonExhausted: a sequential rule ran past its last upstream.
	ReasonExhausted
	// ReasonDisabled: the upstreams the rule may use now are disabled.
	ReasonDisabled
	// ReasonExcluded: the only usable proxies were excluded by a retry.
	ReasonExcluded
	// ReasonExpired: every proxy is past its usable period.
	ReasonExpired
	// ReasonBusy: every usable proxy is at its concurrency limit.
	ReasonBusy
	// ReasonRoutingLimit: the routing holds its maxInFlight requests.
	ReasonRoutingLimit
	numReasons
)

var reasonNames = [numReasons]string{
	ReasonEmpty:        "empty",
	ReasonExhausted:    "exhausted",
	ReasonDisabled:     "disabled",
	ReasonExcluded:     "excluded",
	ReasonExpired:      "expired",
	ReasonBusy:         "busy",
	ReasonRoutingLimit: "routing_limit",
}

func (r Reason) String() string {
	if r > 0 && r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// NoCandidateError is the typed refusal of a matched rule that has no proxy
// to offer. One value per reason is allocated up front so that refusing
// allocates nothing.
type NoCandidateError struct {
	Reason Reason
}

func (e *NoCandidateError) Error() string {
	return "dispatching request: no candidate proxy: " + e.Reason.String()
}

// Is makes errors.Is(err, ErrNoCandidate) true.
func (e *NoCandidateError) Is(target error) bool { return target == ErrNoCandidate }

var noCandidate = func() (e [numReasons]*NoCandidateError) {
	for r := ReasonEmpty; r < numReasons; r++ {
		e[r] = &NoCandidateError{Reason: r}
	}
	return e
}()
