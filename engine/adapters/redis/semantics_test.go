package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	redisstore "github.com/proxypool/proxypool/engine/adapters/redis"
	"github.com/proxypool/proxypool/engine/domain/activitypool"
	"github.com/proxypool/proxypool/engine/domain/extraction"
	"github.com/proxypool/proxypool/engine/domain/proxy"
	"github.com/proxypool/proxypool/testenv"
)

// TestPoolSemantics covers what the shared contract leaves to each store:
// tie order, server-side key expiry and the housekeeping behind it, and the
// ownership lease.
func TestPoolSemantics(t *testing.T) {
	srv := testenv.StartRedis(t)
	rdb := client(t, srv)
	ctx := context.Background()

	t.Run("TiesNewestAdmissionFirst", func(t *testing.T) {
		p := newPool(t, rdb, redisstore.Options{})
		now := time.Now().UTC().Truncate(time.Millisecond)
		var ids []proxy.ID
		for _, name := range []string{"old", "mid", "new"} {
			// Same UsableUntil: a batch sharing one expiry.
			ids = append(ids, available(t, p, "a", px(name, now, time.Hour))...)
		}
		res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 3, Fulfillment: extraction.Partial, Now: now})
		if err != nil {
			t.Fatal(err)
		}
		want := []proxy.ID{ids[2], ids[1], ids[0]}
		var got []proxy.ID
		for _, x := range res.Proxies {
			got = append(got, x.ID)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("order %v, want newest admission first %v", got, want)
		}
	})

	t.Run("KeyTTLFollowsHardExpiry", func(t *testing.T) {
		p := newPool(t, rdb, redisstore.Options{HardExpiryGrace: time.Minute})
		now := time.Now()
		x := px("ttl", now, 10*time.Minute) // ExpiresAt now+11m
		id := available(t, p, "a", x)[0]
		ttl, err := rdb.PTTL(ctx, redisstore.KeyPrefix(p)+"p:"+string(id)).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < 11*time.Minute || ttl > 12*time.Minute+time.Second {
			t.Fatalf("key ttl %s, want ExpiresAt + 1m grace ≈ 12m", ttl)
		}
		// A zero time means the server's clock.
		if inv, err := p.Inventory(ctx, "a", time.Time{}); err != nil || inv.Available != 1 || inv.AvailableSlots != 2 {
			t.Fatalf("inventory at the server's time %+v, %v", inv, err)
		}
	})

	t.Run("ServerExpiryAndSweep", func(t *testing.T) {
		// A 50ms grace on proxies already past hard expiry: Redis deletes
		// their keys on its own, and the indexes must follow.
		p := newPool(t, rdb, redisstore.Options{HardExpiryGrace: 50 * time.Millisecond})
		now := time.Now()
		gone := px("gone", now, -2*time.Minute) // ExpiresAt now-1m, UsableUntil now-2m
		gone.MaxConcurrency = 7
		keep := available(t, p, "a", px("keep", now, time.Hour))
		goneID := available(t, p, "a", gone)[0]
		removed := available(t, p, "a", px("removed", now, time.Hour))[0]
		must(t, p.Transition(ctx, removed, proxy.StateAvailable, proxy.StateDraining, now))
		must(t, p.Transition(ctx, removed, proxy.StateDraining, proxy.StateExpired, now))
		eventually(t, 10*time.Second, "server-side expiry of the expired proxy", func() bool {
			_, err := p.Get(ctx, goneID)
			return errors.Is(err, activitypool.ErrNotFound)
		})
		c, err := p.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c[proxy.StateAvailable] != 1 || c[proxy.StateExpired] != 1 {
			t.Fatalf("counts after server expiry %v, want the expired key gone", c)
		}
		inv, err := p.Inventory(ctx, "a", time.Now())
		if err != nil || inv.Managed != 1 || inv.Available != 1 || inv.AvailableSlots != 2 {
			t.Fatalf("inventory after server expiry %+v, %v", inv, err)
		}
		res, err := p.Sweep(ctx)
		if err != nil || res.Ghosts < 2 {
			t.Fatalf("sweep %+v, %v; want the expired key's index members dropped", res, err)
		}
		// REMOVED entries are deleted by the sweep, as the embedded one does.
		must(t, p.Transition(ctx, removed, proxy.StateExpired, proxy.StateRemoved, now))
		if res, err := p.Sweep(ctx); err != nil || res.Removed != 1 {
			t.Fatalf("sweep %+v, %v; want the REMOVED entry deleted", res, err)
		}
		if _, err := p.Get(ctx, removed); !errors.Is(err, activitypool.ErrNotFound) {
			t.Fatalf("REMOVED entry after sweep: %v", err)
		}
		// The slot sum was corrected: only keep's 2 slots remain, read from
		// the sum side (more usable than unusable members).
		if inv, err := p.Inventory(ctx, "a", time.Now()); err != nil || inv.AvailableSlots != 2 {
			t.Fatalf("inventory after sweep %+v, %v", inv, err)
		}
		if ps, err := p.List(ctx, activitypool.Filter{}); err != nil || len(ps) != 1 || ps[0].ID != keep[0] {
			t.Fatalf("list after sweep %v, %v", ps, err)
		}
	})

	t.Run("ExaminedBound", func(t *testing.T) {
		p := newPool(t, rdb, redisstore.Options{MaxExamined: 10})
		now := time.Now()
		// MinRemainingTTL has no index of its own (a region filter would
		// walk the region's): the 20 walked first expire too soon.
		ahead := batch("us", 20, now)
		for i := range ahead {
			ahead[i].UsableUntil, ahead[i].ExpiresAt = now.Add(40*time.Minute), now.Add(41*time.Minute)
		}
		available(t, p, "a", ahead...)
		target := px("target", now, 30*time.Minute) // walked last
		target.ExpiresAt = now.Add(3 * time.Hour)
		available(t, p, "a", target)
		res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 1, Fulfillment: extraction.Partial, Filters: extraction.Filters{MinRemainingTTL: time.Hour}, Now: now})
		if err != nil || res.Returned != 0 {
			t.Fatalf("extraction past MaxExamined %+v, %v; want it to stop", res, err)
		}
	})

	t.Run("OwnerLease", func(t *testing.T) { testOwnerLease(t, newPool(t, rdb, redisstore.Options{})) })
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func testOwnerLease(t *testing.T, p *redisstore.Pool) {
	ctx := context.Background()
	now := time.Now()
	ids := available(t, p, "a", batch("ol", 4, now)...)
	l1, err := p.GrantOwnerLease(ctx, "w1", 200*time.Millisecond)
	if err != nil || l1.Epoch < 1 || l1.Generation != p.Generation() || !l1.Valid(time.Now()) {
		t.Fatalf("grant %+v, %v", l1, err)
	}
	if _, err := p.GrantOwnerLease(ctx, "w1", time.Second); !errors.Is(err, redisstore.ErrLeaseHeld) {
		t.Fatalf("second grant while live: %v, want ErrLeaseHeld", err)
	}
	must(t, p.AssignOwner(ctx, l1, ids[:2]))
	got, _ := p.Get(ctx, ids[0])
	if got.Owner != "w1" {
		t.Fatalf("owner %q", got.Owner)
	}
	// Owned proxies are gateway capacity: never extracted.
	res, err := p.Extract(ctx, extraction.Request{Client: "c", Count: 4, Fulfillment: extraction.Partial})
	if err != nil || res.Returned != 2 {
		t.Fatalf("extract with two owned %+v, %v", res, err)
	}
	// While the lease lives, the worker's proxies stay its own.
	if _, _, err := p.ReclaimOwner(ctx, "w1", 10); !errors.Is(err, redisstore.ErrLeaseHeld) {
		t.Fatalf("reclaim under a live lease: %v, want ErrLeaseHeld", err)
	}
	l1, err = p.RenewOwnerLease(ctx, l1, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	// The worker is lost: once its lease has run out, and not before, its
	// proxies are reclaimed.
	var cleared []proxy.ID
	eventually(t, 10*time.Second, "lease expiry", func() bool {
		var more bool
		cleared, more, err = p.ReclaimOwner(ctx, "w1", 10)
		if err != nil && !errors.Is(err, redisstore.ErrLeaseHeld) {
			t.Fatal(err)
		}
		return err == nil && !more
	})
	if !sameIDs(cleared, ids[:2]) {
		t.Fatalf("reclaimed %v, want %v", cleared, ids[:2])
	}
	if _, err := p.RenewOwnerLease(ctx, l1, time.Second); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Fatalf("renew an expired lease: %v, want ErrLeaseLost", err)
	}
	if err := p.AssignOwner(ctx, l1, ids[2:3]); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Fatalf("assign under an expired lease: %v, want ErrLeaseLost", err)
	}
	if got, _ := p.Get(ctx, ids[0]); got.Owner != "" {
		t.Fatalf("reclaimed proxy still owned by %q", got.Owner)
	}
	// A new lease takes a new epoch; the reclaimed proxies go to w2.
	l2, err := p.GrantOwnerLease(ctx, "w2", time.Second)
	if err != nil || l2.Epoch <= l1.Epoch {
		t.Fatalf("grant after expiry %+v, %v; want an epoch above %d", l2, err, l1.Epoch)
	}
	must(t, p.AssignOwner(ctx, l2, ids[:2]))
	must(t, p.ReleaseOwnerLease(ctx, l2))
	if err := p.ReleaseOwnerLease(ctx, l2); !errors.Is(err, redisstore.ErrLeaseLost) {
		t.Fatalf("second release: %v", err)
	}
	if cleared, _, err := p.ReclaimOwner(ctx, "w2", 10); err != nil || len(cleared) != 2 {
		t.Fatalf("reclaim after release %v, %v", cleared, err)
	}
}

func sameIDs(a, b []proxy.ID) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
