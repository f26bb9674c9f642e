package distribution

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	ctlrouting "github.com/proxypool/proxypool/engine/controller/routing"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
	"github.com/proxypool/proxypool/engine/domain/worker"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// flakyCursors is a cursor reader whose store can be made to fail.
type flakyCursors struct {
	down    atomic.Bool
	cursors map[string]routing.Cursor
}

func (f *flakyCursors) Cursor(_ context.Context, name string) (routing.Cursor, error) {
	if f.down.Load() {
		return routing.Cursor{}, errors.New("management store down")
	}
	return f.cursors[name], nil
}

func setup(t *testing.T, n int) (*embedded.Pool, []proxy.ID) {
	t.Helper()
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return t0 }})
	ids, err := ctltest.AddAvailable(context.Background(), pool, "a", n, 40000, t0, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return pool, ids
}

func has(s *worker.Snapshot, id proxy.ID) bool {
	for i := range s.Proxies {
		if s.Proxies[i].ID == id {
			return true
		}
	}
	return false
}

func TestPublishAssignsAndBuilds(t *testing.T) {
	pool, ids := setup(t, 4)
	ctx := context.Background()
	// One proxy not usable any more, one still CHECKING: neither is published.
	stale, err := ctltest.AddAvailable(ctx, pool, "a", 1, 41000, t0.Add(-2*time.Minute), time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	chk := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: 42000}
	if _, err := pool.Admit(ctx, "a", []proxy.Proxy{{ID: proxy.MakeID(chk), Key: chk, ExpiresAt: t0.Add(time.Hour)}}, 0); err != nil {
		t.Fatal(err)
	}
	cur := &flakyCursors{cursors: map[string]routing.Cursor{"seq": {Index: 1, Generation: 1}}}
	w := ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: cur, Now: func() time.Time { return t0 }})
	p.Register("local", w)
	rules := ctlrouting.Compile([]config.Routing{{Name: "seq", Strategy: "sequential", OnExhausted: "stop", Upstreams: []string{"a", "b"}}, {Name: "lc", Strategy: "leastConnections", Upstreams: []string{"a"}}})
	p.SetView(View{Rules: rules, Disabled: map[string]bool{"b": true}, MaxStaleAge: 30 * time.Second})

	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	s := w.Last()
	if s == nil || s.Version != 1 || len(s.Proxies) != 4 {
		t.Fatalf("snapshot = %+v", s)
	}
	for _, id := range ids {
		if !has(s, id) {
			t.Fatalf("usable proxy %s missing", id)
		}
		got, _ := pool.Get(ctx, id)
		if got.Owner != "local" {
			t.Fatalf("proxy %s owner %q, want local", id, got.Owner)
		}
	}
	if has(s, stale[0]) || has(s, proxy.MakeID(chk)) {
		t.Fatal("an unusable or unchecked proxy was published")
	}
	if s.Proxies[0].Password != "pw" {
		t.Fatal("the gateway needs the proxy credentials")
	}
	if !s.ValidUntil.Equal(t0.Add(30*time.Second)) || s.Cursors["seq"] != 1 || !s.Disabled["b"] || len(s.Routings) != 2 {
		t.Fatalf("snapshot view = valid %s cursors %v disabled %v", s.ValidUntil, s.Cursors, s.Disabled)
	}
	if _, ok := s.Cursors["lc"]; ok {
		t.Fatal("a non-sequential routing has a cursor")
	}
	if p.Version() != 1 || p.Last() != s {
		t.Fatal("Version/Last not updated")
	}

	// Management store down: the last known cursor is kept.
	cur.down.Store(true)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if s2 := w.Last(); s2.Version != 2 || s2.Cursors["seq"] != 1 {
		t.Fatalf("snapshot during store outage = v%d cursors %v", s2.Version, s2.Cursors)
	}
}

