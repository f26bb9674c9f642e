// Package extraction holds the exclusive-extraction command and result
// (seed 000 §10). An extracted proxy leaves the pool for good.
package extraction

import (
	"errors"
	"fmt"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
)

// Fulfillment says what to do when fewer proxies match than requested.
type Fulfillment string

// Fulfillment modes.
const (
	Partial      Fulfillment = "partial"
	AllOrNothing Fulfillment = "allOrNothing"
)

// Filters restrict which AVAILABLE proxies are eligible (seed 000 §10.2).
type Filters struct {
	Protocol          proxy.Scheme
	Region            string
	Carrier           string
	Upstreams         []string // allowedUpstreams; empty = any
	MinRemainingTTL   time.Duration
	MaxHealthCheckAge time.Duration
}

// Request is one extraction command.
type Request struct {
	Client         string
	Count          int
	Filters        Filters
	Fulfillment    Fulfillment
	IdempotencyKey string
	IdempotencyTTL time.Duration
	// ReserveForGateway AVAILABLE proxies must remain after the extraction.
	ReserveForGateway int
	Now               time.Time
}

// MaxCount bounds one request regardless of configuration.
const MaxCount = 10000

// Validate checks the command's shape.
func (r *Request) Validate() error {
	if r.Count < 1 || r.Count > MaxCount {
		return fmt.Errorf("count must be between 1 and %d, got %d", MaxCount, r.Count)
	}
	switch r.Fulfillment {
	case Partial, AllOrNothing:
	default:
		return fmt.Errorf("fulfillment must be %q or %q, got %q", Partial, AllOrNothing, r.Fulfillment)
	}
	if r.Filters.Protocol != "" && !r.Filters.Protocol.Valid() {
		return fmt.Errorf("unknown protocol %q", r.Filters.Protocol)
	}
	if r.Filters.MinRemainingTTL < 0 || r.Filters.MaxHealthCheckAge < 0 {
		return errors.New("durations must not be negative")
	}
	if len(r.IdempotencyKey) > 200 {
		return errors.New("idempotency key longer than 200 bytes")
	}
	return nil
}

// Eligible reports whether p passes the filters at now. It is the one
// definition every store implements (the Redis script mirrors it).
func (f *Filters) Eligible(p *proxy.Proxy, now time.Time) bool {
	if p.State != proxy.StateAvailable || !now.Before(p.UsableUntil) {
		return false
	}
	if f.Protocol != "" && p.Key.Scheme != f.Protocol {
		return false
	}
	if f.Region != "" && p.Region != f.Region {
		return false
	}
	if f.Carrier != "" && p.Carrier != f.Carrier {
		return false
	}
	if len(f.Upstreams) > 0 {
		ok := false
		for _, u := range f.Upstreams {
			if u == p.Upstream {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if p.ExpiresAt.Sub(now) < f.MinRemainingTTL {
		return false
	}
	if f.MaxHealthCheckAge > 0 && now.Sub(p.LastSuccessAt) > f.MaxHealthCheckAge {
		return false
	}
	return true
}

// Result is what an extraction returned.
type Result struct {
	Requested int
	Returned  int
	Proxies   []proxy.Proxy
	// Replayed is set when the result came from the idempotency cache.
	Replayed bool
}

// ErrInsufficient is returned by allOrNothing when too few proxies match;
// nothing was changed.
var ErrInsufficient = errors.New("not enough eligible proxies")

// InsufficientError carries how many were available.
type InsufficientError struct{ Requested, Available int }

func (e *InsufficientError) Error() string {
	return fmt.Sprintf("requested %d proxies, %d eligible", e.Requested, e.Available)
}

// Is makes errors.Is(err, ErrInsufficient) true.
func (e *InsufficientError) Is(target error) bool { return target == ErrInsufficient }

// ErrIdempotencyConflict is returned when a key is reused with a different
// request.
var ErrIdempotencyConflict = errors.New("idempotency key reused with a different request")
