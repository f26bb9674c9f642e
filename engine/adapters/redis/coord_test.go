package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/testenv"
)

func TestCoordinator(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()
	coord := func(t *testing.T) *redisstore.Coordinator {
		return newPool(t, rdb, redisstore.Options{}).Coordinator()
	}

	t.Run("LeaderLease", func(t *testing.T) {
		c := coord(t)
		l1, err := c.AcquireLeader(ctx, "a", "ctl-1", 300*time.Millisecond)
		if err != nil || l1.Epoch != 1 || l1.Generation != c.Generation() || !l1.Valid(time.Now()) {
			t.Fatalf("acquire %+v, %v", l1, err)
		}
		if _, err := c.AcquireLeader(ctx, "a", "ctl-2", time.Second); !errors.Is(err, redisstore.ErrLeaseHeld) {
			t.Fatalf("second candidate: %v, want ErrLeaseHeld", err)
		}
		if _, err := c.AcquireLeader(ctx, "b", "ctl-2", time.Second); err != nil {
			t.Fatalf("other upstream: %v", err)
		}
		l1, err = c.RenewLeader(ctx, l1, 100*time.Millisecond)
		if err != nil || l1.Epoch != 1 {
			t.Fatalf("renew %+v, %v", l1, err)
		}
		must(t, c.CheckLeader(ctx, l1))
		// The leader stops renewing; once the lease expired a new term
		// begins with a higher epoch and the old lease is fenced off.
		var l2 redisstore.Lease
		eventually(t, 10*time.Second, "lease expiry", func() bool {
			l2, err = c.AcquireLeader(ctx, "a", "ctl-2", time.Second)
			return err == nil
		})
		if l2.Epoch != 2 {
			t.Fatalf("new term epoch %d, want 2", l2.Epoch)
		}
		for name, err := range map[string]error{
			"renew":   func() error { _, err := c.RenewLeader(ctx, l1, time.Second); return err }(),
			"check":   c.CheckLeader(ctx, l1),
			"release": c.ReleaseLeader(ctx, l1),
			"permit": func() error {
				_, err := c.AcquirePermit(ctx, l1, redisstore.PermitRequest{TTL: time.Second})
				return err
			}(),
		} {
			if !errors.Is(err, redisstore.ErrLeaseLost) {
				t.Errorf("%s with the old epoch: %v, want ErrLeaseLost", name, err)
			}
		}
		must(t, c.ReleaseLeader(ctx, l2))
		l3, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Second)
		if err != nil || l3.Epoch != 3 {
			t.Fatalf("acquire after release %+v, %v", l3, err)
		}
		// A lease past its local deadline is not used, whatever Redis says.
		stale := l3
		stale.ValidUntil = time.Now().Add(-time.Millisecond)
		if err := c.CheckLeader(ctx, stale); !errors.Is(err, redisstore.ErrLeaseLost) {
			t.Errorf("check past the local deadline: %v", err)
		}
	})

	t.Run("ConcurrentCandidatesOneLeader", func(t *testing.T) {
		c := coord(t)
		const n = 32
		var (
			wg    sync.WaitGroup
			mu    sync.Mutex
			won   int
			start = make(chan struct{})
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := c.AcquireLeader(ctx, "a", fmt.Sprintf("ctl-%d", i), time.Minute)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					won++
				case !errors.Is(err, redisstore.ErrLeaseHeld):
					t.Errorf("candidate %d: %v", i, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if won != 1 {
			t.Fatalf("%d leaders, want 1", won)
		}
	})

	t.Run("Permits", func(t *testing.T) {
		c := coord(t)
		l, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Minute)
		must(t, err)
		req := redisstore.PermitRequest{RequestInterval: 0, MaxInFlight: 2, MaxTotal: 100, Expected: 30, TTL: time.Minute}
		p1, err := c.AcquirePermit(ctx, l, req)
		must(t, err)
		p2, err := c.AcquirePermit(ctx, l, req)
		must(t, err)
		if _, err := c.AcquirePermit(ctx, l, req); !errors.Is(err, redisstore.ErrInFlightFull) {
			t.Fatalf("third permit with maxInFlight 2: %v", err)
		}
		if ok, err := c.SettlePermit(ctx, p1, 10, true); err != nil || !ok {
			t.Fatalf("settle %v, %v", ok, err)
		}
		if ok, err := c.SettlePermit(ctx, p1, 10, true); err != nil || ok {
			t.Fatalf("second settle %v, %v; want a no-op", ok, err)
		}
		led, err := c.Ledger(ctx, "a")
		if err != nil || led.Total != 10 || led.Pending != 30 || led.InFlight != 1 {
			t.Fatalf("ledger %+v, %v", led, err)
		}
		// 10 settled + 30 pending + 30 + 30 > 100: the fourth call would
		// pass maxTotal.
		p3, err := c.AcquirePermit(ctx, l, req)
		must(t, err)
		if _, err := c.AcquirePermit(ctx, l, redisstore.PermitRequest{MaxTotal: 100, Expected: 31, TTL: time.Minute}); !errors.Is(err, redisstore.ErrBudgetExhausted) {
			t.Fatalf("over budget: %v", err)
		}
		// A result lost or unparseable books the expected amount.
		if ok, err := c.SettlePermit(ctx, p2, 0, false); err != nil || !ok {
			t.Fatalf("settle unknown %v, %v", ok, err)
		}
		// Leadership changes; the old leader's permit still settles once.
		must(t, c.ReleaseLeader(ctx, l))
		l2, err := c.AcquireLeader(ctx, "a", "ctl-2", time.Minute)
		must(t, err)
		if ok, err := c.SettlePermit(ctx, p3, 45, true); err != nil || !ok {
			t.Fatalf("settle the old term's permit %v, %v", ok, err)
		}
		led, _ = c.Ledger(ctx, "a")
		if led.Total != 10+30+45 || led.Pending != 0 || led.InFlight != 0 {
			t.Fatalf("ledger %+v, want total 85, nothing pending", led)
		}
		// More returned than expected: booked as is; the ledger now stops
		// later calls.
		if _, err := c.AcquirePermit(ctx, l2, req); !errors.Is(err, redisstore.ErrBudgetExhausted) {
			t.Fatalf("85 + 30 > 100: %v", err)
		}
	})

	t.Run("RequestInterval", func(t *testing.T) {
		c := coord(t)
		l, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Minute)
		must(t, err)
		req := redisstore.PermitRequest{RequestInterval: time.Hour, Expected: 1, TTL: time.Minute}
		if _, err := c.AcquirePermit(ctx, l, req); err != nil {
			t.Fatal(err)
		}
		_, err = c.AcquirePermit(ctx, l, req)
		var we *redisstore.WaitError
		if !errors.As(err, &we) || we.RetryAfter <= 0 || we.RetryAfter > time.Hour {
			t.Fatalf("second call within the interval: %v, want *WaitError", err)
		}
		// The interval is per upstream, not per leader: a new leader waits too.
		must(t, c.ReleaseLeader(ctx, l))
		l2, err := c.AcquireLeader(ctx, "a", "ctl-2", time.Minute)
		must(t, err)
		if _, err := c.AcquirePermit(ctx, l2, req); !errors.As(err, &we) {
			t.Fatalf("new leader within the interval: %v", err)
		}
	})

	t.Run("ExpiredPermitBookedAtExpected", func(t *testing.T) {
		c := coord(t)
		l, err := c.AcquireLeader(ctx, "a", "ctl-1", time.Minute)
		must(t, err)
		p, err := c.AcquirePermit(ctx, l, redisstore.PermitRequest{MaxInFlight: 1, Expected: 7, TTL: 50 * time.Millisecond})
		must(t, err)
		// The holder crashed: once the permit expired the slot frees and
		// its expected amount is booked.
		eventually(t, 10*time.Second, "permit expiry", func() bool {
			_, err := c.AcquirePermit(ctx, l, redisstore.PermitRequest{MaxInFlight: 1, Expected: 1, TTL: time.Minute})
			return err == nil
		})
		led, _ := c.Ledger(ctx, "a")
		if led.Total != 7 || led.Expired != 1 || led.Pending != 1 {
			t.Fatalf("ledger %+v, want 7 booked at expiry", led)
		}
		if ok, err := c.SettlePermit(ctx, p, 100, true); err != nil || ok {
			t.Fatalf("late settle of a booked permit %v, %v; want a no-op", ok, err)
		}
	})

	t.Run("RateLimit", func(t *testing.T) {
		c := coord(t)
		r := redisstore.Rate{Limit: 1, Period: time.Hour, Burst: 3}
		for i := range 3 {
			res, err := c.Allow(ctx, "client-1", r)
			if err != nil || !res.Allowed || res.Remaining != 2-i {
				t.Fatalf("request %d: %+v, %v", i, res, err)
			}
		}
		res, err := c.Allow(ctx, "client-1", r)
		if err != nil || res.Allowed || res.RetryAfter <= 0 {
			t.Fatalf("past the burst: %+v, %v", res, err)
		}
		if res, err := c.Allow(ctx, "client-2", r); err != nil || !res.Allowed {
			t.Fatalf("another client: %+v, %v", res, err)
		}
		if _, err := c.Allow(ctx, "x", redisstore.Rate{}); err == nil {
			t.Fatal("zero rate accepted")
		}
	})

	t.Run("RateLimitUnits", func(t *testing.T) {
		c := coord(t)
		r := redisstore.Rate{Limit: 5, Period: time.Hour, Burst: 5}
		for i, step := range []struct {
			n       int
			allowed bool
		}{{3, true}, {3, false}, {2, true}, {1, false}} {
			res, err := c.AllowN(ctx, "client-1", r, step.n)
			if err != nil || res.Allowed != step.allowed || (!res.Allowed && res.RetryAfter <= 0) {
				t.Fatalf("step %d: %d units: %+v, %v; want allowed=%v", i, step.n, res, err, step.allowed)
			}
		}
		if res, err := c.AllowN(ctx, "client-2", r, 6); err != nil || res.Allowed || res.RetryAfter != time.Hour {
			t.Fatalf("more than the burst: %+v, %v", res, err)
		}
		if _, err := c.AllowN(ctx, "client-2", r, 0); err == nil {
			t.Fatal("zero units accepted")
		}
	})

	t.Run("RateLimitRefund", func(t *testing.T) {
		c := coord(t)
		r := redisstore.Rate{Limit: 5, Period: time.Hour, Burst: 5}
		if res, err := c.AllowN(ctx, "client-1", r, 5); err != nil || !res.Allowed {
			t.Fatalf("the whole budget: %+v, %v", res, err)
		}
		must(t, c.RefundN(ctx, "client-1", r, 2))
		if res, err := c.AllowN(ctx, "client-1", r, 2); err != nil || !res.Allowed {
			t.Fatalf("2 refunded, 2 asked: %+v, %v", res, err)
		}
		// A refund larger than what was taken never raises the budget
		// above its burst.
		must(t, c.RefundN(ctx, "client-1", r, 100))
		for i, step := range []struct {
			n       int
			allowed bool
		}{{5, true}, {1, false}} {
			if res, err := c.AllowN(ctx, "client-1", r, step.n); err != nil || res.Allowed != step.allowed {
				t.Fatalf("after a large refund, step %d: %d units: %+v, %v; want allowed=%v", i, step.n, res, err, step.allowed)
			}
		}
		must(t, c.RefundN(ctx, "client-9", r, 3)) // nothing taken: nothing to give back
		if err := c.RefundN(ctx, "client-1", r, -1); err == nil {
			t.Fatal("negative refund accepted")
		}
	})

	t.Run("Heartbeats", func(t *testing.T) {
		c := coord(t)
		must(t, c.Heartbeat(ctx, "w1", time.Minute, map[string]string{"version": "1.2.3"}))
		must(t, c.Heartbeat(ctx, "w2", 50*time.Millisecond, nil))
		ws, err := c.Workers(ctx)
		if err != nil || len(ws) < 1 {
			t.Fatalf("workers %+v, %v", ws, err)
		}
		eventually(t, 10*time.Second, "dead worker forgotten", func() bool {
			ws, err = c.Workers(ctx)
			must(t, err)
			return len(ws) == 1
		})
		if ws[0].Worker != "w1" || ws[0].Info["version"] != "1.2.3" || ws[0].At.IsZero() || !ws[0].ExpiresAt.After(ws[0].At) {
			t.Fatalf("worker %+v", ws[0])
		}
		if err := c.Heartbeat(ctx, "w1", time.Minute, map[string]string{"_at": "x"}); err == nil {
			t.Fatal("reserved info key accepted")
		}
	})
}
