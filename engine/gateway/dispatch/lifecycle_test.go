package dispatch_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
	"github.com/proxypool/proxypool/engine/gateway/dispatch"
	"github.com/proxypool/proxypool/engine/gateway/internal/gwtest"
	"github.com/proxypool/proxypool/engine/gateway/snapshot"
	"github.com/proxypool/proxypool/engine/gateway/sticky"
)

// A Release through a handle whose slot was already recycled into another
// request must not touch that request's reservation.
func TestStaleHandleDetected(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector; slot reuse cannot be forced")
	}
	e := newEnv(t, gwtest.Snapshot(1, t0, px("a", 1)), 0)
	ctx := context.Background()
	first, err := e.d.Acquire(ctx, &dispatch.Request{})
	if err != nil {
		t.Fatal(err)
	}
	e.d.Release(first, worker.Outcome{})
	// The pool hands the same slot to the next request (same P, no GC).
	second, err := e.d.Acquire(ctx, &dispatch.Request{})
	if err != nil {
		t.Fatal(err)
	}
	before := gwtest.Metric(t, e.prom, "proxypool_gateway_release_errors_total")
	e.d.Release(first, worker.Outcome{}) // stale: must not release "second"
	if err := e.d.Commit(first); !errors.Is(err, dispatch.ErrAllocationState) {
		t.Fatalf("commit through a stale handle: %v", err)
	}
	if got := gwtest.Metric(t, e.prom, "proxypool_gateway_release_errors_total") - before; got != 1 {
		t.Fatalf("stale release counted %v times, want 1", got)
	}
	if act, res := e.reg.Counter(px("a", 1).ID).Counts(); act != 0 || res != 1 {
		t.Fatalf("stale release touched the live reservation: active %d reserved %d", act, res)
	}
	if err := e.d.Commit(second); err != nil {
		t.Fatalf("live allocation broken by the stale release: %v", err)
	}
	e.d.Release(second, worker.Outcome{Success: true})
	if act, res := e.reg.Counter(px("a", 1).ID).Counts(); act != 0 || res != 0 {
		t.Fatalf("after release: active %d reserved %d", act, res)
	}
	allocs := testing.AllocsPerRun(200, func() { e.d.Release(first, worker.Outcome{}) })
	if allocs != 0 {
		t.Fatalf("stale release allocates %.1f", allocs)
	}
}

// TestWithdrawalRacesAcquire races Acquire against Apply of a snapshot that
// drops the only proxy. Once Build returned and the counts read zero, no
// reservation may ever land on the withdrawn proxy, whichever snapshot a
// request loaded (exclusive extraction relies on it, seed 000 §10.3).
func TestWithdrawalRacesAcquire(t *testing.T) {
	for round := range 20 {
		kept, gone := px("a", 1), px("a", 2)
		e := newEnv(t, gwtest.Snapshot(1, t0, kept, gone), 0)
		c := e.reg.Counter(gone.ID)
		var stop atomic.Bool
		var late atomic.Int64 // reservations on "gone" after the withdrawal was observed idle
		var idleSeen atomic.Bool
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					a, err := e.d.Acquire(context.Background(), &dispatch.Request{})
					if err != nil {
						continue
					}
					if a.Target.ID == gone.ID && idleSeen.Load() {
						late.Add(1)
					}
					e.d.Release(a, worker.Outcome{})
				}
			}()
		}
		s2, err := snapshot.Build(gwtest.Snapshot(2, t0, kept), e.reg)
		if err != nil {
			t.Fatal(err)
		}
		e.snaps.Store(s2)
		// What the controller does: wait for zero, then rely on it.
		gwtest.Eventually(t, "withdrawn proxy idle", func() bool {
			a, r := c.Counts()
			return a == 0 && r == 0
		})
		idleSeen.Store(true)
		for range 2000 {
			if a, r := c.Counts(); a != 0 || r != 0 {
				t.Fatalf("round %d: withdrawn proxy reserved again: active %d reserved %d", round, a, r)
			}
		}
		stop.Store(true)
		wg.Wait()
		if n := late.Load(); n != 0 {
			t.Fatalf("round %d: %d allocations on the withdrawn proxy after it went idle", round, n)
		}
		if !c.Withdrawn() {
			t.Fatal("counter of a dropped proxy not withdrawn")
		}
	}
}

