package provider

import "sync"

// Ledger is an upstream's fetch.maxTotal budget (seed 000 §8): the
// cumulative number of proxies the vendor may be asked for. A call reserves
// its expected count before it is made and settles to the actual count
// after; an uncertain call (timeout, unreadable or unparsable answer) stays
// charged at the expected amount, because the vendor may have billed it.
// A batch larger than estimatedIPsPerCall is charged as returned and stops
// further calls: the vendor does not honour the count, so the budget can no
// longer be kept by asking for less.
//
// It outlives runtime replacement on reload; one per upstream name.
type Ledger struct {
	mu      sync.Mutex
	limit   int64 // 0 = unlimited
	used    int64
	pending int64
	stopped bool
}

// NewLedger returns a ledger with the given limit (0 = unlimited).
func NewLedger(limit int64) *Ledger { return &Ledger{limit: limit} }

// SetLimit changes the limit (reload); what was used stays used.
func (l *Ledger) SetLimit(limit int64) {
	l.mu.Lock()
	l.limit = limit
	l.mu.Unlock()
}

// Reserve grants up to n for one call; 0 means the budget is exhausted.
func (l *Ledger) Reserve(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limit == 0 {
		l.pending += int64(n)
		return n
	}
	if l.stopped {
		return 0
	}
	room := l.limit - l.used - l.pending
	if room <= 0 {
		return 0
	}
	g := int(min(int64(n), room))
	l.pending += int64(g)
	return g
}

// Settle closes a reservation of expected: certain calls are charged
// actual, uncertain ones expected. estimated is the upstream's
// estimatedIPsPerCall.
func (l *Ledger) Settle(expected, actual int, certain bool, estimated int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending -= int64(expected)
	charge := expected
	if certain {
		charge = actual
	}
	l.used += int64(charge)
	if l.limit > 0 && certain && actual > estimated {
		l.stopped = true
	}
}

// Exhausted reports whether no further call may be made.
func (l *Ledger) Exhausted() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit > 0 && (l.stopped || l.used >= l.limit)
}

// Used returns the charged total.
func (l *Ledger) Used() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used
}
