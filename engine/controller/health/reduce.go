package health

import (
	"hash/fnv"
	"time"

	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Policy is an upstream's check policy (config.Check).
type Policy struct {
	// FailureThreshold is how many consecutive failures make a proxy
	// UNHEALTHY (a new one in CHECKING, or one already SUSPECT).
	FailureThreshold int
	Interval         time.Duration
	Timeout          time.Duration
}

func (p Policy) threshold() int { return max(p.FailureThreshold, 1) }

// Reduce decides the state after obs. It is pure and total: a state that
// health does not govern (FETCHED, DRAINING, EXTRACTED, terminal ones)
// comes back unchanged, so a late observation can never resurrect a proxy.
//
//	CHECKING  + success -> AVAILABLE
//	CHECKING  + failure -> CHECKING (retry) until FailureThreshold, then UNHEALTHY
//	AVAILABLE + success -> AVAILABLE
//	AVAILABLE + failure -> SUSPECT (first meaningful failure, not removal)
//	SUSPECT   + success -> AVAILABLE
//	SUSPECT   + failure -> SUSPECT until FailureThreshold consecutive, then UNHEALTHY
func Reduce(state proxy.State, fails int, obs checker.Observation, p Policy) (proxy.State, int) {
	switch state {
	case proxy.StateChecking:
		if obs.Success {
			return proxy.StateAvailable, 0
		}
		if fails+1 >= p.threshold() {
			return proxy.StateUnhealthy, fails + 1
		}
		return proxy.StateChecking, fails + 1
	case proxy.StateAvailable:
		if obs.Success {
			return proxy.StateAvailable, 0
		}
		return proxy.StateSuspect, 1
	case proxy.StateSuspect:
		if obs.Success {
			return proxy.StateAvailable, 0
		}
		if fails+1 >= p.threshold() {
			return proxy.StateUnhealthy, fails + 1
		}
		return proxy.StateSuspect, fails + 1
	}
	return state, fails
}

// jitterFraction spreads rechecks by a stable hash of the proxy ID into
// [-0.1, +0.1) so that proxies fetched in one batch do not recheck in one
// burst, and the same proxy always gets the same offset (seed 000 §13).
func jitterFraction(id proxy.ID) float64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return (float64(h.Sum64()%2001)/1000 - 1) * 0.1
}

// NextRecheck is when an AVAILABLE proxy last checked at last is due again.
func NextRecheck(id proxy.ID, last time.Time, interval time.Duration) time.Time {
	return last.Add(interval + time.Duration(float64(interval)*jitterFraction(id)))
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
