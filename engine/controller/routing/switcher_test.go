package routing

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

func openStore(t *testing.T, dir string) *embedded.Management {
	t.Helper()
	m, err := embedded.OpenManagement(dir, embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func seqRouting(name, exhausted string, ups ...string) config.Routing {
	return config.Routing{Name: name, Strategy: "sequential", OnExhausted: exhausted, OnUnavailable: "reject", Upstreams: ups}
}

func TestDepletedConcurrentSwitchesOnce(t *testing.T) {
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	s := New(Options{Store: store})
	s.SetRules(Compile([]config.Routing{
		seqRouting("r1", "stop", "A", "B", "C"),
		seqRouting("r2", "loop", "X", "A", "B"), // A is not current here
		{Name: "lc", Strategy: "leastConnections", Upstreams: []string{"A", "B"}},
	}))
	ctx := context.Background()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		moved int
	)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := s.Depleted(ctx, "A")
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			moved += len(m)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if moved != 1 {
		t.Fatalf("32 concurrent depletions moved %d routings, want exactly 1", moved)
	}
	c, err := s.Cursor(ctx, "r1")
	if err != nil {
		t.Fatal(err)
	}
	if c.Index != 1 || c.Generation != 1 || c.Exhausted {
		t.Fatalf("r1 cursor = %+v, want index 1 (B), generation 1", c)
	}
	if c2, _ := s.Cursor(ctx, "r2"); c2.Generation != 0 {
		t.Fatalf("r2 moved although A was not its current upstream: %+v", c2)
	}
}

func TestDepletedPolicies(t *testing.T) {
	cases := []struct {
		name      string
		routing   config.Routing
		start     routing.Cursor
		depleted  string
		disabled  map[string]bool
		wantIndex int // Effective index after
		wantMoved bool
	}{
		{"advance to next", seqRouting("r", "stop", "A", "B"), routing.Cursor{}, "A", nil, 1, true},
		{"stop exhausts after last", seqRouting("r", "stop", "A", "B"), routing.Cursor{Index: 1, Generation: 1}, "B", nil, -1, true},
		{"loop wraps", seqRouting("r", "loop", "A", "B", "C"), routing.Cursor{Index: 2, Generation: 4}, "C", nil, 0, true},
		{"stayLast keeps last", seqRouting("r", "stayLast", "A", "B"), routing.Cursor{Index: 1, Generation: 1}, "B", nil, 1, false},
		{"disabled skipped", seqRouting("r", "stop", "A", "B", "C"), routing.Cursor{}, "A", map[string]bool{"B": true}, 2, true},
		{"all later disabled stop", seqRouting("r", "stop", "A", "B"), routing.Cursor{}, "A", map[string]bool{"B": true}, -1, true},
		{"not current", seqRouting("r", "stop", "A", "B"), routing.Cursor{}, "B", nil, 0, false},
		{"exhausted stays", seqRouting("r", "loop", "A", "B"), routing.Cursor{Generation: 3, Exhausted: true}, "A", nil, -1, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			store := openStore(t, t.TempDir())
			t.Cleanup(func() { _ = store.Close() })
			ctx := context.Background()
			if tc.start != (routing.Cursor{}) {
				if ok, err := store.CompareAndSetCursor(ctx, "r", routing.Cursor{}, tc.start); err != nil || !ok {
					t.Fatalf("seeding cursor: %v %v", ok, err)
				}
			}
			s := New(Options{Store: store, Enabled: func(u string) bool { return !tc.disabled[u] }})
			s.SetRules(Compile([]config.Routing{tc.routing}))
			moved, err := s.Depleted(ctx, tc.depleted)
			if err != nil {
				t.Fatal(err)
			}
			if (len(moved) == 1) != tc.wantMoved {
				t.Fatalf("moved = %v, want moved %v", moved, tc.wantMoved)
			}
			c, _ := s.Cursor(ctx, "r")
			if got := Effective(c, len(tc.routing.Upstreams)); got != tc.wantIndex {
				t.Fatalf("effective index = %d (%+v), want %d", got, c, tc.wantIndex)
			}
			// A repeated signal for the same upstream never moves twice.
			if again, _ := s.Depleted(ctx, tc.depleted); tc.wantMoved && len(again) > 0 && tc.routing.OnExhausted != "loop" {
				t.Fatalf("second depletion moved again: %v", again)
			}
		})
	}
}

