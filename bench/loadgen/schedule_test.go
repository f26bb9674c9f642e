package loadgen

import (
	"math"
	"testing"
	"time"
)

func TestScheduleDue(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		rate float64
		i    int64
		want time.Duration // after start; -1 for the zero time
	}{
		{"closed loop has no due time", 0, 5, -1},
		{"first is due at start", 1000, 0, 0},
		{"1000/s: one every millisecond", 1000, 7, 7 * time.Millisecond},
		{"fractional period", 3, 1, 333333333},
		{"high rate stays exact", 1e6, 3_600_000_000, time.Hour},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Schedule{Start: start, Rate: tt.rate}.Due(tt.i)
			if tt.want < 0 {
				if !got.IsZero() {
					t.Fatalf("Due = %v, want zero time", got)
				}
				return
			}
			if d := got.Sub(start); d != tt.want {
				t.Fatalf("Due(%d) = start+%v, want start+%v", tt.i, d, tt.want)
			}
		})
	}
}

func TestScheduleWithin(t *testing.T) {
	tests := []struct {
		name string
		rate float64
		d    time.Duration
		want int64
	}{
		{"closed loop is unbounded", 0, time.Second, math.MaxInt64},
		{"10k/s for 30s", 10_000, 30 * time.Second, 300_000},
		{"partial period rounds up: op 0 is due at once", 1, 500 * time.Millisecond, 1},
		{"nothing in no time", 100, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := (Schedule{Rate: tt.rate}).Within(tt.d); got != tt.want {
				t.Fatalf("Within(%v) = %d, want %d", tt.d, got, tt.want)
			}
		})
	}
}

// TestScheduleLatency is the coordinated-omission correction: an
// operation picked up late is charged from when it was due.
func TestScheduleLatency(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name            string
		rate            float64
		due, sent, done time.Time
		want            time.Duration
	}{
		{"open loop, sent on time", 100, at(10), at(10), at(12), 2 * time.Millisecond},
		{"open loop, sent late: the wait counts", 100, at(10), at(510), at(512), 502 * time.Millisecond},
		{"closed loop measures from the send", 0, time.Time{}, at(510), at(512), 2 * time.Millisecond},
		{"never negative", 100, at(10), at(10), at(9), 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Schedule{Start: t0, Rate: tt.rate}.Latency(tt.due, tt.sent, tt.done)
			if got != tt.want {
				t.Fatalf("Latency = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestRecorderQuantiles(t *testing.T) {
	r := NewRecorder(time.Minute)
	// 1..1000 ms, spread over shards as workers would.
	for i := 1; i <= 1000; i++ {
		r.Record(i, time.Duration(i)*time.Millisecond)
	}
	r.Record(3, 2*time.Hour) // above the ceiling: clamped, but the max is exact
	q := r.Quantiles()
	if q.Count != 1001 {
		t.Fatalf("Count = %d, want 1001", q.Count)
	}
	within := func(name string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > want*0.002 {
			t.Errorf("%s = %.3f ms, want %.3f ms ±0.2%%", name, got, want)
		}
	}
	within("p50", q.P50, 501)
	within("p90", q.P90, 901)
	within("p99", q.P99, 991)
	within("p99.9", q.P999, 1000)
	if q.Max != float64(2*time.Hour/time.Millisecond) {
		t.Errorf("Max = %v ms, want the exact 2h", q.Max)
	}
	if empty := NewRecorder(time.Second).Quantiles(); empty != (Quantiles{}) {
		t.Errorf("empty recorder = %+v, want zero", empty)
	}
}
