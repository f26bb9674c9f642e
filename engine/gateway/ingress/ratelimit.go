package ingress

import (
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// MaxRateClients bounds the per-client rate limiters kept at once. When a
// shard is full an arbitrary limiter is dropped: its client starts with a
// full bucket again, which costs a little precision under a flood of new
// identities but never memory.
const MaxRateClients = 65536

const rateShards = 32

// rateKey identifies a client for rate limiting: the principal, or the
// address for anonymous clients (mode none), who would otherwise share
// one bucket.
type rateKey struct {
	name string
	ip   netip.Addr
}

// clientRates holds one token bucket per client, in sharded maps.
type clientRates struct {
	limit rate.Limit
	burst int
	seed  maphash.Seed
	sh    [rateShards]struct {
		mu sync.Mutex
		m  map[rateKey]*rate.Limiter
		_  [40]byte
	}
}

// newClientRates returns limiters of perSecond requests per second (burst
// of one second's worth), nil when perSecond is not positive (no limit).
func newClientRates(perSecond float64) *clientRates {
	if perSecond <= 0 {
		return nil
	}
	c := &clientRates{limit: rate.Limit(perSecond), burst: int(math.Max(1, math.Ceil(perSecond))), seed: maphash.MakeSeed()}
	for i := range c.sh {
		c.sh[i].m = make(map[rateKey]*rate.Limiter)
	}
	return c
}

// allow takes one token of k's bucket.
func (c *clientRates) allow(k rateKey, now time.Time) bool {
	if c == nil {
		return true
	}
	h := maphash.String(c.seed, k.name)
	if k.ip.IsValid() {
		b := k.ip.As16()
		h ^= maphash.Bytes(c.seed, b[:])
	}
	s := &c.sh[h%rateShards]
	s.mu.Lock()
	l := s.m[k]
	if l == nil {
		if len(s.m) >= MaxRateClients/rateShards {
			for victim := range s.m {
				delete(s.m, victim)
				break
			}
		}
		l = rate.NewLimiter(c.limit, c.burst)
		s.m[k] = l
	}
	s.mu.Unlock()
	return l.AllowN(now, 1)
}