type fixedLoader struct{ s *snapshot.Snapshot }

func (f fixedLoader) Load() *snapshot.Snapshot { return f.s }

// The deterministic core of the race: a request that loaded the old
// snapshot before Apply, and reserves after Apply returned.
func TestOldSnapshotCannotReserveWithdrawn(t *testing.T) {
	kept, gone := px("a", 1), px("a", 2)
	e := newEnv(t, gwtest.Snapshot(1, t0, kept, gone), 0)
	old := e.snaps.Load()
	s2, err := snapshot.Build(gwtest.Snapshot(2, t0, kept), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.snaps.Store(s2)
	late := dispatch.New(fixedLoader{old}, dispatch.Options{Now: e.clock.Now})
	for range 200 {
		a, err := late.Acquire(context.Background(), &dispatch.Request{})
		if err != nil {
			t.Fatal(err)
		}
		if a.Target.ID == gone.ID {
			t.Fatal("a request on the old snapshot reserved the withdrawn proxy")
		}
		late.Release(a, worker.Outcome{})
	}
	if rt := e.reg.Runtime(); len(rt) != 0 {
		t.Fatalf("runtime = %+v", rt)
	}
}

// A proxy that stays in the snapshot but stops being AVAILABLE (DRAINING
// for an extraction) is withdrawn the same way, and comes back when
// AVAILABLE again.
func TestWithdrawnByState(t *testing.T) {
	p := px("a", 1)
	e := newEnv(t, gwtest.Snapshot(1, t0, p), 0)
	old := e.snaps.Load()
	draining := p
	draining.State = proxy.StateDraining
	s2, err := snapshot.Build(gwtest.Snapshot(2, t0, draining), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.snaps.Store(s2)
	c := old.Rules()[0].Candidates()[0].Counter()
	if c.TryReserve(100) {
		t.Fatal("reserved through the old snapshot on a DRAINING proxy")
	}
	s3, err := snapshot.Build(gwtest.Snapshot(3, t0, p), e.reg)
	if err != nil {
		t.Fatal(err)
	}
	e.snaps.Store(s3)
	a, err := e.d.Acquire(context.Background(), &dispatch.Request{})
	if err != nil {
		t.Fatalf("AVAILABLE again but refused: %v", err)
	}
	e.d.Release(a, worker.Outcome{})
}

func stickySnapshot(t testing.TB, cache *sticky.Cache, proxies ...proxy.Proxy) (*snapshot.Snapshot, *snapshot.Registry) {
	ws := gwtest.Snapshot(1, t0, proxies...)
	ws.Routings[0].StickyHeader = "x-session"
	reg := snapshot.NewRegistry(0, func() time.Time { return t0 })
	s, err := snapshot.BuildWith(ws, reg, snapshot.Options{Settings: func(*routing.Rule) snapshot.RuleSettings {
		return snapshot.RuleSettings{Sessions: cache}
	}})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

func TestStickySessions(t *testing.T) {
	ctx := context.Background()
	var ps []proxy.Proxy
	for i := range 8 {
		ps = append(ps, px("a", i+1, func(p *proxy.Proxy) { p.UsableUntil = t0.Add(time.Duration(i+1) * time.Minute) }))
	}
	cache := sticky.New(100)
	s, _ := stickySnapshot(t, cache, ps...)
	e := newEnv(t, nil, 0)
	e.snaps.Store(s)
	hdr := func(id string) map[string][]string { return http.Header{"X-Session": {id}} }
	bound := func(session string) proxy.ID {
		id, _ := cache.Get("alice", session, e.clock.Now().UnixNano())
		return id
	}

	t.Run("binding written only after commit", func(t *testing.T) {
		a, err := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s1")})
		if err != nil {
			t.Fatal(err)
		}
		if bound("s1") != "" {
			t.Fatal("bound before commit")
		}
		if err := e.d.Commit(a); err != nil {
			t.Fatal(err)
		}
		if bound("s1") != a.Target.ID {
			t.Fatal("not bound after commit")
		}
		e.d.Release(a, worker.Outcome{Success: true})
	})
	t.Run("same session same proxy", func(t *testing.T) {
		want := bound("s1")
		for range 20 {
			a, err := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s1")})
			if err != nil {
				t.Fatal(err)
			}
			if a.Target.ID != want || !a.Sticky {
				t.Fatalf("session moved to %s (sticky %v), want %s", a.Target.ID, a.Sticky, want)
			}
			_ = e.d.Commit(a)
			e.d.Release(a, worker.Outcome{Success: true})
		}
	})
	t.Run("username convention and other clients", func(t *testing.T) {
		a, _ := e.d.Acquire(ctx, &dispatch.Request{Client: "bob", UserSession: "s1"})
		_ = e.d.Commit(a)
		e.d.Release(a, worker.Outcome{Success: true})
		if id, ok := cache.Get("bob", "s1", e.clock.Now().UnixNano()); !ok || id != a.Target.ID {
			t.Fatal("username-convention session not bound")
		}
	})
	t.Run("failure clears the binding", func(t *testing.T) {
		a, _ := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s2")})
		_ = e.d.Commit(a)
		e.d.Release(a, worker.Outcome{Success: true})
		b, _ := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s2")})
		e.d.Release(b, worker.Outcome{Phase: worker.PhaseDial})
		if bound("s2") != "" {
			t.Fatal("binding survived a failure")
		}
	})
	t.Run("binding never outlives usable_until", func(t *testing.T) {
		a, _ := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s3")})
		_ = e.d.Commit(a)
		e.d.Release(a, worker.Outcome{Success: true})
		var until time.Time
		for _, p := range ps {
			if p.ID == a.Target.ID {
				until = p.UsableUntil
			}
		}
		e.clock.ns.Store(until.UnixNano())
		if bound("s3") != "" {
			t.Fatal("binding outlived its proxy's usable_until")
		}
		e.clock.ns.Store(t0.UnixNano())
	})
	t.Run("stale binding rebinds", func(t *testing.T) {
		cache.Put("alice", "s4", "no-such-proxy", t0.Add(time.Hour).UnixNano(), t0.UnixNano())
		a, err := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s4")})
		if err != nil {
			t.Fatal(err)
		}
		if a.Sticky {
			t.Fatal("stale binding used")
		}
		if bound("s4") != "" {
			t.Fatal("stale binding not cleared")
		}
		_ = e.d.Commit(a)
		e.d.Release(a, worker.Outcome{Success: true})
		if bound("s4") != a.Target.ID {
			t.Fatal("new choice not bound")
		}
		if gwtest.Metric(t, e.prom, "proxypool_gateway_sticky_lookups_total", "result", "stale") == 0 {
			t.Fatal("stale lookup not counted")
		}
	})
	t.Run("full proxy rebinds", func(t *testing.T) {
		want := bound("s1")
		c := s.Rules()[0].Lookup(want).Counter()
		for c.TryReserve(32) {
		}
		defer func() {
			for range 32 {
				c.CancelReservation()
			}
		}()
		a, err := e.d.Acquire(ctx, &dispatch.Request{Client: "alice", Header: hdr("s1")})
		if err != nil {
			t.Fatal(err)
		}
		if a.Target.ID == want {
			t.Fatal("chose a full proxy")
		}
		e.d.Release(a, worker.Outcome{})
	})
}

// The sticky lookup on the hot path allocates nothing.
func TestStickyAcquireAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items under the race detector")
	}
	cache := sticky.New(1000)
	var ps []proxy.Proxy
	for i := range 100 {
		ps = append(ps, px("a", i+1))
	}
	s, _ := stickySnapshot(t, cache, ps...)
	e := newEnv(t, nil, 0)
	e.snaps.Store(s)
	req := dispatch.Request{Client: "alice", Header: http.Header{"X-Session": {"abc"}}}
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		a, err := e.d.Acquire(ctx, &req)
		if err != nil {
			t.Fatal(err)
		}
		_ = e.d.Commit(a)
		e.d.Release(a, worker.Outcome{Success: true})
	})
	if allocs != 0 {
		t.Fatalf("sticky Acquire+Commit+Release allocates %.1f", allocs)
	}
}

