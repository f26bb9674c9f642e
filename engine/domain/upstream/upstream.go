// Package upstream holds the pure rules of provider fetching: how a fetch is
// classified (seed 000 §8.1), how consecutive empties advance, and the refill
// plan from pool inventory with minimum/target hysteresis.
package upstream

// Outcome is the class of one provider call.
type Outcome uint8

// Outcome classes, exactly as seed 000 §8.1.
const (
	// Success: at least one valid candidate was new.
	Success Outcome = iota + 1
	// Empty: the call and the parse succeeded, zero valid candidates.
	Empty
	// DuplicateOnly: valid candidates, all already known.
	DuplicateOnly
	// Error: timeout, DNS, unexpected HTTP status, auth, oversize response,
	// template or parse failure.
	Error
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Empty:
		return "empty"
	case DuplicateOnly:
		return "duplicate_only"
	case Error:
		return "error"
	}
	return "unknown"
}

// Classify decides the outcome of a call: failed reports a transport,
// status or parse failure; valid is the number of valid candidates parsed;
// fresh the number of those that were new to the pool.
func Classify(failed bool, valid, fresh int) Outcome {
	switch {
	case failed:
		return Error
	case valid == 0:
		return Empty
	case fresh == 0:
		return DuplicateOnly
	default:
		return Success
	}
}

// Counters are an upstream's consecutive-outcome counters.
type Counters struct {
	ConsecutiveEmpty  int
	ConsecutiveErrors int
}

// Apply returns the counters after o, and whether the empty threshold was
// reached by this very outcome (so the depletion fires exactly once per run
// of empties).
func (c Counters) Apply(o Outcome, threshold int) (Counters, bool) {
	switch o {
	case Empty:
		c.ConsecutiveEmpty++
		c.ConsecutiveErrors = 0
		return c, c.ConsecutiveEmpty == threshold
	case DuplicateOnly, Success:
		// DuplicateOnly is not Empty and resets the run (seed 000 §8.1).
		c.ConsecutiveEmpty = 0
		c.ConsecutiveErrors = 0
	case Error:
		// Errors leave the empty run untouched.
		c.ConsecutiveErrors++
	}
	return c, false
}

// Inventory is the authoritative view of one upstream's share of the pool.
type Inventory struct {
	Managed        int   // proxies in any live state (not EXTRACTED, EXPIRED, REMOVED)
	Available      int   // AVAILABLE and usable now
	AvailableSlots int64 // free concurrency over usable AVAILABLE proxies
	Pending        int   // FETCHED or CHECKING
}

// PoolLimits are the refill watermarks.
type PoolLimits struct {
	Minimum, Target, MaxSize int
}

// Plan decides how many proxies to ask the provider for. Hysteresis: nothing
// is fetched until usable inventory falls below Minimum, then the pool is
// refilled to Target, never beyond MaxSize. refilling carries the state of
// the previous call so a refill in progress continues up to Target.
func Plan(inv Inventory, lim PoolLimits, refilling bool) (want int, stillRefilling bool) {
	have := inv.Available + inv.Pending
	if !refilling && have >= lim.Minimum {
		return 0, false
	}
	if have >= lim.Target {
		return 0, false
	}
	want = lim.Target - have
	if room := lim.MaxSize - inv.Managed; want > room {
		want = room
	}
	if want <= 0 {
		return 0, false
	}
	return want, true
}
