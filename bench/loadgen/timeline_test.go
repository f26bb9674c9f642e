package loadgen

import (
	"testing"
	"time"
)

func TestTimeline(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tl := newTimeline(t0, 3*time.Second)
	tl.add(t0.Add(100*time.Millisecond), true, 5*time.Millisecond)
	tl.add(t0.Add(900*time.Millisecond), true, 7*time.Millisecond)
	tl.add(t0.Add(1500*time.Millisecond), false, 0)
	tl.add(t0.Add(-time.Second), true, time.Millisecond) // clock skew: first bucket
	tl.add(t0.Add(time.Hour), true, 2*time.Second)       // past the span: last bucket
	got := tl.seconds(t0.Add(2500 * time.Millisecond))
	want := []Second{{At: 0, OK: 3, MaxMS: 7}, {At: 1, Errors: 1}, {At: 2}}
	if len(got) != len(want) {
		t.Fatalf("seconds = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("second %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if last := tl.seconds(t0.Add(time.Hour)); last[len(last)-1].MaxMS != 2000 {
		t.Errorf("last bucket %+v, want the late completion", last[len(last)-1])
	}
}