func TestRoutingGate(t *testing.T) {
	ws := gwtest.Snapshot(1, t0, px("a", 1), px("a", 2))
	reg := snapshot.NewRegistry(0, func() time.Time { return t0 })
	gate := snapshot.NewGate(2)
	s, err := snapshot.BuildWith(ws, reg, snapshot.Options{Settings: func(*routing.Rule) snapshot.RuleSettings {
		return snapshot.RuleSettings{Gate: gate}
	}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, nil, 0)
	e.snaps.Store(s)
	ctx := context.Background()
	a, _ := e.d.Acquire(ctx, &dispatch.Request{})
	b, _ := e.d.Acquire(ctx, &dispatch.Request{})
	_, err = e.d.Acquire(ctx, &dispatch.Request{})
	var nc *dispatch.NoCandidateError
	if !errors.As(err, &nc) || nc.Reason != dispatch.ReasonRoutingLimit {
		t.Fatalf("third request: %v, want routing_limit", err)
	}
	e.d.Release(a, worker.Outcome{})
	c, err := e.d.Acquire(ctx, &dispatch.Request{})
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	e.d.Release(b, worker.Outcome{})
	e.d.Release(c, worker.Outcome{})
	if gate.InFlight() != 0 {
		t.Fatalf("gate holds %d", gate.InFlight())
	}
}

// onUnavailable "wait": a parked request gets the slot a release frees (or
// a snapshot swap offers), or gives up at its wait timeout.
func TestWaitForCapacity(t *testing.T) {
	ws := gwtest.Snapshot(1, t0, px("a", 1, func(p *proxy.Proxy) { p.MaxConcurrency = 1 }))
	ws.Routings[0].OnUnavailable = routing.Wait
	build := func(ws *worker.Snapshot, reg *snapshot.Registry, wait time.Duration) *snapshot.Snapshot {
		s, err := snapshot.BuildWith(ws, reg, snapshot.Options{Settings: func(*routing.Rule) snapshot.RuleSettings {
			return snapshot.RuleSettings{WaitTimeout: wait}
		}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	e := newEnv(t, nil, 0)
	e.snaps.Store(build(ws, e.reg, time.Minute))
	ctx := context.Background()
	held, err := e.d.Acquire(ctx, &dispatch.Request{})
	if err != nil {
		t.Fatal(err)
	}
	// park starts an Acquire that must wait, and returns once it has been
	// refused for the nth time (it is parked); the channel gets its result.
	park := func(t *testing.T, nth float64) <-chan error {
		got := make(chan error, 1)
		go func() {
			a, err := e.d.Acquire(ctx, &dispatch.Request{})
			if err == nil {
				e.d.Release(a, worker.Outcome{})
			}
			got <- err
		}()
		gwtest.Eventually(t, "request parked", func() bool {
			return gwtest.Metric(t, e.prom, "proxypool_gateway_dispatch_failures_total", "reason", "busy") >= nth
		})
		return got
	}
	t.Run("woken by release", func(t *testing.T) {
		got := park(t, 1)
		e.d.Release(held, worker.Outcome{})
		if err := <-got; err != nil {
			t.Fatalf("parked request: %v", err)
		}
	})
	t.Run("woken by snapshot apply", func(t *testing.T) {
		held, _ = e.d.Acquire(ctx, &dispatch.Request{})
		defer e.d.Release(held, worker.Outcome{})
		got := park(t, 2)
		ws2 := gwtest.Snapshot(2, t0, ws.Proxies[0], px("a", 2))
		ws2.Routings[0].OnUnavailable = routing.Wait
		e.snaps.Store(build(ws2, e.reg, time.Minute))
		e.d.Wake()
		if err := <-got; err != nil {
			t.Fatalf("parked request: %v", err)
		}
	})
	t.Run("gives up at the wait timeout", func(t *testing.T) {
		e.snaps.Store(build(ws, e.reg, 50*time.Millisecond))
		full, _ := e.d.Acquire(ctx, &dispatch.Request{})
		defer e.d.Release(full, worker.Outcome{})
		if _, err := e.d.Acquire(ctx, &dispatch.Request{}); !errors.Is(err, dispatch.ErrNoCandidate) {
			t.Fatalf("err = %v", err)
		}
		if gwtest.Metric(t, e.prom, "proxypool_gateway_dispatch_waits_total", "result", "timeout") != 1 {
			t.Fatal("timeout not counted")
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		e.snaps.Store(build(ws, e.reg, time.Minute))
		full, _ := e.d.Acquire(ctx, &dispatch.Request{})
		defer e.d.Release(full, worker.Outcome{})
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := e.d.Acquire(cctx, &dispatch.Request{}); err == nil {
			t.Fatal("cancelled wait acquired")
		}
	})
}

var _ = strconv.Itoa
