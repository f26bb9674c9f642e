package pool

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// path is how a proxy reaches each state through the state machine.
var path = map[proxy.State][]proxy.State{
	proxy.StateFetched:   nil,
	proxy.StateChecking:  {proxy.StateChecking},
	proxy.StateAvailable: {proxy.StateChecking, proxy.StateAvailable},
	proxy.StateSuspect:   {proxy.StateChecking, proxy.StateAvailable, proxy.StateSuspect},
	proxy.StateUnhealthy: {proxy.StateChecking, proxy.StateUnhealthy},
	proxy.StateDraining:  {proxy.StateChecking, proxy.StateAvailable, proxy.StateDraining},
	proxy.StateExtracted: {proxy.StateChecking, proxy.StateAvailable, proxy.StateExtracted},
	proxy.StateExpired:   {proxy.StateChecking, proxy.StateAvailable, proxy.StateDraining, proxy.StateExpired},
}

type env struct {
	pool    *embedded.Pool
	w       *ctltest.Worker
	now     atomic.Pointer[time.Time]
	version atomic.Uint64
	known   map[string]bool
	mu      sync.Mutex
	drops   map[string]int
	l       *Lifecycle
	port    int
}

func newEnv(t *testing.T, maxPerTick int) *env {
	e := &env{pool: embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }}), w: ctltest.NewWorker(), known: map[string]bool{"a": true}, drops: map[string]int{}, port: 30000}
	e.setNow(t0)
	e.l = New(Options{
		Store:           e.pool,
		Workers:         func() []worker.RuntimeReader { return []worker.RuntimeReader{e.w} },
		SnapshotVersion: e.version.Load,
		Known:           func(u string) bool { return e.known[u] },
		OnDrop: func(u string) {
			e.mu.Lock()
			e.drops[u]++
			e.mu.Unlock()
		},
		Now:        func() time.Time { return *e.now.Load() },
		MaxPerTick: maxPerTick,
	})
	return e
}

func (e *env) setNow(t time.Time) { e.now.Store(&t) }

// add creates a proxy of upstream up in state st, usable for usable and
// hard-expiring 10s later.
func (e *env) add(t *testing.T, up string, st proxy.State, usable time.Duration) proxy.ID {
	t.Helper()
	e.port++
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "203.0.113.9", Port: uint16(e.port)}
	p := proxy.Proxy{
		ID: proxy.MakeID(key), Key: key, Upstream: up, CreatedAt: t0, State: proxy.StateFetched,
		UsableUntil: t0.Add(usable), ExpiresAt: t0.Add(usable + 10*time.Second), MaxConcurrency: 4,
	}
	ctx := context.Background()
	if _, err := e.pool.Admit(ctx, up, []proxy.Proxy{p}, 0); err != nil {
		t.Fatal(err)
	}
	from := proxy.StateFetched
	for _, to := range path[st] {
		if err := e.pool.Transition(ctx, p.ID, from, to, t0); err != nil {
			t.Fatal(err)
		}
		from = to
	}
	return p.ID
}

func (e *env) state(t *testing.T, id proxy.ID) proxy.State {
	t.Helper()
	p, err := e.pool.Get(context.Background(), id)
	if err != nil {
		return proxy.StateRemoved
	}
	return p.State
}

