package health

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/checker"
	"github.com/proxypool/proxypool/engine/controller/internal/ctltest"
	"github.com/proxypool/proxypool/engine/domain/proxy"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// queue records submissions and reports a configurable backlog.
type queue struct {
	mu    sync.Mutex
	tasks []checker.Task
	stats checker.Stats
}

func (q *queue) Submit(t checker.Task) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.tasks = append(q.tasks, t)
	return nil
}

func (q *queue) PendingKey(k checker.Key) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tasks {
		if t.Key() == k {
			return true
		}
	}
	return false
}

func (q *queue) Stats() checker.Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	st := q.stats
	if st.QueueSize == 0 {
		st.QueueSize = 4096
	}
	return st
}

func (q *queue) setStats(st checker.Stats) {
	q.mu.Lock()
	q.stats = st
	q.mu.Unlock()
}

// takeNormal drains the queue and counts the ordinary rechecks in it.
func (q *queue) takeNormal() int {
	n := 0
	for _, tk := range q.take() {
		if tk.Priority == checker.PriorityNormal {
			n++
		}
	}
	return n
}

func (q *queue) take() []checker.Task {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.tasks
	q.tasks = nil
	return out
}

type changes struct {
	mu  sync.Mutex
	got []string
}

func (c *changes) record(up string, from, to proxy.State) {
	c.mu.Lock()
	c.got = append(c.got, up+":"+from.String()+">"+to.String())
	c.mu.Unlock()
}

func newService(t *testing.T, now *time.Time) (*Service, *embedded.Pool, *queue, *changes) {
	t.Helper()
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return *now }})
	q, ch := &queue{}, &changes{}
	s := New(Options{
		Store: pool, Scheduler: q, OnChange: ch.record, Now: func() time.Time { return *now },
		Policy: func(up string) (Policy, bool) {
			if up == "off" {
				return Policy{}, false
			}
			return Policy{FailureThreshold: 2, Interval: 30 * time.Second, Timeout: time.Second}, true
		},
	})
	return s, pool, q, ch
}

func admit(t *testing.T, pool *embedded.Pool, up string, port int) proxy.ID {
	t.Helper()
	key := proxy.Key{Scheme: proxy.SchemeHTTP, Host: "127.0.0.1", Port: uint16(port)}
	res, err := pool.Admit(context.Background(), up, []proxy.Proxy{{ID: proxy.MakeID(key), Key: key, ExpiresAt: t0.Add(time.Hour), UsableUntil: t0.Add(50 * time.Minute)}}, 0)
	if err != nil || len(res.Added) != 1 {
		t.Fatalf("admit: %v %+v", err, res)
	}
	return res.Added[0]
}

