package snapshot_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
)

var t0 = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func clock() func() time.Time { return func() time.Time { return t0 } }

func mk(upstream string, i int) proxy.Proxy {
	return gwtest.MakeProxy(upstream, "10.0."+strconv.Itoa(i/250)+"."+strconv.Itoa(i%250+1), 8000, "u", "p", t0)
}

func ids(rs []worker.Runtime) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s a=%d r=%d d=%v", r.ID, r.Active, r.Reserved, r.Draining))
	}
	return out
}

func TestCountersSurviveSwapAndDrain(t *testing.T) {
	reg := snapshot.NewRegistry(10, clock())
	a, b := mk("up", 1), mk("up", 2)
	s1, err := snapshot.Build(gwtest.Snapshot(1, t0, a, b), reg)
	if err != nil {
		t.Fatal(err)
	}
	ca := s1.Rules()[0].Candidates()
	if len(ca) != 2 {
		t.Fatalf("candidates = %d, want 2", len(ca))
	}
	var counterA *snapshot.Counter
	for i := range ca {
		if ca[i].Target().ID == a.ID {
			counterA = ca[i].Counter()
		}
	}
	if !counterA.TryReserve(1) || counterA.TryReserve(1) {
		t.Fatal("reservation against limit 1 misbehaved")
	}
	counterA.Commit()

	// v2 drops a: its counter must carry on and be reported as draining.
	if _, err := snapshot.Build(gwtest.Snapshot(2, t0, b), reg); err != nil {
		t.Fatal(err)
	}
	got := reg.Runtime()
	if len(got) != 1 || got[0].ID != a.ID || got[0].Active != 1 || !got[0].Draining {
		t.Fatalf("runtime after removal = %v", ids(got))
	}
	// Still in use: a later build keeps it.
	if _, err := snapshot.Build(gwtest.Snapshot(3, t0, b), reg); err != nil {
		t.Fatal(err)
	}
	if reg.Counter(a.ID) == nil {
		t.Fatal("counter of a draining proxy in use was reclaimed")
	}
	counterA.ReleaseActive()
	if got := reg.Runtime(); len(got) != 0 {
		t.Fatalf("runtime not sparse: %v", ids(got))
	}
	// Idle and absent: the next build reclaims it, and the stale pointer
	// can never reserve again.
	if _, err := snapshot.Build(gwtest.Snapshot(4, t0, b), reg); err != nil {
		t.Fatal(err)
	}
	if reg.Counter(a.ID) != nil || reg.Len() != 1 {
		t.Fatalf("counter not reclaimed: len=%d", reg.Len())
	}
	if counterA.TryReserve(100) {
		t.Fatal("reserved on a reclaimed counter")
	}
	// a comes back: fresh counter, counts continue from zero.
	s5, err := snapshot.Build(gwtest.Snapshot(5, t0, a, b), reg)
	if err != nil {
		t.Fatal(err)
	}
	if s5.Allocatable != 2 || reg.Counter(a.ID) == counterA {
		t.Fatalf("returning proxy: allocatable=%d, same counter=%v", s5.Allocatable, reg.Counter(a.ID) == counterA)
	}
}

func TestCounterCarriesOverWhenProxyStays(t *testing.T) {
	reg := snapshot.NewRegistry(10, clock())
	a := mk("up", 1)
	s1, _ := snapshot.Build(gwtest.Snapshot(1, t0, a), reg)
	c1 := s1.Rules()[0].Candidates()[0].Counter()
	c1.TryReserve(10)
	s2, err := snapshot.Build(gwtest.Snapshot(2, t0, a), reg)
	if err != nil {
		t.Fatal(err)
	}
	if c2 := s2.Rules()[0].Candidates()[0].Counter(); c2 != c1 {
		t.Fatal("counter not carried over the swap")
	}
	rt := reg.Runtime()
	if len(rt) != 1 || rt[0].Reserved != 1 || rt[0].Draining {
		t.Fatalf("runtime = %v", ids(rt))
	}
}

