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

// queue records submissions.
type queue struct {
	mu    sync.Mutex
	tasks []checker.Task
}

func (q *queue) Submit(t checker.Task) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.tasks = append(q.tasks, t)
	return nil
}

func (q *queue) Pending(id proxy.ID) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tasks {
		if t.Proxy.ID == id {
			return true
		}
	}
	return false
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
