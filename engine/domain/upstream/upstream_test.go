package upstream

import "testing"

func TestClassify(t *testing.T) {
	cases := []struct {
		name         string
		failed       bool
		valid, fresh int
		want         Outcome
	}{
		{"error wins", true, 5, 5, Error},
		{"empty", false, 0, 0, Empty},
		{"duplicate only", false, 3, 0, DuplicateOnly},
		{"success", false, 3, 1, Success},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Classify(tc.failed, tc.valid, tc.fresh); got != tc.want {
				t.Fatalf("Classify = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCountersThresholdFiresOnce(t *testing.T) {
	var c Counters
	fired := 0
	seq := []Outcome{Empty, Error, Empty, Empty, Empty, Empty}
	for _, o := range seq {
		var hit bool
		c, hit = c.Apply(o, 3)
		if hit {
			fired++
		}
	}
	if fired != 1 {
		t.Fatalf("threshold fired %d times, want exactly 1", fired)
	}
	if c.ConsecutiveEmpty != 5 {
		t.Fatalf("an Error must not reset the empty run: got %d", c.ConsecutiveEmpty)
	}
	c, _ = c.Apply(DuplicateOnly, 3)
	if c.ConsecutiveEmpty != 0 {
		t.Fatal("DuplicateOnly resets the empty run")
	}
}

func TestPlanHysteresis(t *testing.T) {
	lim := PoolLimits{Minimum: 5, Target: 10, MaxSize: 12}
	cases := []struct {
		name       string
		inv        Inventory
		refilling  bool
		want       int
		wantRefill bool
	}{
		{"above minimum idle", Inventory{Available: 6, Managed: 6}, false, 0, false},
		{"below minimum starts", Inventory{Available: 4, Managed: 4}, false, 6, true},
		{"refill continues above minimum", Inventory{Available: 7, Managed: 7}, true, 3, true},
		{"pending counts", Inventory{Available: 2, Pending: 2, Managed: 4}, false, 6, true},
		{"target reached stops", Inventory{Available: 10, Managed: 10}, true, 0, false},
		{"maxSize caps", Inventory{Available: 1, Managed: 10}, false, 2, true},
		{"maxSize full", Inventory{Available: 1, Managed: 12}, false, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, r := Plan(tc.inv, lim, tc.refilling)
			if got != tc.want || r != tc.wantRefill {
				t.Fatalf("Plan = %d,%v want %d,%v", got, r, tc.want, tc.wantRefill)
			}
		})
	}
}