func TestRegistryBound(t *testing.T) {
	reg := snapshot.NewRegistry(3, clock())
	ps := []proxy.Proxy{mk("up", 1), mk("up", 2), mk("up", 3)}
	if _, err := snapshot.Build(gwtest.Snapshot(1, t0, ps...), reg); err != nil {
		t.Fatal(err)
	}
	// Holding a's count keeps it draining; adding two new ones exceeds 3.
	reg.Counter(ps[0].ID).TryReserve(10)
	_, err := snapshot.Build(gwtest.Snapshot(2, t0, ps[1], ps[2], mk("up", 4)), reg)
	var be *snapshot.BoundError
	if !errors.As(err, &be) || be.Max != 3 {
		t.Fatalf("err = %v, want BoundError", err)
	}
	// A refused build changes nothing.
	if reg.Len() != 3 || reg.Counter(mk("up", 4).ID) != nil {
		t.Fatalf("registry changed by a refused build: len=%d", reg.Len())
	}
	rt := reg.Runtime()
	if len(rt) != 1 || rt[0].Draining {
		t.Fatalf("liveness changed by a refused build: %v", ids(rt))
	}
}

func TestBuildRejects(t *testing.T) {
	reg := snapshot.NewRegistry(10, clock())
	a := mk("up", 1)
	tests := []struct {
		name string
		ws   *worker.Snapshot
	}{
		{"nil", nil},
		{"duplicate id", gwtest.Snapshot(1, t0, a, a)},
		{"empty id", gwtest.Snapshot(1, t0, proxy.Proxy{Upstream: "up", State: proxy.StateAvailable})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := snapshot.Build(tc.ws, reg); err == nil {
				t.Fatal("build accepted")
			}
			if reg.Len() != 0 {
				t.Fatalf("registry holds %d entries after a refused build", reg.Len())
			}
		})
	}
}

func TestCandidates(t *testing.T) {
	p := func(up string, i int, mut func(*proxy.Proxy)) proxy.Proxy {
		x := mk(up, i)
		if mut != nil {
			mut(&x)
		}
		return x
	}
	proxies := []proxy.Proxy{
		p("a", 1, func(x *proxy.Proxy) { x.Tags = map[string]string{"tier": "gold"} }),
		p("a", 2, nil),
		p("b", 3, func(x *proxy.Proxy) { x.Region = "eu" }),
		p("b", 4, func(x *proxy.Proxy) { x.State = proxy.StateSuspect }),
		p("b", 5, func(x *proxy.Proxy) { x.UsableUntil = t0.Add(-time.Second) }),
		p("c", 6, func(x *proxy.Proxy) { x.Key.Scheme = proxy.SchemeSOCKS5 }),
		p("c", 7, nil),
	}
	tests := []struct {
		name      string
		rule      routing.Rule
		cursors   map[string]int
		disabled  map[string]bool
		want      int
		exhausted bool
		disabledF bool
	}{
		{name: "least connections over two", rule: routing.Rule{Upstreams: []string{"a", "b"}}, want: 3},
		{name: "duplicate upstream counted once", rule: routing.Rule{Upstreams: []string{"a", "a"}}, want: 2},
		{name: "tags", rule: routing.Rule{Upstreams: []string{"a", "b"}, Tags: map[string]string{"tier": "gold"}}, want: 1},
		{name: "region field as tag", rule: routing.Rule{Upstreams: []string{"a", "b"}, Tags: map[string]string{"region": "eu"}}, want: 1},
		{name: "disabled upstream skipped", rule: routing.Rule{Upstreams: []string{"a", "b"}}, disabled: map[string]bool{"a": true}, want: 1},
		{name: "all disabled", rule: routing.Rule{Upstreams: []string{"a"}}, disabled: map[string]bool{"a": true}, disabledF: true},
		{name: "only http AVAILABLE usable", rule: routing.Rule{Upstreams: []string{"c"}}, want: 1},
		{name: "sequential default cursor", rule: routing.Rule{Strategy: routing.Sequential, Upstreams: []string{"a", "b"}}, want: 2},
		{name: "sequential cursor 1", rule: routing.Rule{Strategy: routing.Sequential, Upstreams: []string{"a", "b"}}, cursors: map[string]int{"r": 1}, want: 1},
		{name: "sequential exhausted", rule: routing.Rule{Strategy: routing.Sequential, Upstreams: []string{"a", "b"}}, cursors: map[string]int{"r": -1}, exhausted: true},
		{name: "sequential cursor disabled", rule: routing.Rule{Strategy: routing.Sequential, Upstreams: []string{"a", "b"}}, disabled: map[string]bool{"a": true}, disabledF: true},
		{name: "unknown upstream", rule: routing.Rule{Upstreams: []string{"zz"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.rule.Name = "r"
			ws := &worker.Snapshot{Version: 1, ValidUntil: t0.Add(time.Hour), Routings: []routing.Rule{tc.rule},
				Cursors: tc.cursors, Disabled: tc.disabled, Proxies: proxies}
			s, err := snapshot.Build(ws, snapshot.NewRegistry(0, clock()))
			if err != nil {
				t.Fatal(err)
			}
			r := &s.Rules()[0]
			if got := len(r.Candidates()); got != tc.want || r.Exhausted != tc.exhausted || r.Disabled != tc.disabledF {
				t.Fatalf("candidates=%d exhausted=%v disabled=%v, want %d %v %v", got, r.Exhausted, r.Disabled, tc.want, tc.exhausted, tc.disabledF)
			}
		})
	}
}

func TestStale(t *testing.T) {
	reg := snapshot.NewRegistry(0, clock())
	ws := gwtest.Snapshot(1, t0)
	ws.ValidUntil = t0.Add(time.Minute)
	s, err := snapshot.Build(ws, reg)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		at     time.Duration
		maxAge time.Duration
		stale  bool
	}{
		{"fresh", 10 * time.Second, 0, false},
		{"valid until reached", time.Minute, 0, true},
		{"max stale age passed", 31 * time.Second, 30 * time.Second, true},
		{"within max stale age", 29 * time.Second, 30 * time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.Stale(t0.Add(tc.at).UnixNano(), tc.maxAge); got != tc.stale {
				t.Fatalf("stale = %v", got)
			}
		})
	}
}

