package embedded_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/proxypool/proxypool/engine/adapters/embedded"
	"github.com/proxypool/proxypool/engine/adapters/storetest"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/management"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/engine/domain/routing"
)

func TestPoolContract(t *testing.T) {
	storetest.RunPoolContract(t, func(t *testing.T) activitypool.Pool {
		return embedded.NewPool(embedded.PoolOptions{})
	})
}

func openManagement(t *testing.T, dir string) management.Store {
	t.Helper()
	m, err := embedded.OpenManagement(dir, embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

func TestManagementContract(t *testing.T) {
	storetest.RunManagementContract(t, func(t *testing.T) management.Store {
		return openManagement(t, t.TempDir())
	})
}

func TestManagementPersistence(t *testing.T) {
	storetest.RunManagementPersistence(t, openManagement)
}

// clock is a settable store clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newClock() *clock { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

func testProxy(name string, now time.Time, ttl time.Duration) proxy.Proxy {
	return proxy.Proxy{
		Key:            proxy.Key{Scheme: proxy.SchemeHTTP, Host: name + ".example", Port: 3128},
		ExpiresAt:      now.Add(ttl),
		UsableUntil:    now.Add(ttl - time.Minute),
		MaxConcurrency: 2,
	}
}

// available admits ps and moves them to AVAILABLE.
func available(t *testing.T, p *embedded.Pool, up string, now time.Time, ps ...proxy.Proxy) []proxy.ID {
	t.Helper()
	ctx := context.Background()
	res, err := p.Admit(ctx, up, ps, 0)
	if err != nil || len(res.Added) != len(ps) {
		t.Fatalf("admit: %+v, %v", res, err)
	}
	for _, id := range res.Added {
		if err := p.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, now); err != nil {
			t.Fatal(err)
		}
		if err := p.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: now, Success: true}); err != nil {
			t.Fatal(err)
		}
	}
	return res.Added
}

