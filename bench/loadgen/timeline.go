package loadgen

import (
	"sync/atomic"
	"time"
)

// maxTimeline bounds the per-second buckets a run keeps (one hour); later
// completions land in the last bucket.
const maxTimeline = 3600

// Second is one second of a run, by completion time: how many operations
// succeeded and failed, and the slowest success.
type Second struct {
	At     int     `json:"s"`
	OK     int64   `json:"ok"`
	Errors int64   `json:"errors"`
	MaxMS  float64 `json:"max_ms"`
}

// timeline counts completions per second without locks, so a stall or a
// burst of errors can be placed in time.
type timeline struct {
	start   time.Time
	ok, err []atomic.Int64
	maxUS   []atomic.Int64
}

func newTimeline(start time.Time, span time.Duration) *timeline {
	n := min(int(span/time.Second)+2, maxTimeline)
	return &timeline{start: start, ok: make([]atomic.Int64, n), err: make([]atomic.Int64, n), maxUS: make([]atomic.Int64, n)}
}

func (t *timeline) bucket(at time.Time) int {
	return min(max(int(at.Sub(t.start)/time.Second), 0), len(t.ok)-1)
}

func (t *timeline) add(at time.Time, ok bool, lat time.Duration) {
	i := t.bucket(at)
	if !ok {
		t.err[i].Add(1)
		return
	}
	t.ok[i].Add(1)
	us := lat.Microseconds()
	for {
		cur := t.maxUS[i].Load()
		if us <= cur || t.maxUS[i].CompareAndSwap(cur, us) {
			return
		}
	}
}

// seconds returns the buckets up to end.
func (t *timeline) seconds(end time.Time) []Second {
	n := t.bucket(end) + 1
	out := make([]Second, n)
	for i := range out {
		out[i] = Second{At: i, OK: t.ok[i].Load(), Errors: t.err[i].Load(), MaxMS: float64(t.maxUS[i].Load()) / 1000}
	}
	return out
}