func TestExcludeKeepsProxiesOut(t *testing.T) {
	pool, ids := setup(t, 3)
	ctx := context.Background()
	w := ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 }})
	p.Register("local", w)
	// Excluded before it was ever owned: neither assigned nor published.
	p.Exclude(ids[:1])
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if has(w.Last(), ids[0]) || !has(w.Last(), ids[1]) {
		t.Fatal("exclusion not honoured")
	}
	if got, _ := pool.Get(ctx, ids[0]); got.Owner != "" {
		t.Fatal("an excluded proxy was assigned")
	}
	// Excluded while owned: withdrawn from the snapshot, ownership kept.
	p.Exclude(ids[1:2])
	p.Exclude(ids[1:2]) // nested
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if has(w.Last(), ids[1]) {
		t.Fatal("an excluded owned proxy was published")
	}
	p.Include(ids[1:2])
	_ = p.Publish(ctx)
	if has(w.Last(), ids[1]) {
		t.Fatal("nested exclusion released too early")
	}
	p.Include(ids[:2])
	_ = p.Publish(ctx)
	if !has(w.Last(), ids[0]) || !has(w.Last(), ids[1]) {
		t.Fatal("included proxies did not come back")
	}
}

func TestAssignmentBalancesWorkers(t *testing.T) {
	pool, _ := setup(t, 10)
	ctx := context.Background()
	w1, w2 := ctltest.NewWorker(), ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 }})
	p.Register("w1", w1)
	p.Register("w2", w2)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if a, b := len(w1.Last().Proxies), len(w2.Last().Proxies); a != 5 || b != 5 {
		t.Fatalf("split %d/%d, want 5/5", a, b)
	}
	for i := range w1.Last().Proxies {
		if has(w2.Last(), w1.Last().Proxies[i].ID) {
			t.Fatal("a proxy is owned by two workers")
		}
	}
	if w1.Last().Version != w2.Last().Version {
		t.Fatal("one publish round has one version")
	}
}

type failingApplier struct{}

func (failingApplier) Apply(context.Context, *worker.Snapshot) error {
	return errors.New("worker gone")
}

func TestVersionFenceOnlyAdvancesWhenAllApplied(t *testing.T) {
	pool, _ := setup(t, 2)
	ctx := context.Background()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 }})
	p.Register("ok", ctltest.NewWorker())
	p.Register("bad", failingApplier{})
	if err := p.Publish(ctx); err == nil {
		t.Fatal("a failed apply was not reported")
	}
	if p.Version() != 0 {
		t.Fatalf("fence advanced to %d although a worker missed the snapshot", p.Version())
	}
	ws := p.Workers()
	if ws[0].Version != 1 || ws[1].Err == "" {
		t.Fatalf("worker states = %+v", ws)
	}
}

func TestNoWorkerLeavesProxiesUnowned(t *testing.T) {
	pool, ids := setup(t, 2)
	ctx := context.Background()
	var published atomic.Int32
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 },
		OnPublished: func(string, *worker.Snapshot) { published.Add(1) }})
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	ps, _ := pool.List(ctx, activitypool.Filter{})
	for _, x := range ps {
		if x.Owner != "" {
			t.Fatal("assigned with no worker")
		}
	}
	if len(p.Last().Proxies) != len(ids) || published.Load() != 1 {
		t.Fatal("built snapshot not recorded")
	}
}

func TestRunPublishesOnTrigger(t *testing.T) {
	pool, _ := setup(t, 1)
	w := ctltest.NewWorker()
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Every: time.Hour})
	p.Register("local", w)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	applied := func() {
		t.Helper()
		select {
		case <-w.Applied():
		case <-time.After(5 * time.Second):
			t.Fatal("no snapshot applied")
		}
	}
	applied()
	p.Trigger()
	applied()
	if v := w.Last().Version; v != 2 {
		t.Fatalf("version %d after a trigger, want 2", v)
	}
}

