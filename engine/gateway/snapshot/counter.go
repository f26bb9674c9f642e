package snapshot

import "sync/atomic"

// cacheLine is the padding unit; 64 bytes covers amd64 and arm64 L1 lines.
const cacheLine = 64

// Layout of the packed counter word. Active and reserved share one word so
// that a reservation sees both at the same instant and a single CAS decides
// it (seed 000 §5: "打包原子计数"). Bit 63 marks a counter the registry has
// reclaimed: nothing may reserve on it again, even through a snapshot that
// was loaded before the reclaim.
const (
	reservedMask = 1<<32 - 1
	activeOne    = 1 << 32
	activeMask   = 1<<31 - 1
	retiredBit   = 1 << 63

	// MaxLimit caps a proxy's concurrency so active+reserved never carries
	// into the retired bit.
	MaxLimit = 1 << 30
)

// Counter is one proxy's runtime count: active (committed) in the high 32
// bits, reserved (acquired, not yet committed) in the low 32. Each counter
// is padded to a cache line so that hammering one proxy does not slow its
// neighbours down (false sharing).
type Counter struct {
	v atomic.Uint64
	_ [cacheLine - 8]byte
}

// InUse is active+reserved, or ^uint64(0) for a retired counter so that a
// comparison against any limit treats it as full.
func (c *Counter) InUse() uint64 {
	v := c.v.Load()
	if v&retiredBit != 0 {
		return ^uint64(0)
	}
	return (v >> 32 & activeMask) + (v & reservedMask)
}

// TryReserve adds one reservation if active+reserved is below limit.
func (c *Counter) TryReserve(limit uint64) bool {
	for {
		v := c.v.Load()
		if v&retiredBit != 0 || (v>>32&activeMask)+(v&reservedMask) >= limit {
			return false
		}
		if c.v.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// Commit moves one reservation to active. The caller guarantees a matching
// reservation exists (dispatch's allocation state does).
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

// retire marks an idle counter unusable; it fails if any count is held.
func (c *Counter) retire() bool { return c.v.CompareAndSwap(0, retiredBit) }
