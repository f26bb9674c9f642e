package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/config"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// TestRedisRestartLosesState kills Redis (no persistence) in the middle of
// concurrent extractions: a new generation is detected exactly once, the
// leader lease of the old generation is void and a leader is elected
// again, and no proxy is ever extracted twice across the restart.
func TestRedisRestartLosesState(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	var changes atomic.Int32
	p, err := redisstore.OpenWith(ctx, config.Redis{URL: srv.URL()}, redisstore.Options{
		Namespace: namespace(t), OpTimeout: time.Second,
		OnGeneration: func(old, new string) { changes.Add(1) },
	})
	must(t, err)
	defer p.Close()
	c := p.Coordinator()
	gen1 := p.Generation()
	lease, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Minute)
	must(t, err)
	permit, err := c.AcquirePermit(ctx, lease, redisstore.PermitRequest{Expected: 10, TTL: time.Minute})
	must(t, err)

	now := time.Now()
	available(t, p, "a", batch("before", 400, now)...)

	const extractors = 16
	var (
		mu        sync.Mutex
		seen      = map[proxy.ID]int{}
		stop      = make(chan struct{})
		extracted atomic.Int64
		failures  atomic.Int64
		wg        sync.WaitGroup
	)
	for g := range extractors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req := extraction.Request{Client: fmt.Sprintf("c%d", g), Count: 3, Fulfillment: extraction.Partial}
				if i%2 == 0 {
					req.IdempotencyKey = fmt.Sprintf("g%d-%d", g, i)
				}
				res, err := p.Extract(ctx, req)
				if err != nil {
					if !errors.Is(err, redisstore.ErrUnavailable) && !errors.Is(err, redisstore.ErrGenerationChanged) {
						t.Errorf("extract: %v, want ErrUnavailable or ErrGenerationChanged", err)
					}
					failures.Add(1)
					continue
				}
				mu.Lock()
				for _, x := range res.Proxies {
					seen[x.ID]++
				}
				mu.Unlock()
				extracted.Add(int64(res.Returned))
			}
		}()
	}
	eventually(t, 30*time.Second, "extractions before the restart", func() bool { return extracted.Load() >= 100 })
	srv.Restart()

	// The pool notices the lost state on its next operations.
	eventually(t, 30*time.Second, "new generation detected", func() bool { return changes.Load() > 0 })
	gen2 := p.Generation()
	if gen2 == gen1 || gen2 == "" {
		t.Fatalf("generation %q after the restart, was %q", gen2, gen1)
	}
	// The vendor refills the pool of the new generation.
	var fresh []proxy.ID
	eventually(t, 30*time.Second, "admission into the new generation", func() bool {
		res, err := p.Admit(ctx, "a", batch("after", 300, time.Now()), 0)
		if err != nil {
			return false
		}
		fresh = res.Added
		return true
	})
	for _, id := range fresh {
		must(t, p.Transition(ctx, id, proxy.StateFetched, proxy.StateChecking, time.Now()))
		must(t, p.RecordHealth(ctx, activitypool.Health{ID: id, From: proxy.StateChecking, To: proxy.StateAvailable, CheckedAt: time.Now(), Success: true}))
	}
	eventually(t, 30*time.Second, "the new generation drained", func() bool {
		c, err := p.Counts(ctx)
		return err == nil && c[proxy.StateAvailable] == 0
	})
	close(stop)
	wg.Wait()

	for id, n := range seen {
		if n > 1 {
			t.Errorf("proxy %s extracted %d times", id, n)
		}
	}
	if changes.Load() != 1 || p.GenerationChanges() != 1 {
		t.Errorf("generation change reported %d times (%d counted), want once", changes.Load(), p.GenerationChanges())
	}
	// The old lease, and its permit, are void; leadership is won again.
	if _, err := c.RenewLeader(ctx, lease, time.Minute); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Errorf("renew the old generation's lease: %v, want ErrLeaseLost", err)
	}
	if _, err := c.AcquirePermit(ctx, lease, redisstore.PermitRequest{Expected: 1, TTL: time.Minute}); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Errorf("permit under the old lease: %v, want ErrLeaseLost", err)
	}
	if _, err := c.SettlePermit(ctx, permit, 10, true); !errors.Is(err, redisstore.ErrGenerationChanged) {
		t.Errorf("settle an old generation's permit: %v, want ErrGenerationChanged", err)
	}
	l2, err := c.AcquireLeader(ctx, "a", "ctl-2", time.Minute)
	if err != nil || l2.Generation != gen2 || l2.Epoch != 1 {
		t.Fatalf("re-election %+v, %v", l2, err)
	}
	if _, err := c.AcquirePermit(ctx, l2, redisstore.PermitRequest{Expected: 1, TTL: time.Minute}); err != nil {
		t.Fatalf("permit under the new lease: %v", err)
	}
	t.Logf("extracted %d proxies, %d failed calls around the restart", len(seen), failures.Load())
}