func TestPoolMaxEntries(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	p := embedded.NewPool(embedded.PoolOptions{Now: clk.Now, MaxEntries: 3})
	var batch []proxy.Proxy
	for i := range 5 {
		batch = append(batch, testProxy(fmt.Sprintf("m%d", i), clk.Now(), time.Hour))
	}
	res, err := p.Admit(ctx, "a", batch, 0)
	if !errors.Is(err, embedded.ErrPoolFull) || len(res.Added) != 3 {
		t.Fatalf("admit beyond MaxEntries: %+v, %v", res, err)
	}
	// Ended entries still occupy memory until swept.
	id := res.Added[0]
	for _, to := range []proxy.State{proxy.StateChecking, proxy.StateUnhealthy, proxy.StateRemoved} {
		from := map[proxy.State]proxy.State{proxy.StateChecking: proxy.StateFetched, proxy.StateUnhealthy: proxy.StateChecking, proxy.StateRemoved: proxy.StateUnhealthy}[to]
		if err := p.Transition(ctx, id, from, to, clk.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Admit(ctx, "a", batch[3:4], 0); !errors.Is(err, embedded.ErrPoolFull) {
		t.Fatalf("admit with a REMOVED entry unswept: %v", err)
	}
	if r := p.Sweep(clk.Now()); r.Removed != 1 {
		t.Fatalf("sweep %+v", r)
	}
	if res, err := p.Admit(ctx, "a", batch[3:4], 0); err != nil || len(res.Added) != 1 {
		t.Fatalf("admit after sweep: %+v, %v", res, err)
	}
}

func TestPoolSweep(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	p := embedded.NewPool(embedded.PoolOptions{Now: clk.Now, HardExpiryGrace: time.Minute})
	now := clk.Now()
	short := available(t, p, "a", now, testProxy("s1", now, 10*time.Minute), testProxy("s2", now, 10*time.Minute), testProxy("s3", now, 10*time.Minute))
	long := available(t, p, "a", now, testProxy("l1", now, time.Hour))
	extracted := func(id proxy.ID) {
		t.Helper()
		if err := p.Transition(ctx, id, proxy.StateAvailable, proxy.StateExtracted, now); err != nil {
			t.Fatal(err)
		}
	}
	extracted(short[0])
	extracted(long[0])
	if err := p.Transition(ctx, short[1], proxy.StateAvailable, proxy.StateDraining, now); err != nil {
		t.Fatal(err)
	}
	// An idempotency record for an extraction of nothing.
	if _, err := p.Extract(ctx, extraction.Request{Count: 1, Fulfillment: extraction.Partial, Filters: extraction.Filters{Region: "none"}, IdempotencyKey: "k", IdempotencyTTL: 5 * time.Minute, Now: now}); err != nil {
		t.Fatal(err)
	}

	if r := p.Sweep(now); r != (embedded.SweepResult{}) {
		t.Fatalf("sweep before any expiry %+v", r)
	}
	// Past the short proxies' expiry, inside the grace.
	clk.Advance(10*time.Minute + time.Second)
	r := p.Sweep(clk.Now())
	if r.Ended != 1 || r.Abandoned != 0 || r.Idempotency != 1 || r.Removed != 0 {
		t.Fatalf("sweep at expiry %+v, want 1 ended, 1 idempotency record", r)
	}
	if _, err := p.Get(ctx, short[0]); !errors.Is(err, activitypool.ErrNotFound) {
		t.Errorf("extracted past expiry still present: %v", err)
	}
	if _, err := p.Get(ctx, long[0]); err != nil {
		t.Errorf("extracted before expiry was swept: %v", err)
	}
	// Past the grace the live ones the controller never ended go too.
	clk.Advance(time.Minute)
	if r := p.Sweep(clk.Now()); r.Abandoned != 2 {
		t.Fatalf("sweep past grace %+v, want 2 abandoned", r)
	}
	st := p.Stats()
	if st.Entries != 1 || st.Upstreams != 1 || st.IdempotencyRecords != 0 {
		t.Errorf("stats %+v", st)
	}
	clk.Advance(time.Hour)
	p.Sweep(clk.Now())
	if st := p.Stats(); st.Entries != 0 || st.Upstreams != 0 {
		t.Errorf("stats after everything expired %+v", st)
	}
}

func TestPoolIdempotencyBound(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	p := embedded.NewPool(embedded.PoolOptions{Now: clk.Now, MaxIdempotencyRecords: 2})
	now := clk.Now()
	var ps []proxy.Proxy
	for i := range 10 {
		ps = append(ps, testProxy(fmt.Sprintf("i%d", i), now, time.Hour))
	}
	available(t, p, "a", now, ps...)
	req := func(key string, ttl time.Duration) extraction.Request {
		return extraction.Request{Client: "c", Count: 1, Fulfillment: extraction.Partial, IdempotencyKey: key, IdempotencyTTL: ttl, Now: now}
	}
	first := map[string]proxy.ID{}
	for _, k := range []struct {
		key string
		ttl time.Duration
	}{{"long", time.Hour}, {"soon", time.Minute}, {"mid", 10 * time.Minute}} {
		res, err := p.Extract(ctx, req(k.key, k.ttl))
		if err != nil || res.Returned != 1 {
			t.Fatalf("extract %s: %+v, %v", k.key, res, err)
		}
		first[k.key] = res.Proxies[0].ID
	}
	if st := p.Stats(); st.IdempotencyRecords != 2 || st.IdempotencyEvicted != 1 {
		t.Fatalf("stats %+v, want 2 records and 1 eviction", st)
	}
	for key, ttl := range map[string]time.Duration{"long": time.Hour, "mid": 10 * time.Minute} {
		res, err := p.Extract(ctx, req(key, ttl))
		if err != nil || !res.Replayed || res.Proxies[0].ID != first[key] {
			t.Errorf("replay %s: %+v, %v", key, res, err)
		}
	}
	// The record expiring soonest was the one dropped.
	if res, err := p.Extract(ctx, req("soon", time.Minute)); err != nil || res.Replayed {
		t.Errorf("evicted key replayed: %+v, %v", res, err)
	}
}

func TestPoolIdempotencyUsesStoreClock(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	p := embedded.NewPool(embedded.PoolOptions{Now: clk.Now})
	now := clk.Now()
	available(t, p, "a", now, testProxy("c1", now, time.Hour), testProxy("c2", now, time.Hour))
	// No TTL: DefaultIdempotencyTTL.
	req := extraction.Request{Client: "c", Count: 1, Fulfillment: extraction.Partial, IdempotencyKey: "k"}
	first, err := p.Extract(ctx, req)
	if err != nil || first.Returned != 1 {
		t.Fatal(first, err)
	}
	clk.Advance(embedded.DefaultIdempotencyTTL - time.Second)
	if res, err := p.Extract(ctx, req); err != nil || !res.Replayed {
		t.Fatalf("inside TTL: %+v, %v", res, err)
	}
	clk.Advance(time.Second)
	res, err := p.Extract(ctx, req)
	if err != nil || res.Replayed || res.Returned != 1 || res.Proxies[0].ID == first.Proxies[0].ID {
		t.Fatalf("after TTL: %+v, %v", res, err)
	}
}

func TestPoolCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	p := embedded.NewPool(embedded.PoolOptions{})
	if _, err := p.Admit(ctx, "a", []proxy.Proxy{testProxy("x", time.Now(), time.Hour)}, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("admit: %v", err)
	}
	if _, err := p.Extract(ctx, extraction.Request{Count: 1, Fulfillment: extraction.Partial}); !errors.Is(err, context.Canceled) {
		t.Errorf("extract: %v", err)
	}
	if st := p.Stats(); st.Entries != 0 {
		t.Errorf("canceled admit landed: %+v", st)
	}
}

func TestManagementLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := embedded.OpenManagement(dir, embedded.ManagementOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = embedded.OpenManagement(dir, embedded.ManagementOptions{LockTimeout: 50 * time.Millisecond})
	if !errors.Is(err, embedded.ErrLocked) {
		t.Fatalf("second open: %v, want ErrLocked", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := embedded.OpenManagement(dir, embedded.ManagementOptions{LockTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatalf("open after the holder closed: %v", err)
	}
	if err := second.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestManagementRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	m, err := embedded.OpenManagement(dir, embedded.ManagementOptions{AuditRetention: 10, RevisionRetention: 3})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	for i := 1; i <= 25; i++ {
		if err := m.AppendAudit(ctx, management.AuditEntry{Action: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		if err := m.RecordRevision(ctx, management.Revision{Fingerprint: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	audit, err := m.ListAudit(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(audit) != 10 || audit[0].ID != 25 || audit[9].ID != 16 || audit[0].Action != "25" {
		t.Errorf("retained audit: %d entries, newest %+v, oldest %+v", len(audit), audit[0], audit[len(audit)-1])
	}
	revs, err := m.ListRevisions(ctx, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 3 || revs[0].Fingerprint != "25" || revs[2].Fingerprint != "23" {
		t.Errorf("retained revisions %+v", revs)
	}
}

func TestManagementInvalidNames(t *testing.T) {
	ctx := context.Background()
	m := openManagement(t, t.TempDir())
	if err := m.SetUpstreamEnabled(ctx, "", true); err == nil {
		t.Error("empty upstream name accepted")
	}
	if _, err := m.CompareAndSetCursor(ctx, "", routing.Cursor{}, routing.Cursor{Generation: 1}); err == nil {
		t.Error("empty routing name accepted")
	}
}
