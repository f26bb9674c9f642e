package health

import (
	"hash/fnv"
	"time"

	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Anonymity grades what a proxy reveals (EGRESS check), from worst to best.
type Anonymity uint8

// Anonymity grades.
const (
	// Transparent: one of our own addresses reached the echo service.
	Transparent Anonymity = iota + 1
	// Anonymous: our address stayed hidden, but the proxy announced itself
	// (Via, X-Forwarded-For, Forwarded, …).
	Anonymous
	// Elite: neither.
	Elite
)

func (a Anonymity) String() string {
	switch a {
	case Transparent:
		return "transparent"
	case Anonymous:
		return "anonymous"
	case Elite:
		return "elite"
	}
	return "unknown"
}

// ParseAnonymity reads check.anonymity; anything else is Anonymous, the
// default.
func ParseAnonymity(s string) Anonymity {
	switch s {
	case "transparent":
		return Transparent
	case "elite":
		return Elite
	}
	return Anonymous
}

// Grade is the anonymity an EGRESS observation shows.
func Grade(obs checker.Observation) Anonymity {
	switch {
	case obs.AddressLeaked:
		return Transparent
	case len(obs.ProxyHeaders) > 0:
		return Anonymous
	}
	return Elite
}

// Policy is an upstream's check policy (config.Check).
type Policy struct {
	// FailureThreshold is how many consecutive failures make a proxy
	// UNHEALTHY (a new one in CHECKING, or one already SUSPECT), and how
	// many consecutive TARGET failures exclude it from a routing.
	FailureThreshold int
	Interval         time.Duration
	Timeout          time.Duration
	// ProbeTarget is BASIC's CONNECT target ("" = the proxy itself).
	ProbeTarget string
	// EgressURL, when set, makes every proxy-level check an EGRESS check
	// against this echo service.
	EgressURL string
	// Anonymity is the least an EGRESS check must show (0 = Anonymous).
	Anonymity Anonymity
}

func (p Policy) threshold() int { return max(p.FailureThreshold, 1) }

func (p Policy) anonymity() Anonymity {
	if p.Anonymity == 0 {
		return Anonymous
	}
	return p.Anonymity
}

// Passed reports whether a proxy-level observation counts as a pass under
// p: the check completed and, for EGRESS, the proxy is at least as
// anonymous as required. A transparent proxy fails an "anonymous" policy
// however fast it is.
func Passed(obs checker.Observation, p Policy) bool {
	if !obs.Success {
		return false
	}
	if obs.Level == checker.LevelEgress {
		return Grade(obs) >= p.anonymity()
	}
	return true
}

// Reduce decides a proxy's state after a proxy-level (BASIC or EGRESS)
// observation. It is pure and total: a state that health does not govern
// (FETCHED, DRAINING, EXTRACTED, terminal ones) comes back unchanged, so a
// late observation can never resurrect a proxy; a TARGET observation never
// changes the proxy's state (ReduceTarget decides for its routing).
//
//	CHECKING  + pass    -> AVAILABLE
//	CHECKING  + failure -> CHECKING (retry) until FailureThreshold, then UNHEALTHY
//	AVAILABLE + pass    -> AVAILABLE
//	AVAILABLE + failure -> SUSPECT (first meaningful failure, not removal)
//	SUSPECT   + pass    -> AVAILABLE
//	SUSPECT   + failure -> SUSPECT until FailureThreshold consecutive, then UNHEALTHY
func Reduce(state proxy.State, fails int, obs checker.Observation, p Policy) (proxy.State, int) {
	if obs.Level == checker.LevelTarget {
		return state, fails
	}
	ok := Passed(obs, p)
	switch state {
	case proxy.StateAvailable:
		if ok {
			return proxy.StateAvailable, 0
		}
		return proxy.StateSuspect, 1
	case proxy.StateChecking, proxy.StateSuspect:
		// A new proxy and a suspect one are judged alike: one pass proves
		// it, failures are retried in place up to the threshold.
		if ok {
			return proxy.StateAvailable, 0
		}
		if fails+1 >= p.threshold() {
			return proxy.StateUnhealthy, fails + 1
		}
		return state, fails + 1
	}
	return state, fails
}

// TargetHealth is one proxy's standing for one routing's TARGET check.
type TargetHealth struct {
	Fails     int
	Excluded  bool
	CheckedAt time.Time
}

// ReduceTarget decides a proxy's standing for the observation's routing:
// a pass clears it; FailureThreshold consecutive failures exclude the
// proxy from that routing only, until it passes again. Other levels leave
// h unchanged.
func ReduceTarget(h TargetHealth, obs checker.Observation, p Policy) TargetHealth {
	if obs.Level != checker.LevelTarget {
		return h
	}
	if obs.Success {
		return TargetHealth{CheckedAt: obs.At}
	}
	n := h.Fails + 1
	return TargetHealth{Fails: n, Excluded: n >= p.threshold(), CheckedAt: obs.At}
}

// jitterFraction spreads rechecks by a stable hash into [-0.1, +0.1) so
// that proxies fetched in one batch do not recheck in one burst, and the
// same proxy always gets the same offset (seed 000 §13).
func jitterFraction(key string) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(key))
	return (float64(h.Sum64()%2001)/1000 - 1) * 0.1
}

// NextRecheck is when an AVAILABLE proxy last checked at last is due again.
func NextRecheck(id proxy.ID, last time.Time, interval time.Duration) time.Time {
	return nextAt(string(id), last, interval)
}

func nextAt(key string, last time.Time, interval time.Duration) time.Time {
	return last.Add(interval + time.Duration(float64(interval)*jitterFraction(key)))
}

// retryDelay is how soon a CHECKING or SUSPECT proxy is checked again after
// a failure: sooner than an ordinary recheck, never sooner than a second.
func retryDelay(interval time.Duration) time.Duration {
	d := interval / 4
	if d < time.Second {
		d = min(time.Second, interval)
	}
	return d
}
