package loadgen

import (
	"math"
	"time"
)

// Schedule is the open-loop send plan: operation i is due at
// Start + i/Rate, whatever happened to operations before it. A worker that
// picks operation i up late (every worker was busy) still measures its
// latency from Due(i), so time the system under test made the load
// generator wait is charged to the system under test (coordinated
// omission, as wrk2 corrects it). A zero Rate is a closed loop: nothing is
// due at any particular time.
type Schedule struct {
	Start time.Time
	Rate  float64 // operations per second; 0: closed loop
}

// Open reports whether the schedule sets intended send times.
func (s Schedule) Open() bool { return s.Rate > 0 }

// Due returns when operation i should be sent (the zero time in a closed
// loop).
func (s Schedule) Due(i int64) time.Time {
	if !s.Open() {
		return time.Time{}
	}
	// float64 keeps sub-nanosecond periods exact enough: at 1e6 ops/s an
	// hour is 3.6e9 operations, well inside float64's 2^53.
	return s.Start.Add(time.Duration(float64(i) * float64(time.Second) / s.Rate))
}

// Within returns how many operations are due before Start+d: the count a
// duration bound allows in an open loop (math.MaxInt64 when closed).
func (s Schedule) Within(d time.Duration) int64 {
	if !s.Open() {
		return math.MaxInt64
	}
	n := math.Ceil(d.Seconds() * s.Rate)
	if n >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(n)
}

// Latency is the corrected latency of an operation that was due at due,
// actually sent at sent and finished at done: measured from due when the
// schedule is open, from sent otherwise. An operation sent early (never,
// by construction) would not get a negative latency.
func (s Schedule) Latency(due, sent, done time.Time) time.Duration {
	from := sent
	if s.Open() && due.Before(sent) {
		from = due
	}
	return max(done.Sub(from), 0)
}