func TestManualSwitchAndPersistence(t *testing.T) {
	dir := t.TempDir()
	store := openStore(t, dir)
	rules := Compile([]config.Routing{seqRouting("r", "stop", "A", "B", "C"), {Name: "lc", Strategy: "leastConnections", Upstreams: []string{"A"}}})
	s := New(Options{Store: store})
	s.SetRules(rules)
	ctx := context.Background()
	c, err := s.Switch(ctx, "r", 2)
	if err != nil || c.Index != 2 || c.Generation != 1 {
		t.Fatalf("switch = %+v, %v", c, err)
	}
	for _, tc := range []struct {
		name    string
		routing string
		index   int
		want    error
	}{
		{"unknown", "nope", 0, ErrUnknownRouting},
		{"not sequential", "lc", 0, ErrInvalidSwitch},
		{"negative", "r", -1, ErrInvalidSwitch},
		{"too large", "r", 3, ErrInvalidSwitch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := s.Switch(ctx, tc.routing, tc.index); !errors.Is(err, tc.want) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	// Cursors live in the management store: a restart keeps them.
	store2 := openStore(t, dir)
	t.Cleanup(func() { _ = store2.Close() })
	s2 := New(Options{Store: store2})
	s2.SetRules(rules)
	if c, err := s2.Cursor(ctx, "r"); err != nil || c.Index != 2 || c.Generation != 1 {
		t.Fatalf("after restart cursor = %+v, %v", c, err)
	}
}

func TestCompile(t *testing.T) {
	rules := Compile([]config.Routing{
		{Name: "a", Strategy: "sequential", OnExhausted: "stayLast", OnUnavailable: "wait", Upstreams: []string{"x", "y"},
			Match: config.Match{Hosts: []string{"Example.COM.", "*.b.org"}, Ports: []int{443}, Clients: []string{"c1"}},
			Tags:  config.StringMap{"k": "v"}, Sticky: config.Sticky{Header: "X-Session"}, Retry: config.Retry{MaxAttempts: 2}},
		{Name: "b", Strategy: "leastConnections", OnUnavailable: "direct", Upstreams: []string{"x"}},
	})
	a, b := rules[0], rules[1]
	if a.Strategy != routing.Sequential || a.OnExhausted != routing.StayLast || a.OnUnavailable != routing.Wait {
		t.Fatalf("rule a = %+v", a)
	}
	if a.Hosts[0] != "example.com" || a.Hosts[1] != "*.b.org" || a.Ports[0] != 443 || a.Tags["k"] != "v" || a.StickyHeader != "X-Session" || a.MaxAttempts != 2 {
		t.Fatalf("rule a = %+v", a)
	}
	if b.Strategy != routing.LeastConnections || b.OnUnavailable != routing.Direct || b.OnExhausted != routing.Stop {
		t.Fatalf("rule b = %+v", b)
	}
	if i := routing.First(rules, &routing.Request{Host: "example.com", Port: 443, Client: "c1"}); i != 0 {
		t.Fatalf("first = %d", i)
	}
}

func TestEffective(t *testing.T) {
	for _, tc := range []struct {
		c    routing.Cursor
		n    int
		want int
	}{
		{routing.Cursor{}, 2, 0},
		{routing.Cursor{Index: 1}, 2, 1},
		{routing.Cursor{Index: 5}, 2, 0},
		{routing.Cursor{Exhausted: true}, 2, -1},
	} {
		if got := Effective(tc.c, tc.n); got != tc.want {
			t.Errorf("Effective(%+v, %d) = %d, want %d", tc.c, tc.n, got, tc.want)
		}
	}
}

func TestDisabledCurrentUpstreamIsSkipped(t *testing.T) {
	store := openStore(t, t.TempDir())
	t.Cleanup(func() { _ = store.Close() })
	disabled := map[string]bool{}
	var mu sync.Mutex
	s := New(Options{Store: store, Enabled: func(u string) bool { mu.Lock(); defer mu.Unlock(); return !disabled[u] }})
	s.SetRules(Compile([]config.Routing{seqRouting("r", "stop", "A", "B", "C"), seqRouting("other", "stop", "X", "A")}))
	ctx := context.Background()
	if moved, err := s.Disabled(ctx, "A"); err != nil || len(moved) != 0 {
		t.Fatalf("an enabled upstream moved routings: %v %v", moved, err)
	}
	mu.Lock()
	disabled["A"], disabled["B"] = true, true
	mu.Unlock()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Disabled(ctx, "A"); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	c, _ := s.Cursor(ctx, "r")
	if got := Effective(c, 3); got != 2 || c.Generation != 1 {
		t.Fatalf("cursor = %+v, want C (index 2, B skipped) in one move", c)
	}
	if c, _ := s.Cursor(ctx, "other"); c.Generation != 0 {
		t.Fatalf("a routing not currently on A moved: %+v", c)
	}
	// Disabling the last one never exhausts the routing.
	mu.Lock()
	disabled["C"] = true
	mu.Unlock()
	if moved, err := s.Disabled(ctx, "C"); err != nil || len(moved) != 0 {
		t.Fatalf("disabling the last upstream moved %v (%v)", moved, err)
	}
	if c, _ := s.Cursor(ctx, "r"); c.Exhausted || c.Index != 2 {
		t.Fatalf("cursor = %+v, want still on C", c)
	}
}
