package snapshot

import "sync/atomic"

// cacheLine is the padding unit; 64 bytes covers amd64 and arm64 L1 lines.
const cacheLine = 64

// Layout of the packed counter word. Active and reserved share one word so
// that a reservation sees both at the same instant and a single CAS decides
// it (seed 000 §5: "打包原子计数").
//
// Bit 62 marks a proxy the current snapshot withdrew (absent, or no longer
// AVAILABLE): no new reservation may land on it, even through an older
// snapshot a request loaded before the swap. Because the mark and every
// reservation are operations on the same word, once Build returns either a
// reservation is visible in the counts or it can never happen — which is
// what exclusive extraction relies on (seed 000 §10.3: the controller waits
// for zero counts, then hands the proxy out). A later snapshot that lists
// the proxy as allocatable again clears the mark.
//
// Bit 63 marks a counter the registry has reclaimed: it is gone for good.
const (
	reservedMask = 1<<32 - 1
	activeOne    = 1 << 32
	activeMask   = 1<<30 - 1
	withdrawnBit = 1 << 62
	retiredBit   = 1 << 63
	flagBits     = withdrawnBit | retiredBit

	// MaxLimit caps a proxy's concurrency so active+reserved never carries
	// into the flag bits.
	MaxLimit = 1 << 29
)

// Counter is one proxy's runtime count: active (committed) in bits 32-61,
// reserved (acquired, not yet committed) in the low 32. Each counter is
// padded to a cache line so that hammering one proxy does not slow its
// neighbours down (false sharing).
type Counter struct {
	v atomic.Uint64
	_ [cacheLine - 8]byte
}

// InUse is active+reserved, or ^uint64(0) for a withdrawn or retired
// counter so that a comparison against any limit treats it as full.
func (c *Counter) InUse() uint64 {
	v := c.v.Load()
	if v&flagBits != 0 {
		return ^uint64(0)
	}
	return (v >> 32 & activeMask) + (v & reservedMask)
}

// TryReserve adds one reservation if active+reserved is below limit and
// the counter is neither withdrawn nor retired.
func (c *Counter) TryReserve(limit uint64) bool {
	for {
		v := c.v.Load()
		if v&flagBits != 0 || (v>>32&activeMask)+(v&reservedMask) >= limit {
			return false
		}
		if c.v.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// Commit moves one reservation to active. The caller guarantees a matching
// reservation exists (dispatch's allocation state does). It works on a
// withdrawn counter: a reservation made before the withdrawal may still
// complete, and is counted until released.
func (c *Counter) Commit() { c.v.Add(activeOne - 1) }

// CancelReservation drops one reservation.
func (c *Counter) CancelReservation() { c.v.Add(^uint64(0)) }

// ReleaseActive drops one active count.
func (c *Counter) ReleaseActive() { c.v.Add(^uint64(activeOne - 1)) }

// Counts returns active and reserved as read in one load.
func (c *Counter) Counts() (active, reserved int64) {
	v := c.v.Load()
	return int64(v >> 32 & activeMask), int64(v & reservedMask)
}

// Withdrawn reports whether new reservations are refused.
func (c *Counter) Withdrawn() bool { return c.v.Load()&flagBits != 0 }

func (c *Counter) withdraw() { c.v.Or(withdrawnBit) }

func (c *Counter) restore() { c.v.And(^uint64(withdrawnBit)) }

// retire marks an idle counter unusable for good; it fails if any count is
// held.
func (c *Counter) retire() bool {
	for {
		v := c.v.Load()
		if v&^flagBits != 0 {
			return false
		}
		if v&retiredBit != 0 || c.v.CompareAndSwap(v, retiredBit) {
			return true
		}
	}
}