// TestRedisUnreachable: with the server gone every operation returns a
// clear ErrUnavailable promptly (bounded by OpTimeout), never hangs, and
// works again once the server is back.
func TestRedisUnreachable(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	p, err := redisstore.OpenWith(ctx, config.Redis{URL: srv.URL()}, redisstore.Options{Namespace: namespace(t), OpTimeout: 500 * time.Millisecond})
	must(t, err)
	defer p.Close()
	c := p.Coordinator()
	ids := available(t, p, "a", batch("u", 3, time.Now())...)
	lease, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Minute)
	must(t, err)
	srv.Stop()

	calls := []struct {
		name string
		f    func() error
	}{
		{"Admit", func() error { _, err := p.Admit(ctx, "a", batch("x", 1, time.Now()), 0); return err }},
		{"Get", func() error { _, err := p.Get(ctx, ids[0]); return err }},
		{"List", func() error { _, err := p.List(ctx, activitypool.Filter{}); return err }},
		{"Transition", func() error {
			return p.Transition(ctx, ids[0], proxy.StateAvailable, proxy.StateDraining, time.Now())
		}},
		{"Extract", func() error {
			_, err := p.Extract(ctx, extraction.Request{Count: 1, Fulfillment: extraction.Partial})
			return err
		}},
		{"Inventory", func() error { _, err := p.Inventory(ctx, "a", time.Now()); return err }},
		{"Counts", func() error { _, err := p.Counts(ctx); return err }},
		{"SetOwner", func() error { return p.SetOwner(ctx, ids[:1], "w1") }},
		{"RenewLeader", func() error { _, err := c.RenewLeader(ctx, lease, time.Minute); return err }},
		{"AcquirePermit", func() error {
			_, err := c.AcquirePermit(ctx, lease, redisstore.PermitRequest{Expected: 1, TTL: time.Minute})
			return err
		}},
		{"Allow", func() error {
			_, err := c.Allow(ctx, "k", redisstore.Rate{Limit: 1, Period: time.Second, Burst: 1})
			return err
		}},
		{"Heartbeat", func() error { return c.Heartbeat(ctx, "w1", time.Minute, nil) }},
	}
	for _, call := range calls {
		t.Run(call.name, func(t *testing.T) {
			err := within(t, 10*time.Second, call.name, call.f)
			if !errors.Is(err, redisstore.ErrUnavailable) {
				t.Fatalf("%s with Redis down: %v, want ErrUnavailable", call.name, err)
			}
		})
	}
	t.Run("Open", func(t *testing.T) {
		err := within(t, 10*time.Second, "Open", func() error {
			_, err := redisstore.OpenWith(ctx, config.Redis{URL: srv.URL()}, redisstore.Options{OpTimeout: 500 * time.Millisecond})
			return err
		})
		if !errors.Is(err, redisstore.ErrUnavailable) {
			t.Fatalf("open with Redis down: %v", err)
		}
	})
	srv.Start()
	eventually(t, 30*time.Second, "recovery", func() bool {
		_, err := p.Counts(ctx)
		return err == nil || errors.Is(err, redisstore.ErrGenerationChanged)
	})
}