func TestScheduleAndObserve(t *testing.T) {
	now := t0
	s, pool, q, ch := newService(t, &now)
	ctx := context.Background()
	id := admit(t, pool, "a", 1)
	s.Schedule(ctx, []proxy.ID{id})
	tasks := q.take()
	if len(tasks) != 1 || tasks[0].Priority != checker.PriorityHigh || tasks[0].Timeout != time.Second {
		t.Fatalf("tasks = %+v", tasks)
	}
	if p, _ := pool.Get(ctx, id); p.State != proxy.StateChecking {
		t.Fatalf("state = %s, want CHECKING", p.State)
	}
	// First failure: retry, still CHECKING; then success: AVAILABLE.
	if err := s.Observe(ctx, checker.Observation{ID: id, At: now}); err != nil {
		t.Fatal(err)
	}
	if p, _ := pool.Get(ctx, id); p.State != proxy.StateChecking || p.ConsecutiveFails != 1 {
		t.Fatalf("after a failure: %s fails %d", p.State, p.ConsecutiveFails)
	}
	now = now.Add(time.Second)
	if err := s.Observe(ctx, checker.Observation{ID: id, Success: true, At: now, Latency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	p, _ := pool.Get(ctx, id)
	if p.State != proxy.StateAvailable || !p.LastSuccessAt.Equal(now) || p.ConsecutiveFails != 0 {
		t.Fatalf("after success: %+v", p)
	}
	if len(ch.got) != 1 || ch.got[0] != "a:CHECKING>AVAILABLE" {
		t.Fatalf("changes = %v", ch.got)
	}
	// A stale observation for a proxy that moved on changes nothing.
	if err := pool.Transition(ctx, id, proxy.StateAvailable, proxy.StateDraining, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Observe(ctx, checker.Observation{ID: id, At: now}); err != nil {
		t.Fatal(err)
	}
	if p, _ := pool.Get(ctx, id); p.State != proxy.StateDraining {
		t.Fatalf("a late observation moved a DRAINING proxy to %s", p.State)
	}
	// Unknown proxies are ignored.
	if err := s.Observe(ctx, checker.Observation{ID: "gone"}); err != nil {
		t.Fatal(err)
	}
}

func TestSweepPlansDueChecks(t *testing.T) {
	now := t0
	s, pool, q, _ := newService(t, &now)
	ctx := context.Background()
	fetched := admit(t, pool, "a", 1)
	off := admit(t, pool, "off", 2)
	avail, err := ctltest.AddAvailable(ctx, pool, "a", 2, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got := map[proxy.ID]checker.Priority{}
	for _, tk := range q.take() {
		got[tk.Proxy.ID] = tk.Priority
	}
	if got[fetched] != checker.PriorityHigh {
		t.Fatalf("a FETCHED proxy was not scheduled high: %v", got)
	}
	if _, ok := got[off]; ok {
		t.Fatal("a disabled upstream's proxy was scheduled")
	}
	for _, id := range avail {
		if _, ok := got[id]; ok {
			t.Fatal("a just-checked AVAILABLE proxy was rechecked")
		}
	}
	// Past interval + 10%, every AVAILABLE proxy is due, at normal priority.
	now = t0.Add(34 * time.Second)
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	got = map[proxy.ID]checker.Priority{}
	for _, tk := range q.take() {
		got[tk.Proxy.ID] = tk.Priority
	}
	for _, id := range avail {
		if got[id] != checker.PriorityNormal {
			t.Fatalf("AVAILABLE %s not rechecked at normal priority: %v", id, got)
		}
	}
	// SUSPECT proxies are retried sooner than the interval, at high priority.
	if err := s.Observe(ctx, checker.Observation{ID: avail[0], At: now}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(retryDelay(30 * time.Second))
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tk := range q.take() {
		if tk.Proxy.ID == avail[0] {
			found = tk.Priority == checker.PriorityHigh
		}
	}
	if !found {
		t.Fatal("SUSPECT proxy not retried at high priority")
	}
}

func TestTargetChecksExcludeOnlyTheirRouting(t *testing.T) {
	now := t0
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return now }})
	q := &queue{}
	var (
		mu      sync.Mutex
		changed []string
	)
	specs := []TargetSpec{
		{Routing: "shop", Upstreams: []string{"a"}, URL: "http://shop.example/", ExpectStatus: 200, Interval: time.Minute},
		{Routing: "news", Upstreams: []string{"a", "b"}, URL: "http://news.example/", ExpectStatus: 200, Interval: time.Minute},
	}
	s := New(Options{
		Store: pool, Scheduler: q, Now: func() time.Time { return now },
		Policy: func(string) (Policy, bool) {
			return Policy{FailureThreshold: 2, Interval: time.Hour, Timeout: time.Second}, true
		},
		Targets: func() []TargetSpec { return specs },
		OnTargetChange: func(r string) {
			mu.Lock()
			changed = append(changed, r)
			mu.Unlock()
		},
	})
	ctx := context.Background()
	ids, err := ctltest.AddAvailable(ctx, pool, "a", 2, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	bIDs, err := ctltest.AddAvailable(ctx, pool, "b", 1, 200, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	// First TARGET checks are high priority, one per (proxy, routing) the
	// proxy's upstream belongs to: a's proxies for shop and news, b's for news.
	got := map[string]checker.Priority{}
	for _, tk := range q.take() {
		if tk.Level == checker.LevelTarget {
			got[string(tk.Proxy.ID)+"/"+tk.Routing] = tk.Priority
			if tk.URL == "" || tk.ExpectStatus != 200 {
				t.Fatalf("target task without its URL or status: %+v", tk)
			}
		}
	}
	want := map[string]checker.Priority{
		string(ids[0]) + "/shop": checker.PriorityHigh, string(ids[0]) + "/news": checker.PriorityHigh,
		string(ids[1]) + "/shop": checker.PriorityHigh, string(ids[1]) + "/news": checker.PriorityHigh,
		string(bIDs[0]) + "/news": checker.PriorityHigh,
	}
	if len(got) != len(want) {
		t.Fatalf("target tasks = %v, want %v", got, want)
	}
	for k, p := range want {
		if got[k] != p {
			t.Fatalf("target tasks = %v, want %v", got, want)
		}
	}
	fail := checker.Observation{ID: ids[0], Level: checker.LevelTarget, Routing: "shop", Phase: checker.PhaseStatus, Status: 403, At: now}
	for range 2 {
		if err := s.Observe(ctx, fail); err != nil {
			t.Fatal(err)
		}
	}
	ex := s.Exclusions()
	if !ex["shop"][ids[0]] || len(ex["shop"]) != 1 || len(ex["news"]) != 0 {
		t.Fatalf("exclusions = %v, want only %s excluded from shop", ex, ids[0])
	}
	if p, _ := pool.Get(ctx, ids[0]); p.State != proxy.StateAvailable {
		t.Fatalf("a TARGET failure changed the proxy's state to %s", p.State)
	}
	if r := s.ExcludedFrom(ids[0]); len(r) != 1 || r[0] != "shop" {
		t.Fatalf("ExcludedFrom = %v", r)
	}
	mu.Lock()
	if len(changed) != 1 || changed[0] != "shop" {
		t.Fatalf("target changes = %v", changed)
	}
	mu.Unlock()
	// Rechecks come at the routing's interval, at normal priority.
	now = t0.Add(2 * time.Minute)
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	normal := 0
	for _, tk := range q.take() {
		if tk.Level == checker.LevelTarget && tk.Priority == checker.PriorityNormal && tk.Proxy.ID == ids[0] && tk.Routing == "shop" {
			normal++
		}
	}
	if normal != 1 {
		t.Fatal("an excluded proxy was not rechecked for its routing at normal priority")
	}
	// A pass readmits it.
	if err := s.Observe(ctx, checker.Observation{ID: ids[0], Level: checker.LevelTarget, Routing: "shop", Success: true, At: now}); err != nil {
		t.Fatal(err)
	}
	if len(s.Exclusions()["shop"]) != 0 {
		t.Fatal("a passing TARGET check did not readmit the proxy")
	}
	// A routing whose check is removed loses its standings; a proxy that
	// left the pool is forgotten.
	if err := s.Observe(ctx, fail); err != nil {
		t.Fatal(err)
	}
	if err := s.Observe(ctx, fail); err != nil {
		t.Fatal(err)
	}
	specs = specs[1:]
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if len(s.Exclusions()) != 0 {
		t.Fatalf("exclusions of a removed check survive: %v", s.Exclusions())
	}
	mu.Lock()
	if changed[len(changed)-1] != "shop" {
		t.Fatalf("removing shop's check did not announce a change: %v", changed)
	}
	mu.Unlock()
	s.mu.Lock()
	tracked, routings := s.tracked, len(s.targets)
	s.mu.Unlock()
	if tracked != 0 || routings != 1 {
		t.Fatalf("tracked standings = %d over %d routings, want 0 over 1 (news, never observed)", tracked, routings)
	}
}

func TestEgressResultRecordedAndPolicyApplied(t *testing.T) {
	now := t0
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return now }})
	q := &queue{}
	s := New(Options{
		Store: pool, Scheduler: q, Now: func() time.Time { return now },
		Policy: func(string) (Policy, bool) {
			return Policy{FailureThreshold: 1, Interval: time.Minute, EgressURL: "http://echo.example/", ProbeTarget: "probe.example:443", Anonymity: Elite}, true
		},
	})
	ctx := context.Background()
	good, bad := admit(t, pool, "a", 1), admit(t, pool, "a", 2)
	s.Schedule(ctx, []proxy.ID{good, bad})
	for _, tk := range q.take() {
		if tk.Level != checker.LevelEgress || tk.URL != "http://echo.example/" || tk.ProbeTarget != "probe.example:443" {
			t.Fatalf("proxy-level task with an echo service configured = %+v", tk)
		}
	}
	if err := s.Observe(ctx, checker.Observation{ID: good, Level: checker.LevelEgress, Success: true, ExitIP: "203.0.113.5", At: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.Observe(ctx, checker.Observation{ID: bad, Level: checker.LevelEgress, Success: true, ExitIP: "203.0.113.6", ProxyHeaders: []string{"Via"}, At: now}); err != nil {
		t.Fatal(err)
	}
	if p, _ := pool.Get(ctx, good); p.State != proxy.StateAvailable {
		t.Fatalf("elite proxy state %s", p.State)
	}
	if p, _ := pool.Get(ctx, bad); p.State != proxy.StateUnhealthy {
		t.Fatalf("a proxy announcing itself under an elite policy is %s, want UNHEALTHY", p.State)
	}
	if e, ok := s.Egress(good); !ok || e.ExitIP != "203.0.113.5" || e.Anonymity != Elite {
		t.Fatalf("egress info = %+v %v", e, ok)
	}
	// Forgotten once the proxy is no longer live.
	if err := pool.Transition(ctx, good, proxy.StateAvailable, proxy.StateDraining, now); err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Egress(good); ok {
		t.Fatal("egress info of a draining proxy kept")
	}
}

func TestBacklogSlowsOrdinaryRechecksOnly(t *testing.T) {
	now := t0
	s, pool, q, _ := newService(t, &now) // interval 30s
	ctx := context.Background()
	avail, err := ctltest.AddAvailable(ctx, pool, "a", 20, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	fresh := admit(t, pool, "a", 1)
	suspect := avail[0]
	if err := s.Observe(ctx, checker.Observation{ID: suspect, At: t0}); err != nil {
		t.Fatal(err)
	}
	// The checker is backlogged: 3 new proxies wait, the queue (size 16)
	// holds 5 tasks.
	q.setStats(checker.Stats{QueuedHigh: 3, QueuedNormal: 2, QueueSize: 16})
	now = t0.Add(40 * time.Second) // past interval + 10%, before 2 x interval
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	var high, normal int
	for _, tk := range q.take() {
		switch {
		case tk.Priority == checker.PriorityHigh && (tk.Proxy.ID == fresh || tk.Proxy.ID == suspect):
			high++
		case tk.Priority == checker.PriorityNormal:
			normal++
		}
	}
	if high != 2 || normal != 0 {
		t.Fatalf("backlogged sweep: %d new/SUSPECT, %d ordinary rechecks; want 2 and 0", high, normal)
	}
	// Past twice the interval they are due even under backlog, but only
	// as many as keep the queue at most half full (16/2 - 5 = 3).
	now = t0.Add(70 * time.Second)
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	normal = q.takeNormal()
	if normal != 3 {
		t.Fatalf("%d ordinary rechecks queued under backlog, want 3", normal)
	}
	if s.Deferred() == 0 {
		t.Fatal("deferred rechecks not counted")
	}
	// Without a backlog every due recheck goes.
	q.setStats(checker.Stats{QueueSize: 16})
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	normal = q.takeNormal()
	if normal != 19 {
		t.Fatalf("%d rechecks without backlog, want 19", normal)
	}
}

// gate is a check executor whose checks block until released.
type gate struct {
	started chan checker.Task
	release chan struct{}
}

func (g *gate) Check(ctx context.Context, t checker.Task) checker.Observation {
	g.started <- t
	select {
	case <-g.release:
	case <-ctx.Done():
	}
	return checker.Observation{ID: t.Proxy.ID, Level: t.Level, Success: true}
}

// Seed 000 §18 "checker backlog": with the real scheduler, the queue never
// grows past its bound, new and SUSPECT proxies are checked first, and
// ordinary rechecks are shed or postponed, counted.
func TestCheckerBacklogFault(t *testing.T) {
	now := t0
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return now }})
	g := &gate{started: make(chan checker.Task, 64), release: make(chan struct{})}
	sched := checker.NewScheduler(checker.SchedulerOptions{Executor: g, MaxInFlight: 1, QueueSize: 8})
	s := New(Options{
		Store: pool, Scheduler: sched, Now: func() time.Time { return now },
		Policy: func(string) (Policy, bool) { return Policy{FailureThreshold: 3, Interval: 30 * time.Second}, true },
	})
	ctx := context.Background()
	avail, err := ctltest.AddAvailable(ctx, pool, "a", 20, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Observe(ctx, checker.Observation{ID: avail[0], At: t0}); err != nil { // now SUSPECT
		t.Fatal(err)
	}
	urgent := map[proxy.ID]bool{avail[0]: true}
	for port := 1; port <= 3; port++ {
		urgent[admit(t, pool, "a", port)] = true
	}
	now = t0.Add(70 * time.Second) // every AVAILABLE proxy is due, even at twice the interval
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	st := sched.Stats()
	if st.QueuedHigh != 4 || st.QueuedNormal != 4 || st.Dropped != 15 {
		t.Fatalf("after a sweep of 4 urgent + 19 due rechecks into a queue of 8: %+v", st)
	}
	// Backlogged now: a second sweep adds nothing and sheds nothing more;
	// the due rechecks are postponed.
	if err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if st2 := sched.Stats(); st2.QueuedHigh+st2.QueuedNormal != 8 || st2.Dropped != 15 || s.Deferred() == 0 {
		t.Fatalf("second sweep under backlog: %+v, deferred %d", st2, s.Deferred())
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = sched.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	for i := range 8 {
		var tk checker.Task
		select {
		case tk = <-g.started:
		case <-time.After(5 * time.Second):
			t.Fatal("checks stopped")
		}
		if i < 4 && !urgent[tk.Proxy.ID] {
			t.Fatalf("check %d was an ordinary recheck of %s while new/SUSPECT ones waited", i, tk.Proxy.ID)
		}
		g.release <- struct{}{}
	}
}

func TestRegistriesAreBounded(t *testing.T) {
	now := t0
	pool := embedded.NewPool(embedded.PoolOptions{Now: func() time.Time { return now }})
	s := New(Options{
		Store: pool, Scheduler: &queue{}, Now: func() time.Time { return now }, MaxTracked: 2,
		Policy: func(string) (Policy, bool) { return Policy{FailureThreshold: 1, Interval: time.Minute}, true },
		Targets: func() []TargetSpec {
			return []TargetSpec{{Routing: "shop", Upstreams: []string{"a"}, URL: "http://x/", Interval: time.Minute}}
		},
	})
	ctx := context.Background()
	ids, err := ctltest.AddAvailable(ctx, pool, "a", 4, 100, t0, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Sweep(ctx); err != nil { // installs the spec
		t.Fatal(err)
	}
	for _, id := range ids {
		_ = s.Observe(ctx, checker.Observation{ID: id, Level: checker.LevelTarget, Routing: "shop", At: now})
		_ = s.Observe(ctx, checker.Observation{ID: id, Level: checker.LevelEgress, Success: true, ExitIP: "203.0.113.1", At: now})
	}
	s.mu.Lock()
	tracked, egress := s.tracked, len(s.egress)
	s.mu.Unlock()
	if tracked != 2 || egress != 2 || len(s.Exclusions()["shop"]) != 2 {
		t.Fatalf("tracked %d target standings and %d egress results with a bound of 2", tracked, egress)
	}
}