func TestRoutingExclusionsPerWorker(t *testing.T) {
	pool, ids := setup(t, 4)
	ctx := context.Background()
	w1, w2 := ctltest.NewWorker(), ctltest.NewWorker()
	ex := map[string]map[proxy.ID]bool{
		"shop":    {ids[0]: true, ids[1]: true},
		"removed": {ids[2]: true}, // a routing no longer configured
	}
	p := New(Options{Store: pool, Cursors: &flakyCursors{}, Now: func() time.Time { return t0 },
		Exclusions: func() map[string]map[proxy.ID]bool { return ex }})
	p.SetView(View{Rules: ctlrouting.Compile([]config.Routing{
		{Name: "shop", Upstreams: []string{"a"}, Strategy: "leastConnections", OnUnavailable: "reject"},
		{Name: "news", Upstreams: []string{"a"}, Strategy: "leastConnections", OnUnavailable: "reject"},
	})})
	p.Register("w1", w1)
	p.Register("w2", w2)
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[proxy.ID]int{}
	for _, w := range []*ctltest.Worker{w1, w2} {
		s := w.Last()
		if _, ok := s.RoutingExclusions["removed"]; ok || len(s.RoutingExclusions["news"]) != 0 {
			t.Fatalf("exclusions = %v", s.RoutingExclusions)
		}
		for _, id := range s.RoutingExclusions["shop"] {
			if !has(s, id) {
				t.Fatalf("worker told to exclude %s it does not own", id)
			}
			got[id]++
		}
	}
	if len(got) != 2 || got[ids[0]] != 1 || got[ids[1]] != 1 {
		t.Fatalf("shop exclusions over both workers = %v, want %s and %s once each", got, ids[0], ids[1])
	}
	// Excluded proxies stay in the snapshot for every other routing.
	if !has(w1.Last(), ids[0]) && !has(w2.Last(), ids[0]) {
		t.Fatal("a proxy excluded from one routing left the snapshot")
	}
	ex = nil
	if err := p.Publish(ctx); err != nil {
		t.Fatal(err)
	}
	if w1.Last().RoutingExclusions != nil || w2.Last().RoutingExclusions != nil {
		t.Fatal("cleared exclusions still published")
	}
}

// clockWorker is a worker whose Apply takes `took` on the publisher's
// clock.
type clockWorker struct {
	now     *atomic.Int64 // unix nanoseconds
	took    time.Duration
	applied chan uint64
}

func (w *clockWorker) Apply(_ context.Context, s *worker.Snapshot) error {
	w.now.Add(int64(w.took))
	w.applied <- s.Version
	return nil
}

// Triggered publishes rest three times as long as the last round took, at
// most Every; Publish itself never waits. The test's clock stands in for
// the monotonic clock the pacing reads.
func TestRunPacesTriggeredPublishes(t *testing.T) {
	for _, tc := range []struct {
		name        string
		took, every time.Duration
		want        time.Duration
	}{
		{"three times the round", 100 * time.Millisecond, time.Hour, 300 * time.Millisecond},
		{"at most Every", 2 * time.Second, 4 * time.Second, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pool, _ := setup(t, 3)
			var now atomic.Int64
			now.Store(t0.UnixNano())
			clock := func() time.Time { return time.Unix(0, now.Load()).UTC() }
			w := &clockWorker{now: &now, took: tc.took, applied: make(chan uint64, 16)}
			p := New(Options{Store: pool, Now: clock, Every: tc.every})
			p.Register("local", w)
			p.clock = clock
			rests := make(chan time.Duration, 16)
			p.rest = func(_ context.Context, d time.Duration) {
				rests <- d
				now.Add(int64(d))
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { _ = p.Run(ctx); close(done) }()
			defer func() { cancel(); <-done }()

			next := func() uint64 {
				t.Helper()
				select {
				case v := <-w.applied:
					return v
				case <-time.After(10 * time.Second):
					t.Fatal("no publish")
					return 0
				}
			}
			if v := next(); v != 1 { // the first round runs at once
				t.Fatalf("first version %d", v)
			}
			for want := uint64(2); want <= 3; want++ {
				p.Trigger()
				if v := next(); v != want {
					t.Fatalf("version %d, want %d", v, want)
				}
				select {
				case d := <-rests:
					if d != tc.want {
						t.Errorf("rested %v before publish %d, want %v", d, want, tc.want)
					}
				default:
					t.Errorf("publish %d did not rest", want)
				}
			}
			// Extraction's direct Publish does not wait for the pacing.
			if err := p.Publish(context.Background()); err != nil {
				t.Fatal(err)
			}
			if v := next(); v != 4 {
				t.Fatalf("direct publish version %d", v)
			}
			select {
			case d := <-rests:
				t.Errorf("direct Publish rested %v", d)
			default:
			}
		})
	}
}