func TestTargetCredentials(t *testing.T) {
	reg := snapshot.NewRegistry(0, clock())
	a := gwtest.MakeProxy("up", "127.0.0.1", 3128, "alice", "s3cret", t0)
	s, _ := snapshot.Build(gwtest.Snapshot(1, t0, a), reg)
	tg := s.Rules()[0].Candidates()[0].Target()
	if tg.ProxyAuthorization != "Basic YWxpY2U6czNjcmV0" || tg.Addr != "127.0.0.1:3128" {
		t.Fatalf("target = %+v", tg)
	}
	if v := tg.LogValue().String(); v != string(a.ID) {
		t.Fatalf("log value %q leaks more than the id", v)
	}
	// Rebuilding reuses the target: no per-build credential formatting.
	s2, _ := snapshot.Build(gwtest.Snapshot(2, t0, a), reg)
	if s2.Rules()[0].Candidates()[0].Target() != tg {
		t.Fatal("target not reused")
	}
}

// A routing's exclusions (its target check failed through those proxies)
// remove them from that routing only.
func TestRoutingExclusions(t *testing.T) {
	reg := snapshot.NewRegistry(10, clock())
	a, b := mk("up", 1), mk("up", 2)
	ws := gwtest.Snapshot(1, t0, a, b)
	ws.Routings = append(ws.Routings, routing.Rule{Name: "shop", Hosts: []string{"shop.example"}, Upstreams: []string{"up"}, MaxAttempts: 2})
	ws.Routings[0], ws.Routings[1] = ws.Routings[1], ws.Routings[0]
	ws.RoutingExclusions = map[string][]proxy.ID{"shop": {a.ID}}
	s, err := snapshot.Build(ws, reg)
	if err != nil {
		t.Fatal(err)
	}
	shop, def := s.Rules()[0].Candidates(), s.Rules()[1].Candidates()
	if len(shop) != 1 || shop[0].Target().ID != b.ID {
		t.Fatalf("shop candidates = %d", len(shop))
	}
	if len(def) != 2 {
		t.Fatalf("default candidates = %d, want both", len(def))
	}
}