func (e *env) tick(t *testing.T) Result {
	t.Helper()
	r, err := e.l.Tick(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestLifecycleTransitions(t *testing.T) {
	cases := []struct {
		name     string
		up       string
		state    proxy.State
		usable   time.Duration
		advance  time.Duration
		want     proxy.State
		wantDrop bool
		via      proxy.State // a state passed through within the tick
	}{
		{"available still usable", "a", proxy.StateAvailable, time.Minute, 0, proxy.StateAvailable, false, 0},
		{"available past usable drains", "a", proxy.StateAvailable, time.Minute, time.Minute, proxy.StateDraining, true, 0},
		{"available of removed upstream drains", "gone", proxy.StateAvailable, time.Minute, 0, proxy.StateDraining, true, 0},
		{"checking past usable unhealthy", "a", proxy.StateChecking, time.Minute, 2 * time.Minute, proxy.StateRemoved, true, proxy.StateUnhealthy},
		{"fetched past usable unhealthy", "a", proxy.StateFetched, time.Minute, 2 * time.Minute, proxy.StateRemoved, true, proxy.StateUnhealthy},
		{"suspect of removed upstream unhealthy", "gone", proxy.StateSuspect, time.Minute, 0, proxy.StateRemoved, true, proxy.StateUnhealthy},
		{"checking in time stays", "a", proxy.StateChecking, time.Minute, 0, proxy.StateChecking, false, 0},
		{"extracted before expiry stays", "a", proxy.StateExtracted, time.Minute, time.Minute, proxy.StateExtracted, false, 0},
		{"extracted past expiry expires", "a", proxy.StateExtracted, time.Minute, time.Minute + 10*time.Second, proxy.StateRemoved, false, proxy.StateExpired},
		{"expired removed", "a", proxy.StateExpired, time.Minute, 0, proxy.StateRemoved, false, 0},
		{"unhealthy removed", "a", proxy.StateUnhealthy, time.Minute, 0, proxy.StateRemoved, false, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 0)
			id := e.add(t, tc.up, tc.state, tc.usable)
			e.setNow(t0.Add(tc.advance))
			e.tick(t)
			if got := e.state(t, id); got != tc.want {
				t.Fatalf("state = %s, want %s", got, tc.want)
			}
			e.mu.Lock()
			dropped := e.drops[tc.up] > 0
			e.mu.Unlock()
			if dropped != tc.wantDrop {
				t.Fatalf("provider signalled = %v, want %v", dropped, tc.wantDrop)
			}
			if tc.via != 0 {
				if n := testutil.ToFloat64(e.l.m.transitions.WithLabelValues(tc.via.String())); n != 1 {
					t.Fatalf("did not pass through %s", tc.via)
				}
			}
		})
	}
}

func TestDrainingWaitsForWorkersAndSnapshot(t *testing.T) {
	e := newEnv(t, 0)
	id := e.add(t, "a", proxy.StateAvailable, time.Minute)
	e.w.SetCounts(id, 1, 1)
	e.setNow(t0.Add(time.Minute))
	e.tick(t)
	if got := e.state(t, id); got != proxy.StateDraining {
		t.Fatalf("state = %s, want DRAINING", got)
	}
	e.tick(t)
	if got := e.state(t, id); got != proxy.StateDraining {
		t.Fatal("expired while a worker holds capacity")
	}
	e.w.SetCounts(id, 0, 0)
	e.tick(t)
	if got := e.state(t, id); got != proxy.StateDraining {
		t.Fatal("expired before a snapshot without it was applied")
	}
	e.version.Add(1) // the publisher applied a newer snapshot
	e.tick(t)
	// EXPIRED, then removed within the same pass.
	if got := e.state(t, id); got != proxy.StateRemoved {
		t.Fatalf("state = %s, want EXPIRED and removed once idle and fenced", got)
	}
}

func TestDrainingPastHardExpiryExpiresEvenIfBusy(t *testing.T) {
	e := newEnv(t, 0)
	id := e.add(t, "a", proxy.StateDraining, time.Minute)
	e.w.SetCounts(id, 3, 0)
	e.setNow(t0.Add(time.Minute + 10*time.Second))
	e.tick(t)
	if got := e.state(t, id); got != proxy.StateRemoved {
		t.Fatalf("state = %s, want EXPIRED and removed: the vendor cut it", got)
	}
}

func TestTickWorkIsBounded(t *testing.T) {
	e := newEnv(t, 4)
	for range 10 {
		e.add(t, "a", proxy.StateUnhealthy, time.Minute)
	}
	r := e.tick(t)
	if r.Removed != 4 {
		t.Fatalf("removed %d in one tick, want the bound 4", r.Removed)
	}
	for range 2 {
		e.tick(t)
	}
	counts, err := e.pool.Counts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if counts[proxy.StateUnhealthy] != 0 {
		t.Fatalf("%d unhealthy left after three ticks", counts[proxy.StateUnhealthy])
	}
}

func TestRunTicksOnSignal(t *testing.T) {
	e := newEnv(t, 0)
	e.l.o.Every = time.Hour
	changed := make(chan struct{}, 10)
	e.l.o.OnChange = func() { changed <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	id := e.add(t, "a", proxy.StateUnhealthy, time.Minute)
	e.l.Signal()
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("no tick after a signal")
	}
	if _, err := e.pool.Get(context.Background(), id); err == nil {
		t.Fatal("unhealthy proxy not removed")
	}
	ps, _ := e.pool.List(context.Background(), activitypool.Filter{})
	if len(ps) != 0 {
		t.Fatalf("%d proxies left", len(ps))
	}
}
