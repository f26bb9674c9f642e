package health

import (
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

func TestReduceTable(t *testing.T) {
	ok := checker.Observation{Success: true}
	fail := checker.Observation{Success: false, Phase: checker.PhaseDial}
	pol := Policy{FailureThreshold: 3}
	type tc struct {
		name      string
		state     proxy.State
		fails     int
		obs       checker.Observation
		wantState proxy.State
		wantFails int
	}
	cases := []tc{
		{"checking success", proxy.StateChecking, 0, ok, proxy.StateAvailable, 0},
		{"checking success after retries", proxy.StateChecking, 2, ok, proxy.StateAvailable, 0},
		{"checking first failure retries", proxy.StateChecking, 0, fail, proxy.StateChecking, 1},
		{"checking second failure retries", proxy.StateChecking, 1, fail, proxy.StateChecking, 2},
		{"checking exhausted", proxy.StateChecking, 2, fail, proxy.StateUnhealthy, 3},
		{"available success", proxy.StateAvailable, 0, ok, proxy.StateAvailable, 0},
		{"available failure suspect", proxy.StateAvailable, 0, fail, proxy.StateSuspect, 1},
		{"suspect success recovers", proxy.StateSuspect, 2, ok, proxy.StateAvailable, 0},
		{"suspect failure stays", proxy.StateSuspect, 1, fail, proxy.StateSuspect, 2},
		{"suspect threshold unhealthy", proxy.StateSuspect, 2, fail, proxy.StateUnhealthy, 3},
	}
	// States health does not govern ignore observations of either outcome.
	for _, s := range []proxy.State{proxy.StateFetched, proxy.StateUnhealthy, proxy.StateDraining, proxy.StateExtracted, proxy.StateExpired, proxy.StateRemoved} {
		cases = append(cases,
			tc{s.String() + " success ignored", s, 1, ok, s, 1},
			tc{s.String() + " failure ignored", s, 1, fail, s, 1},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, fails := Reduce(c.state, c.fails, c.obs, pol)
			if got != c.wantState || fails != c.wantFails {
				t.Fatalf("Reduce(%s,%d,%v) = %s,%d want %s,%d", c.state, c.fails, c.obs.Success, got, fails, c.wantState, c.wantFails)
			}
			if got != c.state {
				if err := proxy.Transition(c.state, got); err != nil {
					t.Fatalf("reducer decided a transition the state machine refuses: %v", err)
				}
			}
		})
	}
}

func TestReduceEveryStateOutcome(t *testing.T) {
	// Totality: every state x outcome yields a state the machine allows.
	for _, s := range proxy.States() {
		for _, success := range []bool{true, false} {
			for _, th := range []int{0, 1, 3} {
				got, _ := Reduce(s, 0, checker.Observation{Success: success}, Policy{FailureThreshold: th})
				if got != s {
					if err := proxy.Transition(s, got); err != nil {
						t.Errorf("%s success=%v threshold=%d: %v", s, success, th, err)
					}
				}
			}
		}
	}
}

func TestReduceThresholdOne(t *testing.T) {
	pol := Policy{FailureThreshold: 1}
	fail := checker.Observation{}
	if s, _ := Reduce(proxy.StateChecking, 0, fail, pol); s != proxy.StateUnhealthy {
		t.Fatalf("threshold 1: CHECKING failure = %s, want UNHEALTHY", s)
	}
	// A first failure of an AVAILABLE proxy is never removal.
	s, n := Reduce(proxy.StateAvailable, 0, fail, pol)
	if s != proxy.StateSuspect {
		t.Fatalf("AVAILABLE failure = %s, want SUSPECT", s)
	}
	if s, _ = Reduce(s, n, fail, pol); s != proxy.StateUnhealthy {
		t.Fatalf("SUSPECT failure at threshold 1 = %s, want UNHEALTHY", s)
	}
}

func TestNextRecheckJitter(t *testing.T) {
	last := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	interval := 30 * time.Second
	seen := map[time.Duration]bool{}
	for i := range 200 {
		id := proxy.ID("http://10.0.0.1:" + string(rune('a'+i%26)) + string(rune('a'+i/26)))
		d := NextRecheck(id, last, interval).Sub(last)
		if d < 27*time.Second || d > 33*time.Second {
			t.Fatalf("recheck of %s after %s, outside interval ±10%%", id, d)
		}
		if NextRecheck(id, last, interval) != last.Add(d) {
			t.Fatal("jitter is not stable for one proxy")
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Fatalf("jitter spreads 200 proxies over only %d offsets", len(seen))
	}
}

func TestReduceEgressAnonymityPolicy(t *testing.T) {
	egress := func(leaked bool, headers ...string) checker.Observation {
		return checker.Observation{Level: checker.LevelEgress, Success: true, AddressLeaked: leaked, ProxyHeaders: headers}
	}
	elite, anon, transparent := egress(false), egress(false, "Via"), egress(true, "X-Forwarded-For")
	failed := checker.Observation{Level: checker.LevelEgress, Phase: checker.PhaseEcho}
	cases := []struct {
		name    string
		obs     checker.Observation
		require Anonymity
		want    proxy.State
	}{
		{"elite meets elite", elite, Elite, proxy.StateAvailable},
		{"anonymous fails elite", anon, Elite, proxy.StateChecking},
		{"anonymous meets default", anon, 0, proxy.StateAvailable},
		{"transparent fails default", transparent, 0, proxy.StateChecking},
		{"transparent fails anonymous", transparent, Anonymous, proxy.StateChecking},
		{"transparent accepted when allowed", transparent, Transparent, proxy.StateAvailable},
		{"failed check never passes", failed, Transparent, proxy.StateChecking},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, _ := Reduce(proxy.StateChecking, 0, c.obs, Policy{FailureThreshold: 3, Anonymity: c.require})
			if got != c.want {
				t.Fatalf("Reduce = %s, want %s", got, c.want)
			}
		})
	}
	for _, c := range []struct {
		obs  checker.Observation
		want Anonymity
	}{{elite, Elite}, {anon, Anonymous}, {transparent, Transparent}} {
		if g := Grade(c.obs); g != c.want {
			t.Errorf("Grade(%+v) = %s, want %s", c.obs, g, c.want)
		}
	}
	for s, want := range map[string]Anonymity{"elite": Elite, "transparent": Transparent, "anonymous": Anonymous, "": Anonymous} {
		if got := ParseAnonymity(s); got != want {
			t.Errorf("ParseAnonymity(%q) = %s", s, got)
		}
	}
}

func TestReduceTargetAffectsOnlyTheRouting(t *testing.T) {
	at := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	fail := checker.Observation{Level: checker.LevelTarget, Routing: "shop", Phase: checker.PhaseStatus, Status: 403, At: at}
	ok := checker.Observation{Level: checker.LevelTarget, Routing: "shop", Success: true, At: at}
	pol := Policy{FailureThreshold: 2}
	// The proxy's own state never moves on a TARGET observation.
	for _, s := range proxy.States() {
		if got, n := Reduce(s, 1, fail, pol); got != s || n != 1 {
			t.Fatalf("TARGET failure moved %s to %s", s, got)
		}
	}
	cases := []struct {
		name string
		prev TargetHealth
		obs  checker.Observation
		want TargetHealth
	}{
		{"first failure counts", TargetHealth{}, fail, TargetHealth{Fails: 1, CheckedAt: at}},
		{"threshold excludes", TargetHealth{Fails: 1}, fail, TargetHealth{Fails: 2, Excluded: true, CheckedAt: at}},
		{"stays excluded", TargetHealth{Fails: 2, Excluded: true}, fail, TargetHealth{Fails: 3, Excluded: true, CheckedAt: at}},
		{"a pass readmits", TargetHealth{Fails: 5, Excluded: true}, ok, TargetHealth{CheckedAt: at}},
		{"other levels ignored", TargetHealth{Fails: 1}, checker.Observation{Level: checker.LevelBasic}, TargetHealth{Fails: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := ReduceTarget(c.prev, c.obs, pol); got != c.want {
				t.Fatalf("ReduceTarget = %+v, want %+v", got, c.want)
			}
		})
	}
}
